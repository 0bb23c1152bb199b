"""Each CPU rank on its own cores (``sglang_kimi/platform/cpu/thread_binding.py``): the core lists SGLang hands a rank,
and
the binding itself, in a child process (it changes the process's affinity and torch's thread count)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from sglang_kimi.platform.cpu import thread_binding
from sglang_kimi.platform.cpu.thread_binding import bind_rank_threads, parse_core_list


@pytest.mark.parametrize(
    "cores, expected",
    [("0", [0]), ("0-2", [0, 1, 2]), ("0-2,5", [0, 1, 2, 5]), ("4,0,2", [0, 2, 4]), ("3-3", [3]), ("1, 2", [1, 2])],
)
def test_core_lists_in_sglangs_form(cores, expected):
    assert parse_core_list(cores) == expected


@pytest.mark.parametrize("cores", ["", ",", "a-b"])
def test_bad_core_lists_are_errors(cores):
    with pytest.raises(ValueError):
        parse_core_list(cores)


BIND = """
import json, os, sys, threading, torch
from sglang_kimi.platform.cpu.thread_binding import bind_process_to_cores
torch.set_num_threads(len(os.sched_getaffinity(0)))
early = threading.Event()
threading.Thread(target=early.wait, daemon=True).start()  # a thread that exists before the binding
bind_process_to_cores(json.loads(sys.argv[1]))
late_cores = []
t = threading.Thread(target=lambda: late_cores.append(sorted(os.sched_getaffinity(0))))
t.start(); t.join()
threads = {task: sorted(os.sched_getaffinity(int(task))) for task in os.listdir("/proc/self/task")}
print(json.dumps({"threads": threads, "late": late_cores[0], "torch": torch.get_num_threads()}))
early.set()
"""


def test_binding_restricts_every_thread_and_sizes_torch():
    usable = sorted(os.sched_getaffinity(0))
    cores = usable[-1:]  # one core, as a rank of two on a two-core machine gets
    out = subprocess.run(
        [sys.executable, "-c", BIND, json.dumps(cores)], capture_output=True, text=True, check=True, timeout=120
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(result["threads"]) >= 2, result  # the main thread and the one started before the binding
    assert all(found == cores for found in result["threads"].values()), result
    assert result["late"] == cores  # threads started later inherit the rank's cores
    assert result["torch"] == len(cores)


def test_the_hook_leaves_alone_what_sglang_binds_and_a_lone_rank(monkeypatch):
    calls = []
    monkeypatch.setattr(thread_binding, "bind_process_to_cores", calls.append)
    monkeypatch.setattr(thread_binding, "_ranks", lambda: 2)
    monkeypatch.setattr(thread_binding, "_sglang_binds_itself", lambda: True)
    assert bind_rank_threads(None, local_omp_cpuid="0") is None
    assert calls == []
    monkeypatch.setattr(thread_binding, "_sglang_binds_itself", lambda: False)
    monkeypatch.setattr(thread_binding, "_ranks", lambda: 1)  # a lone rank shares its cores with no other
    bind_rank_threads(None, local_omp_cpuid="0")
    assert calls == []
    monkeypatch.setattr(thread_binding, "_ranks", lambda: 2)
    monkeypatch.setattr(thread_binding, "_sglang_binds_itself", lambda: False)
    bind_rank_threads(None, local_omp_cpuid=None)  # no core group (not a CPU rank)
    assert calls == []
    core = sorted(os.sched_getaffinity(0))[0]
    bind_rank_threads(None, local_omp_cpuid=str(core), dist_init_method="tcp://127.0.0.1:1")
    assert calls == [[core]]


def test_cores_the_process_may_not_use_are_not_bound(monkeypatch, caplog):
    calls = []
    monkeypatch.setattr(thread_binding, "bind_process_to_cores", calls.append)
    monkeypatch.setattr(thread_binding, "_sglang_binds_itself", lambda: False)
    monkeypatch.setattr(thread_binding, "_ranks", lambda: 2)
    outside = max(os.sched_getaffinity(0)) + 1
    with caplog.at_level("WARNING", logger="sglang_kimi"):
        bind_rank_threads(None, local_omp_cpuid=f"{outside}")
    assert calls == []
    assert "are not all usable by the process" in caplog.text
