"""The ``req_to_token`` row headroom (``sglang_kimi/speculative/req_to_token.py``): for every speculative algorithm the
row past
the context holds the decode reserve (2 x draft tokens for DFLASH, 2 x steps x topk for an EAGLE tree); without
speculation SGLang's own headroom is kept. Computed with SGLang's own sizing functions, with the published
speculative settings replaced."""

from types import SimpleNamespace

import pytest
from sglang.srt import runtime_context
from sglang.srt.mem_cache import allocation_sizing

from sglang_kimi.speculative.req_to_token import _extra_context_len


def publish(monkeypatch, algorithm, draft_tokens, page_size=1, steps=None, topk=None):
    spec = SimpleNamespace(
        speculative_algorithm=algorithm,
        speculative_num_draft_tokens=draft_tokens,
        max_speculative_num_draft_tokens=None,
        speculative_num_steps=steps,
        speculative_eagle_topk=topk,
    )
    for module in (allocation_sizing, runtime_context):
        monkeypatch.setattr(module, "get_spec", lambda: spec)
    monkeypatch.setattr(allocation_sizing, "get_schedule", lambda: SimpleNamespace(page_size=page_size))
    monkeypatch.setattr(allocation_sizing, "get_parallel", lambda: SimpleNamespace(attn_dcp_size=1))


def headroom() -> int:
    return _extra_context_len(allocation_sizing.get_req_to_token_extra_context_len)


@pytest.mark.parametrize("draft_tokens, page_size", [(8, 1), (33, 1), (64, 1), (16, 64)])
def test_dflash_rows_hold_the_decode_reserve(monkeypatch, draft_tokens, page_size):
    publish(monkeypatch, "DFLASH", draft_tokens, page_size)
    upstream = allocation_sizing.get_req_to_token_extra_context_len()
    # DFlashVerifyInput.prepare_for_decode reserves 2 x draft tokens past the committed length, page-rounded
    assert headroom() >= 2 * draft_tokens + page_size - 1
    assert headroom() >= upstream
    if page_size == 1:
        assert upstream < 2 * draft_tokens  # the upstream row is too short: what the hook is for


@pytest.mark.parametrize(
    "algorithm, draft_tokens, steps, topk, reserve",
    [
        ("EAGLE3", 8, 3, 4, 2 * 3 * 4),  # a tree drafts steps x topk tokens, more than it verifies
        ("EAGLE3", 12, 4, 3, 2 * 12),
        ("EAGLE3", 6, 5, 1, 2 * 6),  # a chain: the verify window
        ("NGRAM", 8, None, None, 2 * 8),
    ],
)
def test_other_speculative_rows_hold_their_decode_reserve(monkeypatch, algorithm, draft_tokens, steps, topk, reserve):
    publish(monkeypatch, algorithm, draft_tokens, steps=steps, topk=topk)
    assert allocation_sizing.get_alloc_reserve_per_decode() == reserve
    assert headroom() == max(reserve, allocation_sizing.get_req_to_token_extra_context_len())
    assert allocation_sizing.get_req_to_token_extra_context_len() < reserve  # SGLang's row was too short


def test_rows_without_speculation_keep_sglangs_headroom(monkeypatch):
    publish(monkeypatch, None, None)
    assert headroom() == allocation_sizing.get_req_to_token_extra_context_len() == 4
