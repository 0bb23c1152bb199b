"""EAGLE3 drafter (SpecForge / lightseek format, GQA or MLA attention): config, d2t/t2d, module, tree drafting.

One decoder layer ("midlayer") over ``cat(input_layernorm(embed(token)), hidden_norm(h))`` with residual ``h``,
then a final ``norm`` and a reduced-vocab ``lm_head`` (``docs/drafters.md``; SGLang
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

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..configs import GQA, Eagle3Config, yarn_get_mscale
from ..drafter_tensors import canonical_name, name_problems
from . import checkpoint
from .layers import GatedMLP, RMSNorm, masked_attention, rope_for
from .loop import DraftContext


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
        self.rope = rope_for(cfg)
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
        self.rope = rope_for(cfg)
        scale = (self.nope + self.rope_dim) ** -0.5
        if cfg.rope_scaling is not None:  # SGLang compute_mla_mscale_scaling: times get_mscale(f, mscale_all_dim)^2
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
        path = Path(path)
        model = cls(Eagle3Config.from_pretrained(path))
        cfg = model.config
        sd = {canonical_name(cfg, name): t for name, t in checkpoint.load_tensors(path).items()}
        missing, unexpected = name_problems(cfg, sd)
        if "lm_head.weight" not in sd and "lm_head.weight" not in missing:  # no target head to share here
            missing.append("lm_head.weight")
        checkpoint.check_names(path, set(missing), set(unexpected))
        sd.pop("embed_tokens.weight", None)
        model.load_state_dict(sd, strict=False)
        return model.to(dtype).eval()

    def save_pretrained(self, path: str | Path, dtype: torch.dtype = torch.bfloat16) -> None:
        checkpoint.save(self, self.config.to_dict(), path, dtype)


def build_vocab_map(token_counts: torch.Tensor, draft_vocab_size: int) -> torch.Tensor:
    """SpecForge's ``vocab_mapping``: the draft vocabulary is the ``draft_vocab_size`` most frequent target tokens
    (ties to the lower id), sorted by id. token_counts [vocab] -> sorted target ids [draft_vocab_size]."""
    order = sorted(range(token_counts.shape[0]), key=lambda i: (-int(token_counts[i]), i))
    return torch.tensor(sorted(order[:draft_vocab_size]), dtype=torch.long)
