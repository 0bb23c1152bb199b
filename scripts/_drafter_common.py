"""Shared by ``train_drafters.py``, ``bench/bench_tau.py`` and the drafter tests: the tiny Kimi target run through
the compact DeepSeek-V3 (``sglang_kimi.speculators.reference.deepseek_v3.CompactDeepseekV3``), GSM8K prompts.

- :func:`tiny_target`: the reference loop's ``Target`` protocol over the compact model (full recompute under any
  mask and positions; checked equal to the HF reference in ``tests/unit/test_dflash.py``);
- :class:`CachedTarget`: the same with a prefix KV cache, for long benchmark runs;
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

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from sglang_kimi.models import tiny
from sglang_kimi.speculators.reference.deepseek_v3 import CompactDeepseekV3
from sglang_kimi.speculators.reference.loop import Target, TargetOutput

GSM8K_DIR = REPO / "data" / "gsm8k"
PROMPT_FORMAT = "Question: {q}\nAnswer:"


def tiny_target(model: CompactDeepseekV3, capture_layer_ids: Sequence[int] = ()) -> Target:
    """The reference loop's target over the compact tiny model (full recompute, any mask, any positions);
    ``capture_layer_ids`` l select the output of decoder layer l."""

    @torch.no_grad()
    def target(input_ids: torch.Tensor, position_ids: torch.Tensor, attention_mask: torch.Tensor) -> TargetOutput:
        logits, hidden = model(input_ids, position_ids, attention_mask, output_hidden_states=True)
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

    def __init__(self, model: CompactDeepseekV3, capture_layer_ids: Sequence[int] = ()) -> None:
        self.model, self.capture = model, tuple(capture_layer_ids)
        self.tokens = torch.empty(0, dtype=torch.long)  # the cached causal prefix
        self.cache = model.new_cache()
        self.logits = self.hidden = None

    @torch.no_grad()
    def __call__(self, input_ids: torch.Tensor, position_ids: torch.Tensor, attention_mask: torch.Tensor):
        ids, pos, mask = input_ids[0], position_ids[0], attention_mask[0]  # [n], [n], [n, n]
        n = ids.shape[0]
        causal = torch.ones(n, n, dtype=torch.bool).tril()
        row_ok = (mask == causal).all(dim=1) & (pos == torch.arange(n))
        c = n if bool(row_ok.all()) else int((~row_ok).int().argmax())  # causal prefix of this call
        p = min(c, self.tokens.shape[0])
        if p:
            same = (self.tokens[:p] == ids[:p]).int()
            p = p if bool(same.all()) else int((1 - same).argmax())
        p = min(p, n - 1)  # always compute at least one row
        self.cache.crop(p)
        logits, hidden = self.model(ids[None, p:], pos[None, p:], mask[None, p:], self.cache, output_hidden_states=True)
        feats = torch.cat([hidden[layer + 1] for layer in self.capture], dim=-1)[0] if self.capture else None
        if p:
            logits = torch.cat([self.logits[:p], logits[0]])
            feats = None if feats is None else torch.cat([self.hidden[:p], feats])
        else:
            logits = logits[0]
        self.cache.crop(c)  # keep the committed rows only, not the tree's
        self.tokens = ids[:c].clone()
        self.logits, self.hidden = logits[:c], None if feats is None else feats[:c]
        return TargetOutput(logits[None], None if feats is None else feats[None])


@torch.no_grad()
def generate_greedy(
    model: CompactDeepseekV3, prompts: Sequence[Sequence[int]], max_new_tokens: int, pad_id: int = tiny.PAD_ID
) -> list[list[int]]:
    """Greedy continuations (exactly max_new_tokens each, EOS included like any token) of a batch of prompts,
    left-padded, with a KV cache."""
    b = len(prompts)
    longest = max(len(p) for p in prompts)
    cache = model.new_cache(longest + max_new_tokens)
    pad = torch.tensor([longest - len(p) for p in prompts])
    ids = torch.tensor([[pad_id] * (longest - len(p)) + list(p) for p in prompts])
    positions = (torch.arange(longest)[None] - pad[:, None]).clamp(min=0)
    valid = torch.arange(longest)[None] >= pad[:, None]  # [b, P]: real (non-pad) keys
    mask = torch.ones(longest, longest, dtype=torch.bool).tril()[None] & valid[:, None, :]
    mask |= torch.eye(longest, dtype=torch.bool)[None]  # pad rows see themselves (no empty softmax)
    logits = model(ids, positions, mask, cache, last_logits_only=True)
    out = [logits[:, -1].argmax(-1)]
    pos = positions[:, -1]
    for _ in range(max_new_tokens - 1):
        pos = pos + 1
        valid = torch.cat([valid, torch.ones(b, 1, dtype=torch.bool)], dim=1)
        logits = model(out[-1][:, None], pos[:, None], valid[:, None, :], cache)
        out.append(logits[:, -1].argmax(-1))
    return torch.stack(out, dim=1).tolist()


def gsm8k_questions(split: str, limit: int | None = None, data_dir: Path = GSM8K_DIR) -> list[str]:
    with open(data_dir / f"{split}.jsonl") as f:
        rows = [json.loads(line)["question"] for line in f if line.strip()]
    return rows[:limit] if limit else rows


def load_tokenizer():
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(str(tiny.TINY_MODEL))


def gsm8k_prompts(split: str, limit: int | None = None, tokenizer=None) -> list[list[int]]:
    """Token ids of ``"Question: {q}\\nAnswer:"`` for the first ``limit`` questions of a split."""
    tokenizer = tokenizer or load_tokenizer()
    return [tokenizer(PROMPT_FORMAT.format(q=q))["input_ids"] for q in gsm8k_questions(split, limit)]
