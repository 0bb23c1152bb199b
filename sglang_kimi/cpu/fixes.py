"""Fixes for SGLang's CPU path, installed through SGLang's own registries and hooks (see plugin.py's table)."""

CPU_MLA_BACKENDS = ("torch_native",)


def _absorbed_mla(attn, forward_batch):
    """Always run MLA in the absorbed form (queries against the latent KV cache)."""
    from sglang.srt.models.deepseek_common.attention_backend_handler import _dispatch_mla_subtype

    return _dispatch_mla_subtype(attn, forward_batch)


def install_absorbed_mla_handler():
    """torch_native has no entry in the DeepSeek attention-method registry, so it falls back to the triton
    handler, which picks the non-absorbed MHA path for prefill without a cached prefix. But
    ``TorchNativeAttnBackend.forward_extend`` ignores the per-head k/v it is given and attends over the
    latent KV pool, so prefill is wrong (or crashes when the MLA dims differ). Absorbed MLA is correct."""
    from sglang.srt.models.deepseek_common.attention_backend_handler import AttentionBackendRegistry

    for backend in CPU_MLA_BACKENDS:
        if backend in AttentionBackendRegistry._handlers:
            return f"SGLang already has a {backend} handler"
        AttentionBackendRegistry.register(backend, _absorbed_mla)
    return None
