"""scripts/gpu_serve_check.py's profiling step against a real server (CPU: the profiler records CPU activity only,
so the trace is found and read, with no GPU events): SGLang's /start_profile stops by itself after the steps asked
for and writes its trace where the script looks; the profiled requests are then aborted, not waited for."""

from __future__ import annotations

import pytest
from support.repo_scripts import load_script
from support.spec_e2e import TINY, TREE_SERVERS, shared_tree_server

from sglang_kimi.cli.demo import gsm8k_prompt, load_questions

pytestmark = pytest.mark.e2e
SERVERS = [TINY, TREE_SERVERS["dflash-tree-32"]]


def test_profile_reads_the_trace_of_the_profiled_steps(tiny_server, tmp_path):
    check = load_script("scripts/gpu_serve_check.py")
    prompts = [gsm8k_prompt(q) for q in load_questions()][:2]
    result = check.profile(tiny_server.base_url, prompts, tmp_path / "profile", 4, 2, check.PROFILE_MAX_NEW_TOKENS)
    assert result["gpu_events"] == 0 and result["steps"] == 4
    assert result["aborted"] == 2  # both still decoding when the trace was written
    assert (tmp_path / result["trace"]).is_file()
    assert result["phases"] == {}  # an autoregressive server: no tree step phases


PHASES = {"plan", "draft_forward", "draft_rank", "tree_build", "verify_prepare", "target_forward", "verify_accept",
          "draft_kv_append"}  # fmt: skip


def test_profile_of_the_tree_worker_has_each_step_phase(request, server_pool, tmp_path):
    server = shared_tree_server(server_pool, request, "dflash-tree-32")
    check = load_script("scripts/gpu_serve_check.py")
    prompts = [gsm8k_prompt(q) for q in load_questions()][:2]
    result = check.profile(server.base_url, prompts, tmp_path / "profile", 4, 2, check.PROFILE_MAX_NEW_TOKENS)
    phases = result["phases"]
    assert set(phases["host_ms_per_step"]) == PHASES
    assert 1 <= phases["steps"] <= 4  # the decode steps among the profiled ones
    assert all(ms > 0 for ms in phases["host_ms_per_step"].values())
    if phases["steps"] > 1:  # the phases happen within the step's period
        assert sum(phases["host_ms_per_step"].values()) <= phases["step_ms"] * 1.05
        assert 0 < phases["host_share_outside_target_forward"] < 1
