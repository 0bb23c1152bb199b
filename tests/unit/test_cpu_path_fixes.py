"""The hooks around SGLang's CPU speculative bugs (``sglang_kimi/platform/cpu/cpu_path_fixes.py``) and the ``kimi_cpu``
registration,
through SGLang's own argument resolution where they act on it.

SGLang's modules need the CPU import shims, so the tests run in a child process with ``SGLANG_USE_CPU_ENGINE=1``
and the shims on ``PYTHONPATH`` (shared with the session's other such files: ``cpu_sglang_child``); in the
parent, one test fails with the child's report of them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from sglang.srt.speculative.eagle_utils import TreeMaskMode
from support.drafter_checkpoints import write_dflash
from support.servers import cpu_args

from sglang_kimi.assets import TINY_MODEL
from sglang_kimi.platform.cpu import cpu_path_fixes
from sglang_kimi.speculative import draft_input_embeds

pytestmark = pytest.mark.cpu_sglang_child

# SGLang's argument resolution, in a fresh process (plugins loaded or not), as `sglang.launch_server` runs it.
RESOLVE = """
import json, sys
if sys.argv[2] == "plugins":
    from sglang.srt.plugins import load_plugins
    load_plugins()
from sglang.srt.server_args import prepare_server_args
from sglang.srt.arg_groups.overrides import resolved_view
for argv in json.loads(sys.argv[1]):
    try:
        args = prepare_server_args(argv)
        args.resolve_once()
    except Exception as exc:
        print("ERROR=" + f"{type(exc).__name__}: {exc}".replace(chr(10), " "))
    else:
        view = resolved_view(args)
        print("RESOLVED=" + json.dumps({k: getattr(view, k) for k in (
            "speculative_draft_attention_backend", "speculative_num_draft_tokens", "speculative_eagle_topk")}))
"""

CPU_ARGS = cpu_args() + ["--model-path", str(TINY_MODEL)]


def resolve(argvs: list[list[str]], plugins: bool) -> list[str]:
    """One outcome line per argv: ``ERROR=<exception>`` or ``RESOLVED=<json>``."""
    proc = subprocess.run(
        [sys.executable, "-c", RESOLVE, json.dumps([CPU_ARGS + a for a in argvs]), "plugins" if plugins else ""],
        capture_output=True,
        text=True,
        timeout=900,
        env=os.environ.copy(),
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith(("ERROR=", "RESOLVED="))]
    assert len(lines) == len(argvs), proc.stdout[-2000:] + proc.stderr[-4000:]
    return lines


def test_dflash_is_accepted_on_cpu_with_its_other_validation(tmp_path):
    draft = write_dflash(tmp_path / "dflash", block_size=4)
    dflash = ["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", str(draft)]
    (refused,) = resolve([dflash + ["--attention-backend", "torch_native"]], plugins=False)
    assert "DFLASH speculative decoding is not supported by CpuSRTPlatform on device 'cpu'" in refused, refused
    accepted, window = resolve(
        [
            dflash + ["--attention-backend", "kimi_cpu"],
            # the rest of _handle_dflash still runs: a draft window shorter than the block is refused
            dflash + ["--attention-backend", "kimi_cpu", "--speculative-draft-window-size", "2"],
        ],
        plugins=True,
    )
    resolved = json.loads(accepted[len("RESOLVED=") :])
    assert resolved["speculative_draft_attention_backend"] == "kimi_cpu"
    assert resolved["speculative_num_draft_tokens"] == 4 and resolved["speculative_eagle_topk"] == 1
    assert window.startswith("ERROR=") and "--speculative-draft-window-size must be >=" in window, window


def test_tree_mask_layout_follows_the_verify_backend(monkeypatch):
    monkeypatch.setattr(cpu_path_fixes, "_verify_attention_backend", lambda: "kimi_cpu")
    assert cpu_path_fixes._tree_mask_mode_for_verify_backend(lambda: "upstream") == TreeMaskMode.QLEN_ONLY
    monkeypatch.setattr(cpu_path_fixes, "_verify_attention_backend", lambda: "intel_amx")
    assert cpu_path_fixes._tree_mask_mode_for_verify_backend(lambda: "upstream") == TreeMaskMode.QLEN_ONLY
    monkeypatch.setattr(cpu_path_fixes, "_verify_attention_backend", lambda: "triton")
    assert cpu_path_fixes._tree_mask_mode_for_verify_backend(lambda: "upstream") == TreeMaskMode.FULL_MASK
    import sglang.srt.utils as utils

    monkeypatch.setattr(utils, "is_cpu", lambda: False)  # other devices: SGLang's own choice
    assert cpu_path_fixes._tree_mask_mode_for_verify_backend(lambda: "upstream") == "upstream"


def test_record_stream_is_skipped_for_cpu_tensors_only_while_the_worker_runs():
    stream = torch.get_device_module("cpu").current_stream()
    with pytest.raises((RuntimeError, TypeError)):
        torch.zeros(2).record_stream(stream)  # upstream on CPU

    def forward(worker, batch):
        batch.record_stream(stream)
        return "forwarded"

    cpu_worker = SimpleNamespace(device="cpu")
    forwarded = cpu_path_fixes._dflash_forward_without_cpu_record_stream(forward, cpu_worker, torch.zeros(2))
    assert forwarded == "forwarded"
    assert "record_stream" not in torch.Tensor.__dict__  # restored
    with pytest.raises((RuntimeError, TypeError)):
        torch.zeros(2).record_stream(stream)
    gpu_worker = SimpleNamespace(device="cuda:0")  # any other device runs the worker untouched
    with pytest.raises((RuntimeError, TypeError)):
        cpu_path_fixes._dflash_forward_without_cpu_record_stream(forward, gpu_worker, torch.zeros(2))


def test_input_embeds_reach_the_model_in_its_dtype():
    from sglang.srt.model_executor.model_runner import ModelRunner

    embeds = torch.randn(5, 8, dtype=torch.float32) * 1e-3 + 1
    replace = torch.randn(2, 8, dtype=torch.float32)
    batch = SimpleNamespace(
        input_embeds=embeds,
        replace_embeds=replace,
        replace_positions=torch.tensor([1, 3]),
    )
    runner = SimpleNamespace(
        model_config=SimpleNamespace(dtype=torch.float32), _pp_kwargs=lambda pp: {}, is_generation=True, model=None
    )
    upstream = (
        ModelRunner._extend_forward_kwargs.__wrapped__
        if hasattr(ModelRunner._extend_forward_kwargs, "__wrapped__")
        else ModelRunner._extend_forward_kwargs
    )
    bf16 = upstream(runner, batch, None)["input_embeds"]
    assert bf16.dtype == torch.bfloat16  # SGLang's cast
    kwargs = draft_input_embeds._extend_kwargs_in_model_dtype(upstream, runner, batch, None)
    expected = embeds.clone()
    expected[[1, 3]] = replace
    assert kwargs["input_embeds"].dtype == torch.float32 and torch.equal(kwargs["input_embeds"], expected)
    runner.model_config.dtype = torch.bfloat16  # a bf16 model: exactly SGLang's result
    assert torch.equal(
        draft_input_embeds._extend_kwargs_in_model_dtype(upstream, runner, batch, None)["input_embeds"], bf16
    )
