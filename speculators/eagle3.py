"""EAGLE3 drafter (SpecForge / lightseek format, GQA or MLA attention): config, d2t/t2d, module, tree drafting.

One decoder layer ("midlayer") over ``cat(input_layernorm(embed(token)), hidden_norm(h))`` with residual ``h``,
then a final ``norm`` and a reduced-vocab ``lm_head`` (``reference/algorithms.md`` 3.1; SGLang
``srt/models/llama_eagle3.py`` and, for MLA, ``srt/models/kimi_k25_eagle3.py``):

- ``h`` is ``fc(cat_l target h_l)`` (the target's aux layers; eagle3.1 ``fc_norm`` normalizes each chunk first)
  for committed tokens, and the drafter's own output for drafted ones: its **pre-norm** output (``norm_output``
  false) or its normed output (eagle3.1 ``norm_output: true``);
- draft extend pairs each token's target feature with the **next** token's embedding (SGLang shifts the ids by
  one): for committed tokens t_0..t_{T-1} the rows are (h_i, t_{i+1}) at positions i = 0..T-2, and the last row's
  logits draft t_T; a drafted node at depth d then runs at position T-2+d, seeing the committed rows and its own
  ancestors only;
- ``lm_head`` covers ``draft_vocab_size`` tokens; ``target_id = draft_id + d2t[draft_id]`` (SGLang's
  ``hot_token_id = d2t + arange``); ``t2d[target_id]`` marks the target ids in the draft vocabulary.

Tensor names are the published ones: ``midlayer.*`` (``self_attn.{q,k,v,o}_proj`` or the MLA set
``self_attn.{q_a_proj, q_a_layernorm, q_b_proj, kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj}``,
``mlp.{gate,up,down}_proj``, ``input_layernorm``, ``hidden_norm``, ``post_attention_layernorm``), ``fc``,
``fc_norm.{i}`` (eagle3.1), ``norm``, ``lm_head``, ``d2t``, ``t2d``. The embedding is the target's.

Capture convention (SGLang ``deepseek_v2.py::set_eagle3_layers_to_capture``): ``eagle_aux_hidden_state_layer_ids``
starting with 1 are layer outputs (captured at the input of layer l+1); any other list is taken as raw capture
points, i.e. the outputs of layers c-1; absent, the capture points are [2, L//2, L-3].
:meth:`Eagle3Config.resolve_target_layer_ids` returns layer-output ids in every case.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .dflash import GatedMLP, RMSNorm, Rope, _get, masked_attention, normalize_rope_scaling
from .pairing import DrafterConfigError, load_config_dict
from .reference import DraftContext

GQA, MLA = "gqa", "mla"
ARCHITECTURE_ATTENTION = {"LlamaForCausalLMEagle3": GQA, "Eagle3DeepseekV2ForCausalLM": MLA}


# ---------------------------------------------------------------------------------------------------------------
# Config
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Eagle3Config:
    """An EAGLE3 drafter ``config.json``, parsed once (``LlamaForCausalLMEagle3`` or the MLA
    ``Eagle3DeepseekV2ForCausalLM``); errors name the field (:class:`~.pairing.DrafterConfigError`)."""

    architecture: str
    hidden_size: int
    num_attention_heads: int
    intermediate_size: int
    vocab_size: int
    draft_vocab_size: int
    num_key_value_heads: int = 0  # GQA; 0 = num_attention_heads
    head_dim: int = 0  # GQA; 0 = hidden_size // num_attention_heads
    aux_layer_ids: tuple[int, ...] | None = None  # eagle_config.eagle_aux_hidden_state_layer_ids, as written
    num_aux_hidden_states: int = 3
    target_hidden_size: int = 0  # 0 = hidden_size
    has_target_hidden_size: bool = False
    fc_norm: bool = False  # eagle3.1: per-chunk RMSNorm before fc (also spelled use_aux_norm)
    norm_output: bool = False  # eagle3.1: the next step's h is the normed output
    norm_before_fc: bool = False  # one RMSNorm over the concatenated features before fc
    fc_bias: bool = False  # config "bias"
    lm_head_from_target: bool = False  # draft_vocab_size absent: SGLang loads lm_head from the target
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    max_position_embeddings: int = 2048
    # MLA (Eagle3DeepseekV2ForCausalLM)
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    rope_interleave: bool = True
    extra: dict = field(default_factory=dict, compare=False)

    @property
    def attention(self) -> str:
        return ARCHITECTURE_ATTENTION[self.architecture]

    @property
    def architectures(self) -> tuple[str, ...]:
        return (self.architecture,)

    @classmethod
    def from_dict(cls, d: Mapping) -> Eagle3Config:
        d = dict(d)
        archs = [a for a in (d.get("architectures") or ()) if a in ARCHITECTURE_ATTENTION]
        if not archs:
            raise DrafterConfigError(
                f"not an EAGLE3 drafter config: architectures {d.get('architectures')} (expected one of "
                f"{sorted(ARCHITECTURE_ATTENTION)})"
            )
        arch = archs[0]
        if _get(d, "num_hidden_layers", int, 1) != 1:
            raise DrafterConfigError(
                f"EAGLE3 drafters have one decoder layer, got num_hidden_layers {d['num_hidden_layers']}"
            )
        if d.get("hidden_act", "silu") != "silu":
            raise DrafterConfigError(f"hidden_act {d.get('hidden_act')!r} is not supported (silu)")
        if d.get("tie_word_embeddings"):
            raise DrafterConfigError(
                "tie_word_embeddings is not supported for EAGLE3 drafters (Kimi drafts have a head)"
            )
        ec = d.get("eagle_config") or {}
        if not isinstance(ec, Mapping):
            raise DrafterConfigError(f"eagle_config must be an object, got {ec!r}")
        if ec.get("use_aux_hidden_state", True) is False:
            raise DrafterConfigError("eagle_config.use_aux_hidden_state false (EAGLE-2 style) is not EAGLE3")
        ids = ec.get("eagle_aux_hidden_state_layer_ids", d.get("eagle_aux_hidden_state_layer_ids"))
        if ids is not None:
            if not isinstance(ids, (list, tuple)) or not ids or not all(isinstance(i, int) for i in ids):
                raise DrafterConfigError(
                    f"eagle_config.eagle_aux_hidden_state_layer_ids must be a non-empty int list, got {ids!r}"
                )
            ids = tuple(int(i) for i in ids)
        num_aux = d.get("num_aux_hidden_states")
        num_aux = int(num_aux) if num_aux is not None else (len(ids) if ids else 3)
        hidden = _get(d, "hidden_size", int)
        heads = _get(d, "num_attention_heads", int)
        vocab = _get(d, "vocab_size", int)
        draft_vocab = d.get("draft_vocab_size")
        theta, scaling = normalize_rope_scaling(d)
        target_hidden = d.get("target_hidden_size")
        mla: dict[str, Any] = {}
        if arch == "Eagle3DeepseekV2ForCausalLM":
            mla = {
                k: _get(d, k, int)
                for k in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
            }
            mla["rope_interleave"] = _get(d, "rope_interleave", bool, True)
        known = {
            "architectures", "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
            "intermediate_size", "vocab_size", "draft_vocab_size", "num_hidden_layers", "eagle_config",
            "eagle_aux_hidden_state_layer_ids", "num_aux_hidden_states", "target_hidden_size", "fc_norm",
            "use_aux_norm", "norm_output", "norm_before_fc", "bias", "rms_norm_eps", "rope_theta", "rope_scaling",
            "rope_parameters", "max_position_embeddings", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
            "qk_rope_head_dim", "v_head_dim", "rope_interleave", "hidden_act", "tie_word_embeddings",
        }  # fmt: skip
        cfg = cls(
            architecture=arch,
            hidden_size=hidden,
            num_attention_heads=heads,
            num_key_value_heads=_get(d, "num_key_value_heads", int, heads),
            head_dim=_get(d, "head_dim", int, hidden // heads),
            intermediate_size=_get(d, "intermediate_size", int),
            vocab_size=vocab,
            draft_vocab_size=vocab if draft_vocab is None else _get(d, "draft_vocab_size", int),
            aux_layer_ids=ids,
            num_aux_hidden_states=num_aux,
            target_hidden_size=hidden if target_hidden is None else int(target_hidden),
            has_target_hidden_size=target_hidden is not None,
            fc_norm=bool(d.get("fc_norm") or d.get("use_aux_norm")),
            norm_output=bool(d.get("norm_output", False)),
            # LlamaForCausalLMEagle3 only: SGLang's MLA draft has no input_norm
            norm_before_fc=arch == "LlamaForCausalLMEagle3"
            and bool(ec.get("norm_before_fc", d.get("norm_before_fc", False))),
            fc_bias=bool(d.get("bias", False)),
            lm_head_from_target=draft_vocab is None,
            rms_norm_eps=_get(d, "rms_norm_eps", float, 1e-6),
            rope_theta=theta,
            rope_scaling=scaling,
            max_position_embeddings=_get(d, "max_position_embeddings", int, 2048),
            extra={k: v for k, v in d.items() if k not in known},
            **mla,
        )
        if cfg.attention == GQA and cfg.num_attention_heads % cfg.num_key_value_heads:
            raise DrafterConfigError(
                f"num_attention_heads {heads} is not a multiple of num_key_value_heads {cfg.num_key_value_heads}"
            )
        if ids is not None and len(ids) != num_aux:
            raise DrafterConfigError(
                f"num_aux_hidden_states {num_aux} disagrees with eagle_aux_hidden_state_layer_ids {list(ids)}"
            )
        return cfg

    @classmethod
    def from_pretrained(cls, path: str | Path) -> Eagle3Config:
        return cls.from_dict(load_config_dict(path))

    def to_dict(self) -> dict:
        """The config.json content in the layout SGLang's loaders read."""
        d = dict(self.extra)
        d.update(
            architectures=[self.architecture],
            hidden_size=self.hidden_size,
            num_hidden_layers=1,
            num_attention_heads=self.num_attention_heads,
            intermediate_size=self.intermediate_size,
            vocab_size=self.vocab_size,
            rms_norm_eps=self.rms_norm_eps,
            hidden_act="silu",
            tie_word_embeddings=False,
            max_position_embeddings=self.max_position_embeddings,
            rope_theta=self.rope_theta,
            rope_scaling=None if self.rope_scaling is None else dict(self.rope_scaling),
        )
        if self.attention == GQA:
            d.update(num_key_value_heads=self.num_key_value_heads, head_dim=self.head_dim)
            d.setdefault("model_type", "llama")
        else:
            d.update(
                num_key_value_heads=self.num_attention_heads,
                q_lora_rank=self.q_lora_rank,
                kv_lora_rank=self.kv_lora_rank,
                qk_nope_head_dim=self.qk_nope_head_dim,
                qk_rope_head_dim=self.qk_rope_head_dim,
                v_head_dim=self.v_head_dim,
                rope_interleave=self.rope_interleave,
            )
            d.setdefault("model_type", "kimi_k2")
        if not self.lm_head_from_target:
            d["draft_vocab_size"] = self.draft_vocab_size
        if self.has_target_hidden_size:
            d["target_hidden_size"] = self.target_hidden_size
        if self.fc_norm:
            d["fc_norm"] = True
        if self.norm_output:
            d["norm_output"] = True
        if self.fc_bias:
            d["bias"] = True
        ec = dict(d.get("eagle_config") or {})
        ec["use_aux_hidden_state"] = True
        if self.aux_layer_ids is not None:
            ec["eagle_aux_hidden_state_layer_ids"] = list(self.aux_layer_ids)
        if self.norm_before_fc:
            ec["norm_before_fc"] = True
        d["eagle_config"] = ec
        return d

    # -- derived ---------------------------------------------------------------------------------------------

    def capture_points(self, target_num_layers: int) -> list[int]:
        """SGLang's ``layers_to_capture`` (capture at the input of layer c) for a target of that depth."""
        ids = self.aux_layer_ids
        if ids is None:
            return [2, target_num_layers // 2, target_num_layers - 3]
        return [i + 1 for i in ids] if ids[0] == 1 else list(ids)

    def resolve_target_layer_ids(self, target_num_layers: int) -> list[int]:
        """The captured features as layer-output ids l (HF ``hidden_states[l + 1]``; -1 = the embeddings)."""
        return [c - 1 for c in self.capture_points(target_num_layers)]

    def rope(self) -> Rope:
        if self.attention == GQA:
            return Rope(
                self.head_dim, self.rope_theta, self.rope_scaling, neox=True, max_position=self.max_position_embeddings
            )
        return Rope(
            self.qk_rope_head_dim,
            self.rope_theta,
            self.rope_scaling,
            neox=not self.rope_interleave,
            deepseek=True,
            max_position=self.max_position_embeddings,
        )


# ---------------------------------------------------------------------------------------------------------------
# Module
# ---------------------------------------------------------------------------------------------------------------


class Eagle3GQAAttention(nn.Module):
    """Llama attention over the 2H input ``cat(embed, h)`` (SGLang widens qkv_proj to 2H); no biases."""

    def __init__(self, cfg: Eagle3Config) -> None:
        super().__init__()
        h, hd = cfg.hidden_size, cfg.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, hd
        self.q_proj = nn.Linear(2 * h, self.num_heads * hd, bias=False)
        self.k_proj = nn.Linear(2 * h, self.num_kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(2 * h, self.num_kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(self.num_heads * hd, h, bias=False)
        self.rope = cfg.rope()
        self.scale = hd**-0.5

    def qkv(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        b, s, _ = x.shape
        cos, sin = self.rope.cos_sin(positions)
        q = self.rope.apply(self.q_proj(x).view(b, s, self.num_heads, self.head_dim), cos, sin)
        k = self.rope.apply(self.k_proj(x).view(b, s, self.num_kv_heads, self.head_dim), cos, sin)
        return q, k, self.v_proj(x).view(b, s, self.num_kv_heads, self.head_dim)

    def out(self, o: torch.Tensor) -> torch.Tensor:
        return self.o_proj(o.flatten(-2))


class Eagle3MLAAttention(nn.Module):
    """DeepSeek-V2 multi-latent attention over the 2H input (``q_a_proj`` and ``kv_a_proj_with_mqa`` take 2H),
    in its non-absorbed form: per-head K = [k_nope; k_rope], V from ``kv_b_proj`` of the normed latent."""

    def __init__(self, cfg: Eagle3Config) -> None:
        super().__init__()
        h = cfg.hidden_size
        self.num_heads = cfg.num_attention_heads
        self.nope, self.rope_dim, self.vdim = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
        self.kv_lora = cfg.kv_lora_rank
        self.q_a_proj = nn.Linear(2 * h, cfg.q_lora_rank, bias=False)
        self.q_a_layernorm = RMSNorm(cfg.q_lora_rank, cfg.rms_norm_eps)
        self.q_b_proj = nn.Linear(cfg.q_lora_rank, self.num_heads * (self.nope + self.rope_dim), bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(2 * h, self.kv_lora + self.rope_dim, bias=False)
        self.kv_a_layernorm = RMSNorm(self.kv_lora, cfg.rms_norm_eps)
        self.kv_b_proj = nn.Linear(self.kv_lora, self.num_heads * (self.nope + self.vdim), bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.vdim, h, bias=False)
        self.rope = cfg.rope()
        scale = (self.nope + self.rope_dim) ** -0.5
        if cfg.rope_scaling is not None:  # SGLang compute_mla_mscale_scaling: times get_mscale(f, mscale_all_dim)^2
            from .dflash import yarn_get_mscale

            m = yarn_get_mscale(float(cfg.rope_scaling["factor"]), float(cfg.rope_scaling.get("mscale_all_dim", 0)))
            scale *= m * m
        self.scale = scale

    def qkv(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        b, s, _ = x.shape
        cos, sin = self.rope.cos_sin(positions)
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x))).view(b, s, self.num_heads, -1)
        q_nope, q_rot = q.split([self.nope, self.rope_dim], dim=-1)
        latent, k_rot = self.kv_a_proj_with_mqa(x).split([self.kv_lora, self.rope_dim], dim=-1)
        kv = self.kv_b_proj(self.kv_a_layernorm(latent)).view(b, s, self.num_heads, -1)
        k_nope, v = kv.split([self.nope, self.vdim], dim=-1)
        q = torch.cat([q_nope, self.rope.apply(q_rot, cos, sin)], dim=-1)
        k_rot = self.rope.apply(k_rot[:, :, None], cos, sin).expand(b, s, self.num_heads, self.rope_dim)
        return q, torch.cat([k_nope, k_rot], dim=-1), v

    def out(self, o: torch.Tensor) -> torch.Tensor:
        return self.o_proj(o.flatten(-2))


class Eagle3DecoderLayer(nn.Module):
    def __init__(self, cfg: Eagle3Config) -> None:
        super().__init__()
        h = cfg.hidden_size
        self.input_layernorm = RMSNorm(h, cfg.rms_norm_eps)
        self.hidden_norm = RMSNorm(h, cfg.rms_norm_eps)
        self.self_attn = Eagle3GQAAttention(cfg) if cfg.attention == GQA else Eagle3MLAAttention(cfg)
        self.post_attention_layernorm = RMSNorm(h, cfg.rms_norm_eps)
        self.mlp = GatedMLP(h, cfg.intermediate_size)


KV = tuple[torch.Tensor, torch.Tensor]  # (K [B, P, heads, Dk], V [B, P, heads, Dv]) of P earlier draft rows


class Eagle3Drafter(nn.Module):
    """The EAGLE3 drafter with the published tensor names; the target's embedding is attached with
    :meth:`attach_target` (not part of the checkpoint). ``d2t`` / ``t2d`` are persistent buffers.

    :meth:`forward` runs rows with an explicit KV prefix and mask (draft extend, tree steps, training-time test);
    :meth:`step_drafter` is the ``StepDrafter`` callable of :class:`~.reference.EagleProposer`.
    """

    def __init__(self, config: Eagle3Config) -> None:
        super().__init__()
        self.config = config
        h, th, n = config.hidden_size, config.target_hidden_size, config.num_aux_hidden_states
        if config.norm_before_fc:
            self.input_norm = RMSNorm(n * th, config.rms_norm_eps)
        if config.fc_norm:
            self.fc_norm = nn.ModuleList(RMSNorm(th, config.rms_norm_eps) for _ in range(n))
        self.fc = nn.Linear(n * th, h, bias=config.fc_bias)
        self.midlayer = Eagle3DecoderLayer(config)
        self.norm = RMSNorm(h, config.rms_norm_eps)
        self.lm_head = nn.Linear(h, config.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(config.vocab_size, dtype=torch.bool))
        self.t2d[: config.draft_vocab_size] = True
        self.embed_weight: torch.Tensor | None = None

    # -- vocabulary ------------------------------------------------------------------------------------------

    def set_vocab_map(self, draft_to_target: torch.Tensor) -> None:
        """Set d2t / t2d from the sorted target ids of the draft vocabulary ([draft_vocab_size] int)."""
        ids = torch.as_tensor(draft_to_target, dtype=torch.long)
        if ids.shape != (self.config.draft_vocab_size,) or not bool((ids[1:] > ids[:-1]).all()):
            raise ValueError("draft_to_target must hold draft_vocab_size strictly increasing target ids")
        self.d2t.copy_(ids - torch.arange(ids.shape[0]))
        self.t2d.zero_()
        self.t2d[ids] = True

    @property
    def token_map(self) -> torch.Tensor:
        """draft id -> target id (SGLang's ``hot_token_id = d2t + arange``)."""
        return self.d2t + torch.arange(self.d2t.shape[0], device=self.d2t.device)

    def attach_target(self, embed_weight: torch.Tensor) -> Eagle3Drafter:
        """Share the target's ``embed_tokens.weight`` [vocab, hidden] (SGLang ``set_embed``)."""
        if tuple(embed_weight.shape) != (self.config.vocab_size, self.config.hidden_size):
            raise ValueError(
                f"target embed_tokens is {tuple(embed_weight.shape)}, the drafter needs "
                f"({self.config.vocab_size}, {self.config.hidden_size})"
            )
        self.embed_weight = embed_weight.detach()
        return self

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        if self.embed_weight is None:
            raise RuntimeError("call attach_target(embed_weight) first")
        return F.embedding(ids, self.embed_weight).to(self.fc.weight.dtype)

    # -- forward ---------------------------------------------------------------------------------------------

    def project(self, target_hidden: torch.Tensor) -> torch.Tensor:
        """Concatenated target aux features [..., n * Ht] -> [..., H] (input_norm / fc_norm, then fc)."""
        x = target_hidden.to(self.fc.weight.dtype)
        if self.config.norm_before_fc:
            x = self.input_norm(x)
        if self.config.fc_norm:
            chunks = x.chunk(self.config.num_aux_hidden_states, dim=-1)
            x = torch.cat([norm(c) for norm, c in zip(self.fc_norm, chunks)], dim=-1)
        return self.fc(x)

    def forward(
        self,
        embeds: torch.Tensor,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        past_kv: KV | None = None,
        mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, KV]:
        """Rows (embed of the next token, h) -> (normed [B, S, H] for :meth:`logits`, next-step h [B, S, H],
        this call's K/V).

        hidden [B, S, n * Ht] target features (projected by fc, SGLang's rule: when the width differs from H) or
        [B, S, H] drafter states; positions [B, S]; past_kv: K/V of P earlier rows, attended before this call's
        own rows; mask bool [B, S, P + S] (None: everything visible).
        """
        layer = self.midlayer
        if hidden.shape[-1] != embeds.shape[-1]:
            hidden = self.project(hidden)
        residual = hidden
        x = torch.cat([layer.input_layernorm(embeds), layer.hidden_norm(hidden)], dim=-1)
        q, k, v = layer.self_attn.qkv(x, positions)
        new_kv = (k, v)
        if past_kv is not None:
            k, v = torch.cat([past_kv[0], k], dim=1), torch.cat([past_kv[1], v], dim=1)
        attn = layer.self_attn.out(masked_attention(q, k, v, mask, layer.self_attn.scale))
        residual = attn + residual
        out = layer.mlp(layer.post_attention_layernorm(residual)) + residual  # pre-norm output
        normed = self.norm(out)
        return normed, (normed if self.config.norm_output else out), new_kv

    def logits(self, normed: torch.Tensor) -> torch.Tensor:
        """[..., H] -> draft-vocab logits [..., draft_vocab_size] float32."""
        return self.lm_head(normed).float()

    def extend(
        self,
        target_hidden: torch.Tensor,
        next_tokens: torch.Tensor,
        *,
        start: int = 0,
        past_kv: KV | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, KV]:
        """Draft extend over committed rows: (h_i, t_{i+1}) at positions i, causal.

        target_hidden [N, n * Ht] of t_0..t_{N-1}; next_tokens [N] = t_1..t_N. With ``start`` > 0 the rows
        0..start-1 are given by ``past_kv`` (their K/V, [1, start, ...]) and only rows start..N-1 are computed.
        Returns (draft logits of the last row [draft_vocab] (drafts t_{N+1}), its next-step h [H], the K/V of all
        N rows [1, N, ...]).
        """
        n = target_hidden.shape[0]
        device = self.fc.weight.device
        rows = n - start
        positions = torch.arange(start, n, device=device)[None]
        mask = torch.ones((rows, n), dtype=torch.bool, device=device).tril(diagonal=start)[None]
        embeds = self.embed(next_tokens[start:].to(device))[None]
        normed, h, kv = self(embeds, target_hidden[start:].to(device)[None], positions, past_kv, mask)
        if past_kv is not None:
            kv = (torch.cat([past_kv[0], kv[0]], dim=1), torch.cat([past_kv[1], kv[1]], dim=1))
        return self.logits(normed[0, -1]), h[0, -1], kv

    # -- the reference loop ----------------------------------------------------------------------------------

    def step_drafter(self) -> Callable[[DraftContext, torch.Tensor], torch.Tensor]:
        """``(DraftContext, paths [k, s+1]) -> probs [k, V]`` for :class:`~.reference.EagleProposer`.

        SGLang's semantics, computed incrementally: per context, one draft extend over the committed rows; a path
        ``[root, x_1..x_s]`` (target ids) runs x_s at position T-2+s with its parent's next-step h, attending to
        the committed rows and its ancestors only. States are cached per path, so each call costs one row per
        path. Probabilities are softmax over the draft vocabulary scattered to target ids through d2t (d2t is
        increasing, so ties keep SGLang's order).
        """
        state: dict[str, Any] = {"context": None, "tokens": None}

        def reusable_rows(state: dict, tokens: torch.Tensor, hidden: torch.Tensor) -> int:
            """Committed rows (h_i, t_{i+1}) of the previous extend that are unchanged (SGLang keeps their KV)."""
            old_tokens, old_hidden = state["tokens"], state.get("hidden")
            if old_tokens is None:
                return 0
            rows = old_tokens.shape[0] - 1
            if rows > hidden.shape[0] or not torch.equal(old_tokens, tokens[: rows + 1]):
                return 0
            rows = rows if torch.equal(old_hidden, hidden[:rows]) else 0
            return min(rows, hidden.shape[0] - 1)  # at least the newest row is computed

        @torch.no_grad()
        def drafter(context: DraftContext, paths: torch.Tensor) -> torch.Tensor:
            if context.hidden_states is None:
                raise ValueError("EAGLE3 needs the target's captured aux hidden states")
            vocab = self.config.vocab_size
            token_map = self.token_map
            device = self.fc.weight.device
            if state["context"] is not context:  # a new propose(): draft extend over the new committed rows
                tokens, hidden = context.tokens.to(device), context.hidden_states.to(device)
                keep = reusable_rows(state, tokens, hidden)
                past = tuple(t[:, :keep] for t in state["ctx_kv"]) if keep else None
                logits, h, kv = self.extend(hidden, tokens[1:], start=keep, past_kv=past)
                state.update(context=context, ctx_kv=kv, num_rows=tokens.shape[0] - 1, tokens=tokens, hidden=hidden,
                             paths={(int(tokens[-1]),): (logits, h, None)})  # fmt: skip
            cache = state["paths"]
            k, length = paths.shape
            keys = [tuple(p) for p in paths.tolist()]
            if length == 1:
                logits = torch.stack([cache[key][0] for key in keys])
            else:
                parents = [cache[key[:-1]] for key in keys]
                h = torch.stack([p[1] for p in parents])[:, None]  # [k, 1, H]
                ctx_k, ctx_v = (t.expand(k, *t.shape[1:]) for t in state["ctx_kv"])
                if length > 2:  # ancestors' K/V after the committed rows
                    ctx_k = torch.cat([ctx_k, torch.stack([p[2][0] for p in parents])], dim=1)
                    ctx_v = torch.cat([ctx_v, torch.stack([p[2][1] for p in parents])], dim=1)
                position = state["num_rows"] - 1 + (length - 1)  # T-2+s
                positions = torch.full((k, 1), position, device=device)
                normed, h_new, (nk, nv) = self(self.embed(paths[:, -1:].to(device)), h, positions, (ctx_k, ctx_v))
                logits = self.logits(normed[:, 0])
                for i, key in enumerate(keys):
                    prev = parents[i][2]
                    path_kv = (
                        (nk[i], nv[i]) if prev is None else (torch.cat([prev[0], nk[i]]), torch.cat([prev[1], nv[i]]))
                    )
                    cache[key] = (logits[i], h_new[i, 0], path_kv)
            probs = torch.softmax(logits, dim=-1)  # [k, draft_vocab]
            full = torch.zeros((k, vocab), dtype=probs.dtype, device=device)
            full[:, token_map] = probs
            return full.to(paths.device)

        return drafter

    # -- checkpoint ------------------------------------------------------------------------------------------

    def checkpoint_names(self) -> list[str]:
        return sorted(self.state_dict())

    @classmethod
    def from_pretrained(cls, path: str | Path, dtype: torch.dtype = torch.float32) -> Eagle3Drafter:
        """Load ``config.json`` + ``model.safetensors``; ``layers.0.`` is read as ``midlayer.`` (both spellings
        are published), a ``model.`` prefix is dropped; d2t / t2d may be absent when the draft vocab is full."""
        from safetensors.torch import load_file

        path = Path(path)
        model = cls(Eagle3Config.from_pretrained(path))
        sd = {}
        for name, t in load_file(path / "model.safetensors").items():
            name = name.removeprefix("model.")
            if name.startswith("layers.0."):
                name = "midlayer." + name[len("layers.0.") :]
            sd[name] = t
        own = model.state_dict()
        optional = {"d2t", "t2d"} if model.config.draft_vocab_size == model.config.vocab_size else set()
        missing = set(own) - set(sd) - optional
        unexpected = set(sd) - set(own) - {"embed_tokens.weight"}
        if missing or unexpected:
            raise DrafterConfigError(
                f"{path}: checkpoint does not match its config: missing {sorted(missing)}, unexpected "
                f"{sorted(unexpected)}"
            )
        sd.pop("embed_tokens.weight", None)
        model.load_state_dict(sd, strict=False)
        return model.to(dtype).eval()

    def save_pretrained(self, path: str | Path, dtype: torch.dtype = torch.bfloat16) -> None:
        from safetensors.torch import save_file

        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        cfg = self.config.to_dict()
        cfg["torch_dtype"] = str(dtype).removeprefix("torch.")
        (path / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        sd = {
            k: (v.detach().to(dtype) if v.is_floating_point() else v.detach()).contiguous()
            for k, v in self.state_dict().items()
        }
        save_file(sd, path / "model.safetensors", metadata={"format": "pt"})


def published_weight_names(config: Eagle3Config) -> list[str]:
    """Tensor names of a SpecForge / lightseek EAGLE3 checkpoint for this config."""
    attn = (
        ["q_proj", "k_proj", "v_proj", "o_proj"]
        if config.attention == GQA
        else ["q_a_proj", "q_a_layernorm", "q_b_proj", "kv_a_proj_with_mqa", "kv_a_layernorm", "kv_b_proj", "o_proj"]
    )
    names = [f"midlayer.self_attn.{n}.weight" for n in attn]
    names += [f"midlayer.mlp.{n}.weight" for n in ("gate_proj", "up_proj", "down_proj")]
    names += [f"midlayer.{n}.weight" for n in ("input_layernorm", "hidden_norm", "post_attention_layernorm")]
    names += ["fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d"]
    if config.fc_bias:
        names.append("fc.bias")
    if config.fc_norm:
        names += [f"fc_norm.{i}.weight" for i in range(config.num_aux_hidden_states)]
    if config.norm_before_fc:
        names.append("input_norm.weight")
    return sorted(names)


def build_vocab_map(token_counts: torch.Tensor, draft_vocab_size: int) -> torch.Tensor:
    """SpecForge's ``vocab_mapping``: the draft vocabulary is the ``draft_vocab_size`` most frequent target tokens
    (ties to the lower id), sorted by id. token_counts [vocab] -> sorted target ids [draft_vocab_size]."""
    order = sorted(range(token_counts.shape[0]), key=lambda i: (-int(token_counts[i]), i))
    return torch.tensor(sorted(order[:draft_vocab_size]), dtype=torch.long)
