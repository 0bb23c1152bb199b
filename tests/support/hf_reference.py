"""transformers' reference of the embedded tiny Kimi-K2.6 (``sglang_kimi.models.tiny``), for tests:
``DeepseekV3ForCausalLM`` loaded with the tiny model's text weights, the model the SGLang parity tests (unit and
end-to-end) and the drafter tests compare with."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from sglang_kimi.assets import TINY_MODEL
from sglang_kimi.speculators.reference.deepseek_v3 import TEXT_PREFIX  # the checkpoint format's text prefix


def hf_text_config(path: str | Path = TINY_MODEL):
    """transformers' DeepseekV3Config for the text model (rope_scaling becomes rope_parameters in v5)."""
    from transformers import DeepseekV3Config

    t = dict(json.loads((Path(path) / "config.json").read_text())["text_config"])
    t.pop("model_type", None)
    t.pop("torch_dtype", None)
    return DeepseekV3Config(**t)


def load_hf_reference(path: str | Path = TINY_MODEL, dtype: torch.dtype = torch.float32):
    """(transformers ``DeepseekV3ForCausalLM``, ``PreTrainedTokenizerFast``) with the tiny model's text weights.

    Weights are read from the Kimi-format checkpoint (``language_model.`` prefix stripped) and the per-expert
    tensors are fused into transformers' 3-D ``experts.gate_up_proj`` [E, 2I, H] / ``experts.down_proj``
    [E, H, I]. Stored bf16 weights are upcast to ``dtype``; ``e_score_correction_bias`` stays fp32.
    Experts run through transformers' eager loop so fp32 results are exact and deterministic.
    """
    from safetensors.torch import load_file
    from transformers import DeepseekV3ForCausalLM, PreTrainedTokenizerFast

    path = Path(path)
    config = hf_text_config(path)
    config._experts_implementation = "eager"
    config._attn_implementation = "eager"
    with torch.device("meta"):
        model = DeepseekV3ForCausalLM(config)
    sd: dict[str, torch.Tensor] = {}
    experts: dict[str, dict[str, dict[int, torch.Tensor]]] = {}
    for name, t in load_file(path / "model.safetensors").items():
        if not name.startswith(TEXT_PREFIX):
            continue
        name = name[len(TEXT_PREFIX) :]
        t = t.float() if name.endswith("e_score_correction_bias") else t.to(dtype)
        if ".mlp.experts." in name:
            prefix, rest = name.split(".mlp.experts.")
            e, kind = rest.split(".")[:2]
            experts.setdefault(prefix, {}).setdefault(kind, {})[int(e)] = t
        else:
            sd[name] = t
    for prefix, kinds in experts.items():
        n = len(kinds["gate_proj"])
        sd[f"{prefix}.mlp.experts.gate_up_proj"] = torch.stack(
            [torch.cat([kinds["gate_proj"][e], kinds["up_proj"][e]], dim=0) for e in range(n)]
        )
        sd[f"{prefix}.mlp.experts.down_proj"] = torch.stack([kinds["down_proj"][e] for e in range(n)])
    missing, unexpected = model.load_state_dict(sd, strict=False, assign=True)
    if missing or unexpected:
        raise RuntimeError(f"tiny checkpoint does not match DeepseekV3ForCausalLM: {missing=} {unexpected=}")
    # non-persistent buffers (rope inv_freq) were created on meta: rebuild them on CPU
    rotary = type(model.model.rotary_emb)(config=config)
    model.model.rotary_emb = rotary
    model = model.to(dtype)
    for layer in model.model.layers:
        gate = getattr(layer.mlp, "gate", None)
        if gate is not None:
            gate.e_score_correction_bias = gate.e_score_correction_bias.float()
    model.eval()
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(path))
    return model, tokenizer
