"""Shared by ``train_drafters.py`` and ``bench/bench_tau.py``: the tiny Kimi target run from its compact modules
(``sglang_kimi.models.tiny.TinyKimiLM``) with explicit positions, masks and a KV cache, GSM8K prompts.

- :func:`masked_forward`: logits and per-layer hidden states of any rows under any bool mask (left padding,
  tree verification) with an optional KV cache, the same math as ``TinyKimiLM.forward`` (which is causal only);
- :func:`tiny_target`: the reference loop's ``Target`` protocol on top of it (checked equal to the HF reference
  in ``tests/unit/test_dflash.py``);
- :func:`generate_greedy`: batched greedy decoding with a KV cache (left-padded prompts), for regenerating the
  training text;
- :func:`gsm8k_prompts`: ``"Question: {q}\\nAnswer:"`` prompts, tokenized as the benchmark does.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from sglang_kimi.speculators.reference.loop import Target, TargetOutput

from sglang_kimi.models import tiny

GSM8K_DIR = REPO.parent / "shared" / "data" / "gsm8k"
PROMPT_FORMAT = "Question: {q}\nAnswer:"

KVCache = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: K [b, h, P, dk], V [b, h, P, dv]


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # tiny.MLA.rotate with per-row cos/sin [b, 1, s, r/2]: interleaved pairs in, [evens' | odds'] out
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def rope_cos_sin(model: tiny.TinyKimiLM, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """cos/sin [b, 1, s, rope/2] of positions [b, s], exactly as ``TinyKimiLM.rope`` (fp32 angles, then cast)."""
    freqs = positions.to(torch.float32)[..., None] * model.inv_freq.to(positions.device)
    return (freqs.cos() * model.cos_scale).to(dtype)[:, None], (freqs.sin() * model.cos_scale).to(dtype)[:, None]


class StaticCache:
    """One layer's preallocated K [b, h, capacity, dk] / V buffers, filled left to right (no per-step copies)."""

    def __init__(self, b: int, heads: int, capacity: int, dk: int, dv: int, dtype: torch.dtype) -> None:
        self.k = torch.empty(b, heads, capacity, dk, dtype=dtype)
        self.v = torch.empty(b, heads, capacity, dv, dtype=dtype)
        self.length = 0

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        n = self.length + k.shape[2]
        self.k[:, :, self.length : n] = k
        self.v[:, :, self.length : n] = v
        self.length = n
        return self.k[:, :, :n], self.v[:, :, :n]


def _mla(attn: tiny.MLA, x, cos, sin, mask, past):
    b, s, _ = x.shape
    q = attn.q_b_proj(attn.q_a_layernorm(attn.q_a_proj(x))).view(b, s, attn.nh, -1).transpose(1, 2)
    q_nope, q_rot = q.split([attn.nope, attn.rope], dim=-1)
    kv_nope, k_rot = attn.kv_a_proj_with_mqa(x).split([attn.kv_lora, attn.rope], dim=-1)
    kv = attn.kv_b_proj(attn.kv_a_layernorm(kv_nope)).view(b, s, attn.nh, -1).transpose(1, 2)
    k_nope, v = kv.split([attn.nope, attn.vdim], dim=-1)
    q = torch.cat([q_nope, _rotate(q_rot, cos, sin)], dim=-1)
    k_rot = _rotate(k_rot[:, None], cos, sin).expand(b, attn.nh, s, attn.rope)
    k = torch.cat([k_nope, k_rot], dim=-1)
    if isinstance(past, StaticCache):  # write into the preallocated buffer, attend to its filled part
        k, v = past.append(k, v)
    elif past is not None:
        k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None], scale=attn.scale)
    return attn.o_proj(o.transpose(1, 2).reshape(b, s, attn.nh * attn.vdim)), (k, v)


@torch.no_grad()
def masked_forward(
    model: tiny.TinyKimiLM,
    input_ids: torch.Tensor,
    positions: torch.Tensor,
    mask: torch.Tensor,
    cache: KVCache | None = None,
    last_logits_only: bool = False,
) -> tuple[torch.Tensor, list[torch.Tensor], KVCache]:
    """input_ids / positions [b, s]; mask bool [b, s, P + s] (P cached keys first) -> (logits [b, s, V] (or
    [b, 1, V] for the last row), residual stream [embeddings, after layer 0, ..., after layer L-1] each [b, s, H],
    the extended cache)."""
    dtype = model.embed_tokens.weight.dtype
    x = model.embed_tokens(input_ids)
    cos, sin = rope_cos_sin(model, positions, dtype)
    hidden = [x]
    new_cache: KVCache = []
    for i, layer in enumerate(model.layers):
        a, kv = _mla(layer.self_attn, layer.input_layernorm(x), cos, sin, mask, None if cache is None else cache[i])
        x = x + a
        x = x + layer.mlp(layer.post_attention_layernorm(x))
        hidden.append(x)
        new_cache.append(kv)
    if last_logits_only:
        x = x[:, -1:]
    return model.lm_head(model.norm(x)), hidden, new_cache


def tiny_target(model: tiny.TinyKimiLM, capture_layer_ids: Sequence[int] = ()) -> Target:
    """The reference loop's target over the compact tiny model (full recompute, any mask, any positions);
    ``capture_layer_ids`` l select the output of decoder layer l."""

    def target(input_ids: torch.Tensor, position_ids: torch.Tensor, attention_mask: torch.Tensor) -> TargetOutput:
        logits, hidden, _ = masked_forward(model, input_ids, position_ids, attention_mask)
        captured = torch.cat([hidden[layer + 1] for layer in capture_layer_ids], dim=-1) if capture_layer_ids else None
        return TargetOutput(logits, captured)

    return target


class CachedTarget:
    """:func:`tiny_target` with a prefix KV cache, for long benchmark runs.

    Each call recomputes only the rows after the longest cached *causal prefix* (rows i at position i that see
    exactly keys 0..i, i.e. committed tokens); the cached rows' logits and features are returned as computed
    before. In the reference loop a verify call then costs the newly committed tokens plus the tree, and an
    autoregressive step one row. A different prompt simply misses the cache.
    """

    def __init__(self, model: tiny.TinyKimiLM, capture_layer_ids: Sequence[int] = ()) -> None:
        self.model, self.capture = model, tuple(capture_layer_ids)
        self.tokens = torch.empty(0, dtype=torch.long)
        self.kv: KVCache | None = None
        self.logits = self.hidden = None

    def __call__(self, input_ids: torch.Tensor, position_ids: torch.Tensor, attention_mask: torch.Tensor):
        ids, pos, mask = input_ids[0], position_ids[0], attention_mask[0]
        n = ids.shape[0]
        causal = torch.ones(n, n, dtype=torch.bool).tril()
        row_ok = (mask == causal).all(dim=1) & (pos == torch.arange(n))
        c = n if bool(row_ok.all()) else int((~row_ok).int().argmax())  # causal prefix of this call
        p = min(c, self.tokens.shape[0])
        if p:
            same = (self.tokens[:p] == ids[:p]).int()
            p = p if bool(same.all()) else int((1 - same).argmax())
        p = min(p, n - 1)  # always compute at least one row
        past = None if p == 0 else [(k[:, :, :p], v[:, :, :p]) for k, v in self.kv]
        logits, hidden, kv = masked_forward(self.model, ids[None, p:], pos[None, p:], mask[None, p:], past)
        feats = torch.cat([hidden[layer + 1] for layer in self.capture], dim=-1)[0] if self.capture else None
        if p:
            logits = torch.cat([self.logits[:p], logits[0]])
            feats = None if feats is None else torch.cat([self.hidden[:p], feats])
        else:
            logits = logits[0]
        self.tokens, self.kv = ids[:c].clone(), [(k[:, :, :c], v[:, :, :c]) for k, v in kv]
        self.logits, self.hidden = logits[:c], None if feats is None else feats[:c]
        return TargetOutput(logits[None], None if feats is None else feats[None])


@torch.no_grad()
def generate_greedy(
    model: tiny.TinyKimiLM, prompts: Sequence[Sequence[int]], max_new_tokens: int, pad_id: int = tiny.PAD_ID
) -> list[list[int]]:
    """Greedy continuations (exactly max_new_tokens each, EOS included like any token) of a batch of prompts,
    left-padded, with a KV cache."""
    b = len(prompts)
    longest = max(len(p) for p in prompts)
    t = model.config
    dtype = model.embed_tokens.weight.dtype
    cache = [StaticCache(b, t["num_attention_heads"], longest + max_new_tokens,
                         t["qk_nope_head_dim"] + t["qk_rope_head_dim"], t["v_head_dim"], dtype)
             for _ in model.layers]  # fmt: skip
    pad = torch.tensor([longest - len(p) for p in prompts])
    ids = torch.tensor([[pad_id] * (longest - len(p)) + list(p) for p in prompts])
    positions = (torch.arange(longest)[None] - pad[:, None]).clamp(min=0)
    valid = torch.arange(longest)[None] >= pad[:, None]  # [b, P]: real (non-pad) keys
    mask = torch.ones(longest, longest, dtype=torch.bool).tril()[None] & valid[:, None, :]
    mask |= torch.eye(longest, dtype=torch.bool)[None]  # pad rows see themselves (no empty softmax)
    logits, _, _ = masked_forward(model, ids, positions, mask, cache, last_logits_only=True)
    out = [logits[:, -1].argmax(-1)]
    pos = positions[:, -1]
    for _ in range(max_new_tokens - 1):
        pos = pos + 1
        valid = torch.cat([valid, torch.ones(b, 1, dtype=torch.bool)], dim=1)
        logits, _, _ = masked_forward(model, out[-1][:, None], pos[:, None], valid[:, None, :], cache)
        out.append(logits[:, -1].argmax(-1))
    return torch.stack(out, dim=1).tolist()


def gsm8k_questions(split: str, limit: int | None = None, data_dir: Path = GSM8K_DIR) -> list[str]:
    with open(data_dir / f"{split}.jsonl") as f:
        rows = [json.loads(line)["question"] for line in f if line.strip()]
    return rows[:limit] if limit else rows


def load_tokenizer():
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(str(tiny.TINY_MODEL_DIR))


def gsm8k_prompts(split: str, limit: int | None = None, tokenizer=None) -> list[list[int]]:
    """Token ids of ``"Question: {q}\\nAnswer:"`` for the first ``limit`` questions of a split."""
    tokenizer = tokenizer or load_tokenizer()
    return [tokenizer(PROMPT_FORMAT.format(q=q))["input_ids"] for q in gsm8k_questions(split, limit)]
