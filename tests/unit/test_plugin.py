"""The registration table: every entry resolves, failures are recorded, registration is idempotent."""

import importlib
import json
import logging
import subprocess
import sys

import pytest

from sglang_kimi import SUPPORTED_SGLANG, plugin
from sglang_kimi.launcher.server import sglang_env
from sglang_kimi.platform import capabilities
from sglang_kimi.plugin import CUDA_STAND_IN, REGISTRATIONS
from sglang_kimi.version import version_in_range

# Entries that only act on a GPU machine: on this CPU they report "skipped: <why>".
GPU_ONLY_ENTRIES = {"moe-verify-configs", "aiter-verify-env"} | {
    e.name for e in REGISTRATIONS if e.when == CUDA_STAND_IN
}


def test_table_entries_are_unique_and_resolve():
    names = [e.name for e in plugin.REGISTRATIONS]
    assert len(names) == len(set(names))
    for entry in plugin.REGISTRATIONS:
        module_name, _, attr = entry.install.partition(":")
        assert module_name.startswith("sglang_kimi."), entry
        assert callable(getattr(importlib.import_module(module_name), attr)), entry
        assert entry.target.startswith(("sglang.", "os.environ", "sys.excepthook")), entry
        assert entry.when in (plugin.ALWAYS, plugin.CPU_ONLY, plugin.CUDA_STAND_IN)
        assert entry.why


@pytest.mark.parametrize(
    "version, expected",
    [("0.5.23", True), ("0.5.22", False), ("0.5.24", False), ("0.5.23.post1", True), ("0.6.0", False)],
)
def test_version_range(version, expected):
    assert version_in_range(version, ("0.5.23", "0.5.23")) is expected


def test_untested_sglang_version_logs_one_line(monkeypatch, caplog):
    import sglang.version

    monkeypatch.setattr(sglang.version, "__version__", "0.4.0")
    with caplog.at_level(logging.WARNING, logger="sglang_kimi"):
        reason = plugin.check_sglang_version("sglang.version.__version__")
    assert "0.4.0" in reason and SUPPORTED_SGLANG[0] in reason
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "0.4.0" in warnings[0].getMessage()


def test_failed_entry_is_recorded_not_raised(monkeypatch):
    broken = plugin.Entry("broken", "sglang.nowhere", "sglang_kimi.plugin:_no_such_function", "test entry")
    monkeypatch.setattr(plugin, "REGISTRATIONS", (broken,))
    monkeypatch.setattr(plugin, "STATUS", {})
    monkeypatch.setattr(plugin, "_registered", False)
    plugin.register_all()
    assert plugin.STATUS["broken"].startswith("failed: AttributeError")
    state = plugin.registration_state()
    assert state["failed"] == ["broken"]


def test_cpu_only_entries_skip_without_cpu_engine(monkeypatch):
    monkeypatch.delenv("SGLANG_USE_CPU_ENGINE", raising=False)
    cpu_entries = [e for e in plugin.REGISTRATIONS if e.when == plugin.CPU_ONLY]
    assert cpu_entries
    assert all(plugin.skip_reason(e) == "only when cpu" for e in cpu_entries)
    monkeypatch.setenv("SGLANG_USE_CPU_ENGINE", "1")
    assert not any(plugin.skip_reason(e) for e in cpu_entries if e.since is None)


def test_entries_newer_than_the_installed_sglang_skip(monkeypatch):
    import sglang.version

    newer = [e for e in plugin.REGISTRATIONS if e.since is not None]
    assert newer
    monkeypatch.setattr(sglang.version, "__version__", "0.5.21")
    monkeypatch.setattr(plugin, "cuda_without_sgl_kernel", lambda: True)  # the CUDA stand-ins' machine
    monkeypatch.setenv("SGLANG_USE_CPU_ENGINE", "1")  # and a CPU engine's process, for the CPU-only entries
    for entry in newer:
        assert plugin.skip_reason(entry) == f"needs SGLang {'.'.join(map(str, entry.since))} or later"
    monkeypatch.setattr(sglang.version, "__version__", ".".join(map(str, max(e.since for e in newer))) + ".post1")
    assert not any(plugin.skip_reason(e) for e in newer if e.when == plugin.ALWAYS)


PROBE_TWICE = """
import json
from sglang.srt.plugins import load_plugins
from sglang.srt.plugins.hook_registry import HookRegistry
import sglang_kimi
from sglang_kimi import hooks as hooks_module, plugin
load_plugins()
sglang_kimi.register()  # a second call in the same process must change nothing
HookRegistry.apply_hooks()
hooks = {t: len(HookRegistry._hooks[t]) for t in hooks_module.registered_targets()}
# distinct hooks per target, the plugin's AROUND hooks on a target nested into one
ours = {t: len({h.fn for h in hooks_module.HOOKS if h.target == t and h.hook_type != "AROUND"})
        + any(h.target == t and h.hook_type == "AROUND" for h in hooks_module.HOOKS) for t in hooks}
print("RESULT=" + json.dumps({"state": plugin.registration_state(), "hooks": hooks, "ours": ours}))
"""

PROBE_UNAPPLIED = """
import json
from sglang.srt.plugins.hook_registry import HookRegistry
from sglang_kimi import plugin
plugin.REGISTRATIONS = plugin.REGISTRATIONS + (
    plugin.Entry("ghost", "sglang.srt.nothing_here.fn", "sglang_kimi.plugin:_install_ghost", "test"),)
from sglang_kimi.hooks import hook
plugin._install_ghost = lambda target: hook(target, lambda r, *a, **k: r)
plugin.cuda_without_sgl_kernel = lambda: True  # and as on a CUDA machine with the plugin's sgl_kernel shim
plugin.register_all()
HookRegistry.apply_hooks()
try:
    import sglang.srt.layers.dual_gemm as dual_gemm  # SGLang 0.5.22+
    mode = dual_gemm.DualGemm._select_mode(None, None, 256)
except ImportError:
    mode = "no dual GEMM in this SGLang"
from sglang.srt.layers.quantization.unquant import UnquantizedFusedMoEMethod
class Moe:  # the forced torch backend's method, on an object whose CUDA path records its call
    forward_native = UnquantizedFusedMoEMethod.forward_native
    def forward_cuda(self, layer, dispatch_output):
        return ("cuda", layer, dispatch_output)
moe = list(Moe().forward_native("layer", "dispatch"))
print("RESULT=" + json.dumps({"state": plugin.registration_state(), "dual_gemm_mode": mode, "moe": moe}))
"""


def _start_probe(code: str, **extra_env: str) -> subprocess.Popen:
    env, _ = sglang_env(cpu=True)
    env.update(extra_env)
    return subprocess.Popen(
        [sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _probe_result(run: subprocess.Popen) -> dict:
    try:
        stdout, stderr = run.communicate(timeout=300)
    finally:
        run.kill()
    lines = [line for line in stdout.splitlines() if line.startswith("RESULT=")]
    assert lines, stderr[-3000:]
    return json.loads(lines[0][len("RESULT=") :])


def _run_probe(code: str, **extra_env: str) -> dict:
    return _probe_result(_start_probe(code, **extra_env))


@pytest.fixture(scope="module")
def probes_twice() -> dict:
    """PROBE_TWICE with the hardening group on (the default) and off: two SGLang processes, side by side."""
    on, off = _start_probe(PROBE_TWICE), _start_probe(PROBE_TWICE, SGLANG_KIMI_HARDENING="0")
    return {"on": _probe_result(on), "off": _probe_result(off)}


def test_register_is_idempotent_through_sglang_loader(probes_twice):
    result = probes_twice["on"]
    state = result["state"]
    assert state["failed"] == []
    assert set(state["registrations"]) == {e.name for e in plugin.REGISTRATIONS}
    newer = {e.name for e in plugin.REGISTRATIONS if not plugin.installed_sglang_has(e)}  # an older SGLang's run
    assert {n for n, v in state["registrations"].items() if v != "ok"} == GPU_ONLY_ENTRIES | newer, state
    # each hook once in SGLang's registry, however often register() ran (a target may carry two of the plugin's)
    assert result["hooks"] and result["hooks"] == result["ours"], result


@pytest.fixture(scope="module")
def unapplied_probe():
    """One SGLang process: a hook on a target SGLang lacks, and the CUDA stand-ins forced on."""
    return _run_probe(PROBE_UNAPPLIED)


def test_hook_sglang_could_not_apply_is_reported_failed(unapplied_probe):
    assert "ghost" in unapplied_probe["state"]["failed"]
    assert "did not apply" in unapplied_probe["state"]["registrations"]["ghost"]


def test_hook_entries_name_the_target_their_install_hooks():
    from sglang_kimi.kernels.moe_configs import HOOK_TARGET

    targets = {e.name: e.target for e in plugin.REGISTRATIONS}
    assert targets["moe-verify-configs"] == HOOK_TARGET


def test_cuda_stand_in_entries_apply_only_on_cuda_without_sgl_kernel(monkeypatch):
    entries = [e for e in plugin.REGISTRATIONS if e.when == plugin.CUDA_STAND_IN]
    assert entries
    monkeypatch.setattr(plugin, "cuda_without_sgl_kernel", lambda: False)
    assert all(plugin.skip_reason(e) == "only cuda without sgl_kernel" for e in entries)
    monkeypatch.setattr(plugin, "cuda_without_sgl_kernel", lambda: True)
    assert not any(plugin.skip_reason(e) for e in entries if plugin.installed_sglang_has(e))


def test_no_cuda_means_no_stand_in(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert capabilities.cuda_without_sgl_kernel() is False


def test_cuda_stand_in_entries_apply_through_sglang_hooks(unapplied_probe):
    """Each stand-in's targets exist in the installed SGLang and its hook registry applies them (a hook on a
    lazily imported name, for one, cannot be applied: SGLang resolves it, importing what is missing)."""
    result = unapplied_probe
    registrations = result["state"]["registrations"]
    entries = [e for e in plugin.REGISTRATIONS if e.when == plugin.CUDA_STAND_IN]
    expected = {
        e.name: "ok"
        if plugin.installed_sglang_has(e)
        else f"skipped: needs SGLang {'.'.join(map(str, e.since))} or later"
        for e in entries
    }
    assert {n: registrations[n] for n in expected} == expected, result
    dual_gemm = next(e for e in entries if e.name == "cuda-stand-in-dual-gemm")
    assert result["dual_gemm_mode"] == (
        None if plugin.installed_sglang_has(dual_gemm) else "no dual GEMM in this SGLang"
    )
    assert result["moe"] == ["cuda", "layer", "dispatch"]  # the MoE's CUDA path, not the native loop


def test_hardening_off_leaves_sglang_s_api_untouched_and_speculation_hardened(probes_twice):
    """SGLANG_KIMI_HARDENING=0: no hardening entry hooks anything (SGLang answers its API as it would), every other
    entry, the speculative-safety fixes among them, registers as with the group on."""
    on, off = probes_twice["on"], probes_twice["off"]
    hardening = {e.name for e in plugin.AREAS["hardening"]}
    assert len(hardening) >= 15
    assert off["state"]["hardening"].startswith("off") and on["state"]["hardening"] == "on"
    for name, outcome in off["state"]["registrations"].items():
        if name in hardening:
            assert outcome == "skipped: SGLANG_KIMI_HARDENING=0 leaves SGLang's own API behaviour", name
        else:
            assert outcome == on["state"]["registrations"][name], name
    hardening_targets = {n for e in plugin.AREAS["hardening"] for n in (e.target, *e.hooks)}
    hooked = hardening_targets & set(on["hooks"])  # on: the group's hooks (one entry replaces an app handler)
    assert len(hooked) >= 30
    assert not hardening_targets & set(off["hooks"])  # off: none is hooked
    assert set(off["hooks"]) == set(on["hooks"]) - hardening_targets


@pytest.mark.parametrize("value, on", [(None, True), ("1", True), ("0", False)])
def test_hardening_switch(monkeypatch, value, on):
    if value is None:
        monkeypatch.delenv("SGLANG_KIMI_HARDENING", raising=False)
    else:
        monkeypatch.setenv("SGLANG_KIMI_HARDENING", value)
    assert plugin.hardening_on() is on
    entry = plugin.AREAS["hardening"][0]
    assert (plugin.skip_reason(entry) is None) is on
    assert all(plugin.skip_reason(e) is None for e in plugin.AREAS["speculative"] if e.since is None)
