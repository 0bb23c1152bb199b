"""scripts/gpu_serve_check.py's profiling step against a real server (CPU: the profiler records CPU activity only,
so the trace is found and read, with no GPU events): SGLang's /start_profile stops by itself after the steps asked
for and writes its trace where the script looks; the profiled requests are then aborted, not waited for."""

from __future__ import annotations

import pytest
from support.repo_scripts import load_script

from sglang_kimi.demo import gsm8k_prompt, load_questions

pytestmark = pytest.mark.e2e


def test_profile_reads_the_trace_of_the_profiled_steps(tiny_server, tmp_path):
    check = load_script("scripts/gpu_serve_check.py")
    prompts = [gsm8k_prompt(q) for q in load_questions()][:2]
    result = check.profile(tiny_server.base_url, prompts, tmp_path / "profile", 4, 2, check.PROFILE_MAX_NEW_TOKENS)
    assert result["gpu_events"] == 0 and result["steps"] == 4
    assert result["aborted"] == 2  # both still decoding when the trace was written
    assert (tmp_path / result["trace"]).is_file()
