"""The output budget of a speculative request (``sglang_kimi/speculative/kv_budget.py``): room for the decode
reserve."""

from types import SimpleNamespace

from sglang_kimi.speculative.kv_budget import speculative_output_budget, token_capacity


def test_budget_leaves_the_reserve_past_the_last_committed_token():
    # one page of slack and the reserve past paged(prompt) + output, as SGLang's own clip leaves one slot
    assert speculative_output_budget(600, 500, 1, 34) == 600 - 500 - 1 - 34
    assert speculative_output_budget(1000, 500, 64, 16) == 1000 - 512 - 64 - 16  # the prompt rounded up to pages
    # no room for a decode step: the token the prefill computes is still served
    assert speculative_output_budget(600, 590, 1, 34) == 1


def test_capacity_counts_sharded_kv_as_sglang_does():
    scheduler = SimpleNamespace(max_total_num_tokens=1000, page_size=16, kv_shard_widening=4)
    assert token_capacity(scheduler) == 4000 - 16 * 3
    assert token_capacity(SimpleNamespace(max_total_num_tokens=1000, page_size=1, kv_shard_widening=1)) == 1000
