"""A compact DeepSeek-V3 text model (Kimi-K2.6's architecture) in plain PyTorch: the one forward that scripts and
tests run the tiny Kimi target with.

The math is that of transformers' ``DeepseekV3ForCausalLM`` (the reference of the parity tests in
``tests/unit/test_tiny_model.py`` and ``tests/unit/test_dflash.py``), laid out for speed on a CPU: the routed
experts of a layer are three stacked tensors and each expert runs once over the tokens routed to it.

- MLA in its non-absorbed form: the latent row ``[normed latent | roped shared key]`` (what SGLang caches per token,
  :meth:`MLA.latent_rows`) expands through ``kv_b_proj`` into per-head K = ``[k_nope | k_rope]`` and V
  (:meth:`MLA.keys_values`); the queries take YaRN RoPE on their rope dims the same way.
- RoPE: DeepSeek YaRN on the ``qk_rope_head_dim`` dims, from :class:`.layers.Rope` (``deepseek=True``): interleaved
  pairs in, rotated pairs written out as ``[evens' | odds']`` as transformers' DeepseekV3 does (q and k get the
  same permutation, so q.k is that of the pairs). The cos/sin factor is SGLang's DeepSeek rule
  ``get_mscale(f, mscale) / get_mscale(f, mscale_all_dim)``, which is transformers' whenever both are set (the
  embedded config); the softmax scale is multiplied by ``get_mscale(f, mscale_all_dim) ** 2``.
- MoE: noaux_tc sigmoid routing (``e_score_correction_bias`` picks the experts, never weights them), top-k weights
  normalised and scaled by ``routed_scaling_factor``, plus the shared expert; dense MLP in the first
  ``first_k_dense_replace`` layers.

:meth:`CompactDeepseekV3.forward` runs ``model(input_ids)`` causally, or any rows under explicit positions and a
boolean mask (left padding, tree verification), optionally on top of a :class:`KVCache` it extends in place.
:meth:`CompactDeepseekV3.from_pretrained` reads Kimi-K2.6's checkpoint format (``language_model.`` weights, one
tensor per expert), :meth:`CompactDeepseekV3.checkpoint_state_dict` writes it. Only torch (and safetensors in the
loader) is imported: no SGLang, no transformers.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..configs import yarn_get_mscale
from .layers import GatedMLP, RMSNorm, Rope, masked_attention

TEXT_PREFIX = "language_model."  # Kimi-K2.6's checkpoints keep every text weight under this prefix
LORA_NORM_EPS = 1e-6  # q_a_layernorm / kv_a_layernorm: transformers' DeepseekV3RMSNorm default, not rms_norm_eps


def rope_of(config: dict) -> Rope:
    """DeepSeek YaRN (or plain RoPE without ``rope_scaling``) on the ``qk_rope_head_dim`` dims, interleaved pairs."""
    if not config.get("rope_interleave", True):
        raise ValueError("the compact DeepSeek-V3 implements rope_interleave=True (DeepSeek-V3's and Kimi's layout)")
    return Rope(
        config["qk_rope_head_dim"],
        float(config["rope_theta"]),
        config.get("rope_scaling"),
        neox=False,
        deepseek=True,
        max_position=config["max_position_embeddings"],
    )


class KVCache:
    """Keys and values of the tokens a :class:`CompactDeepseekV3` has run, per layer; every forward given the cache
    appends its rows.

    MLA is cached in its non-absorbed form, K [b, n, heads, qk_head_dim] (roped) and V [b, n, heads, v_head_dim],
    so that a step runs ``kv_b_proj`` on its own rows only. The buffers hold ``capacity`` tokens (preallocated on
    the first forward, no copies per step) and double when full; :meth:`crop` forgets every token after the first
    n (a prompt that diverges, rows computed under a tree mask).
    """

    def __init__(self, num_layers: int, capacity: int = 0) -> None:
        self.capacity = capacity
        self.keys: list[torch.Tensor | None] = [None] * num_layers
        self.values: list[torch.Tensor | None] = [None] * num_layers
        self.lengths = [0] * num_layers

    @property
    def length(self) -> int:
        """Tokens cached (after a forward: the same in every layer)."""
        return self.lengths[0]

    def crop(self, n: int) -> None:
        self.lengths = [min(length, n) for length in self.lengths]

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """k [b, s, h, dk], v [b, s, h, dv] after the layer's cached tokens -> all of its K [b, n, h, dk], V."""
        start = self.lengths[layer]
        end = start + k.shape[1]
        keys, values = self.keys[layer], self.values[layer]
        if keys is None or end > keys.shape[1]:
            size = max(end, self.capacity, 0 if keys is None else 2 * keys.shape[1])
            new_k, new_v = k.new_empty(k.shape[0], size, *k.shape[2:]), v.new_empty(v.shape[0], size, *v.shape[2:])
            if start:
                new_k[:, :start], new_v[:, :start] = keys[:, :start], values[:, :start]
            keys, values = self.keys[layer], self.values[layer] = new_k, new_v
        keys[:, start:end], values[:, start:end] = k, v
        self.lengths[layer] = end
        return keys[:, :end], values[:, :end]


class MLA(nn.Module):
    """Multi-head latent attention, non-absorbed form (per-head K and V expanded from the latent)."""

    def __init__(self, config: dict, rope: Rope, layer_idx: int) -> None:
        super().__init__()
        t = config
        hid, self.num_heads, self.layer_idx = t["hidden_size"], t["num_attention_heads"], layer_idx
        self.nope, self.rope_dim, self.vdim = t["qk_nope_head_dim"], t["qk_rope_head_dim"], t["v_head_dim"]
        self.kv_lora = t["kv_lora_rank"]
        self.rope = rope
        self.q_a_proj = nn.Linear(hid, t["q_lora_rank"], bias=False)
        self.q_a_layernorm = RMSNorm(t["q_lora_rank"], LORA_NORM_EPS, cast_before_scale=True)
        self.q_b_proj = nn.Linear(t["q_lora_rank"], self.num_heads * (self.nope + self.rope_dim), bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(hid, self.kv_lora + self.rope_dim, bias=False)
        self.kv_a_layernorm = RMSNorm(self.kv_lora, LORA_NORM_EPS, cast_before_scale=True)
        self.kv_b_proj = nn.Linear(self.kv_lora, self.num_heads * (self.nope + self.vdim), bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.vdim, hid, bias=False)
        self.scale = (self.nope + self.rope_dim) ** -0.5
        if rope.scaling is not None:  # YaRN: q.k is scaled by get_mscale(f, mscale_all_dim)^2 on top
            m = yarn_get_mscale(float(rope.scaling["factor"]), float(rope.scaling.get("mscale_all_dim", 0)))
            self.scale *= m * m

    def rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x [..., s, heads, rope] (interleaved pairs), cos/sin [..., s, rope / 2] -> rotated [evens' | odds']."""
        y = self.rope.apply(x, cos, sin)  # [..., s, heads, rope]: each pair rotated in place
        return torch.cat([y[..., 0::2], y[..., 1::2]], dim=-1)

    def queries(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x [b, s, hidden] -> q [b, s, heads, nope + rope]."""
        b, s, _ = x.shape
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x))).view(b, s, self.num_heads, -1)
        q_nope, q_rot = q.split([self.nope, self.rope_dim], dim=-1)  # [b, s, h, nope], [b, s, h, rope]
        return torch.cat([q_nope, self.rotate(q_rot, cos, sin)], dim=-1)

    def latent_rows(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x [b, s, hidden] -> the cache rows [b, s, kv_lora + rope]: normed latent | roped key (one for all heads)."""
        latent, k_rot = self.kv_a_proj_with_mqa(x).split([self.kv_lora, self.rope_dim], dim=-1)  # [b, s, *]
        return torch.cat([self.kv_a_layernorm(latent), self.rotate(k_rot[:, :, None], cos, sin)[:, :, 0]], dim=-1)

    def keys_values(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """rows [b, s, kv_lora + rope] -> K [b, s, heads, nope + rope], V [b, s, heads, v_head_dim]."""
        b, s, _ = rows.shape
        latent, k_rot = rows.split([self.kv_lora, self.rope_dim], dim=-1)
        k_nope, v = self.kv_b_proj(latent).view(b, s, self.num_heads, -1).split([self.nope, self.vdim], dim=-1)
        return torch.cat([k_nope, k_rot[:, :, None].expand(b, s, self.num_heads, self.rope_dim)], dim=-1), v

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor | None = None,
        cache: KVCache | None = None,
    ) -> torch.Tensor:
        """x [b, s, hidden], cos/sin [(b,) s, rope / 2]; mask bool [b, s, P + s] over the P cached keys then these
        (None: causal, nothing cached) -> [b, s, hidden]."""
        b, s, _ = x.shape
        q = self.queries(x, cos, sin)  # [b, s, h, dk]
        k, v = self.keys_values(self.latent_rows(x, cos, sin))  # [b, s, h, dk], [b, s, h, dv]
        if cache is not None:
            k, v = cache.append(self.layer_idx, k, v)  # [b, P + s, h, *]
        if mask is None:
            # v padded to the q/k head dim selects torch's fused CPU attention kernel (~2.5x faster than the math
            # path, which an explicit mask takes)
            v = F.pad(v, (0, q.shape[-1] - self.vdim))
            o = F.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True, scale=self.scale
            )  # [b, h, s, dk]
            o = o[..., : self.vdim].transpose(1, 2)
        else:
            o = masked_attention(q, k, v, mask, self.scale)  # [b, s, h, dv]
        return self.o_proj(o.reshape(b, s, self.num_heads * self.vdim))


class MoE(nn.Module):
    """DeepSeek-V3 MoE: noaux_tc sigmoid routing (bias picks experts, never weights them) + shared expert."""

    def __init__(self, config: dict) -> None:
        super().__init__()
        t = config
        hid, inter, e = t["hidden_size"], t["moe_intermediate_size"], t["n_routed_experts"]
        self.top_k, self.n_group, self.topk_group = t["num_experts_per_tok"], t["n_group"], t["topk_group"]
        self.norm_topk_prob, self.scaling = t["norm_topk_prob"], t["routed_scaling_factor"]
        self.gate_weight = nn.Parameter(torch.zeros(e, hid))  # checkpoint: mlp.gate.weight
        self.register_buffer("e_score_correction_bias", torch.zeros(e))  # checkpoint: mlp.gate.e_score_...
        self.w_gate = nn.Parameter(torch.zeros(e, inter, hid))  # experts.E.gate_proj.weight
        self.w_up = nn.Parameter(torch.zeros(e, inter, hid))  # experts.E.up_proj.weight
        self.w_down = nn.Parameter(torch.zeros(e, hid, inter))  # experts.E.down_proj.weight
        self.shared_experts = GatedMLP(hid, inter * t["n_shared_experts"])
        self.last_load: torch.Tensor | None = None  # tokens per expert in the last forward (for bias updates)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [n, hid] -> (topk_weights [n, k] fp32, topk_idx [n, k])."""
        scores = F.linear(x.float(), self.gate_weight.float()).sigmoid()  # [n, e]
        choice = scores + self.e_score_correction_bias
        n, e = choice.shape
        if self.n_group > 1:
            grouped = choice.view(n, self.n_group, e // self.n_group)
            group_scores = grouped.topk(2, dim=-1)[0].sum(-1)  # [n, groups]
            keep = torch.zeros_like(group_scores).scatter_(1, group_scores.topk(self.topk_group, dim=-1)[1], 1)
            choice = choice.masked_fill(~keep.bool().repeat_interleave(e // self.n_group, dim=1), float("-inf"))
        idx = choice.topk(self.top_k, dim=-1)[1]
        w = scores.gather(1, idx)
        if self.norm_topk_prob:
            w = w / (w.sum(-1, keepdim=True) + 1e-20)
        return w * self.scaling, idx

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])  # [n, hid]
        w, idx = self.route(x)
        out = torch.zeros_like(x)
        flat = idx.flatten()  # [n*k]: token t's j-th expert at t*k+j
        order = flat.argsort(stable=True)
        counts = torch.bincount(flat, minlength=self.w_gate.shape[0])
        self.last_load = counts.detach()
        tok = order // self.top_k
        wt = w.flatten()[order].to(x.dtype)
        start = 0
        for e, c in enumerate(counts.tolist()):
            if c == 0:
                continue
            t_e = tok[start : start + c]
            h = x[t_e]  # [c, hid]
            h = F.silu(F.linear(h, self.w_gate[e])) * F.linear(h, self.w_up[e])
            out.index_add_(0, t_e, F.linear(h, self.w_down[e]) * wt[start : start + c, None])
            start += c
        return (out + self.shared_experts(x)).view(shape)


class DecoderLayer(nn.Module):
    def __init__(self, config: dict, rope: Rope, i: int) -> None:
        super().__init__()
        t = config
        self.input_layernorm = RMSNorm(t["hidden_size"], t["rms_norm_eps"], cast_before_scale=True)
        self.self_attn = MLA(t, rope, i)
        self.post_attention_layernorm = RMSNorm(t["hidden_size"], t["rms_norm_eps"], cast_before_scale=True)
        is_moe = i >= t["first_k_dense_replace"] and i % t["moe_layer_freq"] == 0
        self.mlp = MoE(t) if is_moe else GatedMLP(t["hidden_size"], t["intermediate_size"])

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor | None = None,
        cache: KVCache | None = None,
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask, cache)
        return x + self.mlp(self.post_attention_layernorm(x))


class CompactDeepseekV3(nn.Module):
    """DeepSeek-V3 causal LM over a DeepSeek-V3 text config dict (``config.json``'s ``text_config`` for Kimi)."""

    def __init__(self, text_config: dict) -> None:
        super().__init__()
        t = dict(text_config)
        self.config = t
        self.rope = rope_of(t)
        self.embed_tokens = nn.Embedding(t["vocab_size"], t["hidden_size"])
        self.layers = nn.ModuleList(DecoderLayer(t, self.rope, i) for i in range(t["num_hidden_layers"]))
        self.norm = RMSNorm(t["hidden_size"], t["rms_norm_eps"], cast_before_scale=True)
        self.lm_head = nn.Linear(t["hidden_size"], t["vocab_size"], bias=False)
        self.inv_freq = self.rope.inv_freq()  # [rope / 2] float32 (a plain tensor: not moved by .to(dtype))
        self.rope_factor = self.rope.attention_factor()

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [...] -> cos, sin [..., rope / 2] in ``dtype``, YaRN's factor folded in. The angles are float32
        as in transformers and SGLang, float64 in a float64 model (exact comparisons between decode loops)."""
        angle_dtype = torch.float64 if dtype == torch.float64 else torch.float32
        freqs = positions.to(angle_dtype)[..., None] * self.inv_freq.to(positions.device, angle_dtype)
        return (freqs.cos() * self.rope_factor).to(dtype), (freqs.sin() * self.rope_factor).to(dtype)

    def new_cache(self, capacity: int = 0) -> KVCache:
        return KVCache(len(self.layers), capacity)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        cache: KVCache | None = None,
        output_hidden_states: bool = False,
        last_logits_only: bool = False,
    ):
        """input_ids [b, s] -> logits [b, s, vocab] ([b, 1, vocab] with ``last_logits_only``), and with
        ``output_hidden_states`` (logits, residual stream [embeddings, after layer 0, ..., after layer L-1] each
        [b, s, hidden]).

        ``positions`` [b, s] or [s]: default P..P+s-1 after the P tokens in ``cache``. ``attention_mask`` bool
        [b, s, P + s] (row i sees key j; the P cached keys first): default causal. ``cache``: extended in place by
        these s tokens. Without mask and cache the causal rows take the fused attention kernel.
        """
        b, s = input_ids.shape
        past = 0 if cache is None else cache.length
        if positions is None:
            positions = torch.arange(past, past + s, device=input_ids.device)  # [s]
        if attention_mask is None and past:
            attention_mask = torch.ones(s, past + s, dtype=torch.bool, device=input_ids.device).tril(past)
            attention_mask = attention_mask.expand(b, -1, -1)  # [b, s, P + s]
        x = self.embed_tokens(input_ids)  # [b, s, hidden]
        cos, sin = self.cos_sin(positions, x.dtype)  # [(b,) s, rope / 2]
        hidden = [x]
        for layer in self.layers:
            x = layer(x, cos, sin, attention_mask, cache)
            if output_hidden_states:
                hidden.append(x)
        if last_logits_only:
            x = x[:, -1:]
        logits = self.lm_head(self.norm(x))
        return (logits, hidden) if output_hidden_states else logits

    def moe_layers(self) -> list[MoE]:
        return [layer.mlp for layer in self.layers if isinstance(layer.mlp, MoE)]

    # -- checkpoint format -----------------------------------------------------------------------------------

    def checkpoint_state_dict(self) -> dict[str, torch.Tensor]:
        """Text weights under the real Kimi-K2.6 names (``language_model.``...), one tensor per expert."""
        out: dict[str, torch.Tensor] = {}
        for name, t in self.state_dict().items():
            if name.startswith("lm_head."):
                out[TEXT_PREFIX + name] = t
                continue
            if ".mlp.gate_weight" in name:
                out[TEXT_PREFIX + "model." + name.replace("mlp.gate_weight", "mlp.gate.weight")] = t
            elif ".mlp.e_score_correction_bias" in name:
                out[TEXT_PREFIX + "model." + name.replace("mlp.e_score", "mlp.gate.e_score")] = t
            elif ".mlp.w_" in name:
                prefix, kind = name.split(".mlp.w_")
                for e in range(t.shape[0]):
                    out[TEXT_PREFIX + f"model.{prefix}.mlp.experts.{e}.{kind}_proj.weight"] = t[e]
            else:
                out[TEXT_PREFIX + "model." + name] = t
        return out

    def load_checkpoint_state_dict(self, sd: dict[str, torch.Tensor]) -> None:
        """The inverse of :meth:`checkpoint_state_dict` (weights outside ``language_model.`` are skipped)."""
        own: dict[str, torch.Tensor] = {}
        experts: dict[tuple[str, str], dict[int, torch.Tensor]] = {}
        for name, t in sd.items():
            if not name.startswith(TEXT_PREFIX):
                continue
            name = name[len(TEXT_PREFIX) :]
            name = name.removeprefix("model.")
            if ".mlp.experts." in name:
                prefix, rest = name.split(".mlp.experts.")
                e, kind = rest.split(".")[:2]
                experts.setdefault((prefix, kind.replace("_proj", "")), {})[int(e)] = t
                continue
            own[name.replace("mlp.gate.weight", "mlp.gate_weight").replace("mlp.gate.e_score", "mlp.e_score")] = t
        for (prefix, kind), per in experts.items():
            own[f"{prefix}.mlp.w_{kind}"] = torch.stack([per[e] for e in range(len(per))])
        self.load_state_dict(own, strict=True)

    @classmethod
    def from_pretrained(cls, path: str | Path, dtype: torch.dtype = torch.float32) -> CompactDeepseekV3:
        """The text model of a Kimi-format checkpoint folder (``config.json`` + ``model.safetensors``), in eval
        mode. The routing bias stays at least float32 (the checkpoint's dtype; transformers keeps it fp32 too)."""
        from safetensors.torch import load_file

        path = Path(path)
        cfg = json.loads((path / "config.json").read_text())
        model = cls(cfg["text_config"])
        model.load_checkpoint_state_dict(load_file(path / "model.safetensors"))
        model = model.to(dtype)
        for moe in model.moe_layers():
            moe.e_score_correction_bias = moe.e_score_correction_bias.to(torch.promote_types(dtype, torch.float32))
        return model.eval()
