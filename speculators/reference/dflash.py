"""DFlash drafter (z-lab format): config, module, block drafting, and plug-ins for the reference proposers.

A DFlash drafter is a stack of Qwen3 decoder layers with **non-causal** attention that drafts a whole block in one
pass (SGLang ``srt/models/dflash.py::DFlashDraftModel``; derivation in ``docs/drafters.md``):

- context: ``ctx = hidden_norm(fc(cat_l h_l))`` over the target's captured layers (``target_layer_ids``) of every
  committed token; the same ctx rows feed every layer, where each layer's own ``k_proj`` / ``v_proj`` turns them
  into K/V ("injected into the KV cache"): K = RoPE(k_norm(k_proj(ctx))), V = v_proj(ctx);
- block: ``[bonus, mask x (B-1)]`` embedded with the *target's* ``embed_tokens`` at positions start..start+B-1;
  Q comes from the block only, K/V from ``[ctx; block]``, and every block row sees every ctx row and every block
  row (``is_causal=False``);
- readout: ``logits_k = target.lm_head(norm(h_k))``; position k (k = 1..B-1) drafts token start+k.

Tensor names are the published ones (``z-lab/Kimi-K2.5-DFlash``): ``layers.{i}.self_attn.{q,k,v,o}_proj``,
``layers.{i}.self_attn.{q,k}_norm``, ``layers.{i}.mlp.{gate,up,down}_proj``, ``layers.{i}.input_layernorm``,
``layers.{i}.post_attention_layernorm``, ``fc``, ``hidden_norm``, ``norm``; no embedding, no LM head.

RoPE is Qwen3's (neox halves) with SGLang's ``get_rope`` scaling: for YaRN the cos/sin carry the attention factor
``yarn_get_mscale(f, mscale) / yarn_get_mscale(f, mscale_all_dim)`` when both are given (1.0 for the published
Kimi config, where both are 1.0), else the legacy ``1 + 0.1 ln f`` (1.416 for f = 64). Transformers 5 computes the
same; see :func:`yarn_attention_factor`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..configs import DFlashConfig
from ..drafter_tensors import SELECTOR_PREFIX, name_problems
from . import checkpoint
from .layers import GatedMLP, RMSNorm, masked_attention, rope_for
from .loop import DraftContext


class DFlashAttention(nn.Module):
    """Qwen3 attention whose K/V come from ``[ctx; block]`` and whose Q comes from the block (non-causal)."""

    def __init__(self, cfg: DFlashConfig) -> None:
        super().__init__()
        h, hd = cfg.hidden_size, cfg.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, hd
        self.q_proj = nn.Linear(h, self.num_heads * hd, bias=cfg.attention_bias)
        self.k_proj = nn.Linear(h, self.num_kv_heads * hd, bias=cfg.attention_bias)
        self.v_proj = nn.Linear(h, self.num_kv_heads * hd, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(self.num_heads * hd, h, bias=cfg.attention_bias)
        self.q_norm = RMSNorm(hd, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(hd, cfg.rms_norm_eps)
        self.rope = rope_for(cfg)
        self.scale = hd**-0.5

    def context_kv(self, ctx: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """ctx [B, C, H] -> K, V [B, C, Hkv, D]: what SGLang materializes into the draft KV cache once per
        committed token (``kv_proj_only`` + ``apply_k_norm`` + ``apply_k_rope``)."""
        b, c, _ = ctx.shape
        k = self.k_norm(self.k_proj(ctx).view(b, c, self.num_kv_heads, self.head_dim))
        v = self.v_proj(ctx).view(b, c, self.num_kv_heads, self.head_dim)
        return self.rope.apply(k, cos, sin), v

    def forward(
        self,
        x: torch.Tensor,
        ctx_kv: tuple[torch.Tensor, torch.Tensor],
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor | None,
    ) -> torch.Tensor:
        """x [B, S, H] (block rows, input-normed); ctx_kv from :meth:`context_kv`; cos/sin of the block
        positions; mask bool [B, S, C + S] or None (everything visible) -> [B, S, H]."""
        b, s, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(b, s, self.num_heads, self.head_dim))
        k = self.k_norm(self.k_proj(x).view(b, s, self.num_kv_heads, self.head_dim))
        v = self.v_proj(x).view(b, s, self.num_kv_heads, self.head_dim)
        q, k = self.rope.apply(q, cos, sin), self.rope.apply(k, cos, sin)
        k = torch.cat([ctx_kv[0], k], dim=1)  # [B, C+S, Hkv, D]: ctx first, then the block
        v = torch.cat([ctx_kv[1], v], dim=1)
        out = masked_attention(q, k, v, mask, self.scale)
        return self.o_proj(out.reshape(b, s, self.num_heads * self.head_dim))


class DFlashDecoderLayer(nn.Module):
    def __init__(self, cfg: DFlashConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = DFlashAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size)

    def forward(self, x, ctx_kv, cos, sin, mask) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), ctx_kv, cos, sin, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class DFlashDrafter(nn.Module):
    """The DFlash drafter with the published tensor names; the target's embedding and LM head are attached with
    :meth:`attach_target` (plain tensors, not parameters: they are not part of the checkpoint).

    Main entry points: :meth:`forward` (one non-causal pass, any mask: training), :meth:`draft_block` (the draft
    step of ``docs/drafters.md``) and :meth:`block_drafter` (the ``BlockDrafter`` callable of
    :class:`~.reference.ChainProposer` / :class:`~.reference.DDTreeProposer`).
    """

    def __init__(self, config: DFlashConfig) -> None:
        super().__init__()
        self.config = config
        h = config.hidden_size
        self.layers = nn.ModuleList(DFlashDecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.fc = nn.Linear(config.num_context_features * h, h, bias=False)
        self.hidden_norm = RMSNorm(h, config.rms_norm_eps)
        self.norm = RMSNorm(h, config.rms_norm_eps)
        self.embed_weight: torch.Tensor | None = None  # [V, H], the target's embed_tokens
        self.lm_head_weight: torch.Tensor | None = None  # [V, H], the target's lm_head

    # -- target sharing --------------------------------------------------------------------------------------

    def attach_target(self, embed_weight: torch.Tensor, lm_head_weight: torch.Tensor) -> DFlashDrafter:
        """Share the target's ``embed_tokens.weight`` and ``lm_head.weight`` (both [vocab, hidden])."""
        for name, w in (("embed_tokens", embed_weight), ("lm_head", lm_head_weight)):
            if tuple(w.shape) != (self.config.vocab_size, self.config.hidden_size):
                raise ValueError(
                    f"target {name} is {tuple(w.shape)}, the drafter needs "
                    f"({self.config.vocab_size}, {self.config.hidden_size})"
                )
        self.embed_weight, self.lm_head_weight = embed_weight.detach(), lm_head_weight.detach()
        return self

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        if self.embed_weight is None:
            raise RuntimeError("call attach_target(embed_weight, lm_head_weight) first")
        return F.embedding(ids, self.embed_weight).to(self.fc.weight.dtype)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Target LM head over the drafter's normed output: [..., H] -> [..., V] float32."""
        if self.lm_head_weight is None:
            raise RuntimeError("call attach_target(embed_weight, lm_head_weight) first")
        return F.linear(hidden, self.lm_head_weight.to(hidden.dtype)).float()

    # -- forward ---------------------------------------------------------------------------------------------

    def project_context(self, target_hidden: torch.Tensor) -> torch.Tensor:
        """[..., K * H] concatenated target layers -> ctx [..., H] = hidden_norm(fc(.))."""
        expected = self.fc.in_features
        if target_hidden.shape[-1] != expected:
            raise ValueError(
                f"target hidden states have {target_hidden.shape[-1]} features, the drafter expects {expected} "
                f"({self.config.num_context_features} layers x {self.config.hidden_size})"
            )
        return self.hidden_norm(self.fc(target_hidden.to(self.fc.weight.dtype)))

    def forward(
        self,
        noise_embeds: torch.Tensor,
        ctx: torch.Tensor,
        positions: torch.Tensor,
        ctx_positions: torch.Tensor,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """One drafter pass.

        noise_embeds [B, S, H]: embedded block tokens; ctx [B, C, H]: projected context (:meth:`project_context`);
        positions [B, S] / ctx_positions [B, C]: absolute positions; mask bool [B, S, C + S] (query row sees key
        column; ctx columns first) or None for "everything visible" (the inference step).
        Returns the normed hidden states [B, S, H] (feed :meth:`logits`).
        """
        return self.forward_with_context_kv(noise_embeds, self.context_kv(ctx, ctx_positions), positions, mask)

    def context_kv(self, ctx: torch.Tensor, ctx_positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer, K/V [B, C, Hkv, D] of projected context rows (the ctx rows are NOT input-normed); a row's
        K/V depends on its own features and position only, so it can be computed once per committed token."""
        cos, sin = rope_for(self.config).cos_sin(ctx_positions)
        return [layer.self_attn.context_kv(ctx, cos, sin) for layer in self.layers]

    def forward_with_context_kv(
        self,
        noise_embeds: torch.Tensor,
        ctx_kv: list[tuple[torch.Tensor, torch.Tensor]],
        positions: torch.Tensor,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """:meth:`forward` with the context already materialized per layer (:meth:`context_kv`)."""
        cos, sin = rope_for(self.config).cos_sin(positions)
        x = noise_embeds
        for layer, kv in zip(self.layers, ctx_kv):
            x = layer(x, kv, cos, sin, mask)
        return self.norm(x)

    @torch.no_grad()
    def draft_block(
        self,
        target_hidden: torch.Tensor,
        root: int | torch.Tensor,
        num_positions: int | None = None,
        *,
        start: int | None = None,
        ctx_kv: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
    ) -> torch.Tensor:
        """Per-position draft logits of one block (``docs/drafters.md``).

        target_hidden [C, K * H]: the captured target features of the committed tokens before the root (positions
        0..C-1); root: the last committed token (the bonus), at position ``start`` (default C); the block is
        ``[root, mask x num_positions]`` (num_positions defaults to block_size - 1) and is fully visible to itself
        and to the context. ``ctx_kv``: the context already materialized (:meth:`context_kv` of the C rows), in
        which case target_hidden is not read. Returns logits [num_positions, V] float32: row k-1 drafts the token
        at start + k.
        """
        cfg = self.config
        n = cfg.block_size - 1 if num_positions is None else int(num_positions)
        if not 1 <= n <= cfg.block_size - 1:
            raise ValueError(
                f"num_positions must be in [1, {cfg.block_size - 1}] (block_size {cfg.block_size}), got {n}"
            )
        device = self.fc.weight.device
        if ctx_kv is None:
            c = target_hidden.shape[0]
            ctx = self.project_context(target_hidden.to(device))[None]  # [1, C, H]
            ctx_kv = self.context_kv(ctx, torch.arange(c, device=device)[None])
        c = ctx_kv[0][0].shape[1]
        start = c if start is None else int(start)
        root = torch.as_tensor(root, device=device).reshape(1).long()
        block = torch.cat([root, torch.full((n,), cfg.mask_token_id, dtype=torch.long, device=device)])
        positions = torch.arange(start, start + n + 1, device=device)[None]
        hidden = self.forward_with_context_kv(self.embed(block)[None], ctx_kv, positions)
        return self.logits(hidden[0, 1:])  # [n, V]

    def block_drafter(self) -> Callable[[DraftContext, int], torch.Tensor]:
        """``(DraftContext, L) -> logits [L, V]``: plug into ``ChainProposer(drafter=...)`` or
        ``DDTreeProposer(drafter=...)``; L must be <= block_size - 1 (SGLang: num_draft_tokens = L + 1).

        Like SGLang's draft KV cache, the context K/V of committed tokens is materialized once: rows already
        seen (same features) are reused, only newly committed tokens are projected.
        """
        cache: dict[str, Any] = {"hidden": None, "kv": None}

        @torch.no_grad()
        def drafter(context: DraftContext, length: int) -> torch.Tensor:
            hidden = context.hidden_states
            if hidden is None:
                raise ValueError("DFlash needs the target's captured hidden states (capture target_layer_ids)")
            device = self.fc.weight.device
            old = cache["hidden"]
            keep = 0
            if old is not None and old.shape[0] <= hidden.shape[0] and torch.equal(old, hidden[: old.shape[0]]):
                keep = old.shape[0]
            new_rows = hidden[keep:].to(device)
            new_kv = self.context_kv(self.project_context(new_rows)[None],
                                     torch.arange(keep, hidden.shape[0], device=device)[None])  # fmt: skip
            if keep:
                new_kv = [(torch.cat([k0, k1], dim=1), torch.cat([v0, v1], dim=1))
                          for (k0, v0), (k1, v1) in zip(cache["kv"], new_kv)]  # fmt: skip
            cache.update(hidden=hidden, kv=new_kv)
            logits = self.draft_block(hidden, context.tokens[-1], length, ctx_kv=new_kv)
            return logits.to(context.tokens.device)

        return drafter

    # -- checkpoint ------------------------------------------------------------------------------------------

    def checkpoint_names(self) -> list[str]:
        return sorted(self.state_dict())

    @classmethod
    def from_pretrained(cls, path: str | Path, dtype: torch.dtype = torch.float32) -> DFlashDrafter:
        """Load ``config.json`` + ``model.safetensors`` (the z-lab layout; ``model.`` prefixes accepted). A DFlash2
        checkpoint loads its DFlash part: its candidate selector is SGLang's (``scripts/train_dflash2_selector.py``)."""
        path = Path(path)
        model = cls(DFlashConfig.from_pretrained(path))
        sd = checkpoint.load_tensors(path)
        checkpoint.check_names(path, *name_problems(model.config, sd))
        model.load_state_dict({k: v for k, v in sd.items() if not k.startswith(SELECTOR_PREFIX)})
        return model.to(dtype).eval()

    def save_pretrained(self, path: str | Path, dtype: torch.dtype = torch.bfloat16) -> None:
        checkpoint.save(self, self.config.to_dict(), path, dtype)
