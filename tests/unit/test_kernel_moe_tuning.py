"""MoE config tables and SGLang's config lookup hook, on CPU with fake device names.

SGLang's own ``get_config_file_name`` is taken from its source file (not imported: importing that module needs
the full SGLang dependency set) and run with a fake ``get_device_name``, so the naming tested here is SGLang's.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import typing
from pathlib import Path

import pytest
from support.moe_tables import derive_starting_tables

from sglang_kimi.kernels import active_overrides
from sglang_kimi.kernels import moe_configs as mt
from sglang_kimi.kernels import moe_tuner as tuner

SGLANG_ROOT = Path(importlib.util.find_spec("sglang").submodule_search_locations[0])
SGLANG_CONFIG_PY = SGLANG_ROOT / "srt/layers/moe/moe_runner/triton_utils/fused_moe_triton_config.py"
SGLANG_CONFIGS = SGLANG_CONFIG_PY.parent / "configs"


def sglang_file_name_fn(device_name: str):
    """SGLang's get_config_file_name, compiled from its source, with get_device_name() -> device_name."""
    tree = ast.parse(SGLANG_CONFIG_PY.read_text())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "get_config_file_name")
    namespace = {"Optional": typing.Optional, "get_device_name": lambda: device_name}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), str(SGLANG_CONFIG_PY), "exec"), namespace)
    return namespace["get_config_file_name"]


@pytest.mark.parametrize("device", ["NVIDIA H200", "AMD Instinct MI300X"])
@pytest.mark.parametrize(
    "dtype,block,pcq,down",
    [
        (None, None, False, False),
        ("fp8_w8a8", [128, 128], False, False),
        ("fp8_w8a8", [128, 128], False, True),
        ("int4_w4a16", [0, 32], False, False),
        ("fp8_w8a8", [0, 0], True, False),
    ],
)
def test_file_names_are_sglangs(device, dtype, block, pcq, down):
    sglang_name = sglang_file_name_fn(device)(384, 256, dtype, block, pcq, down_moe=down)
    ours = mt.config_file_name(384, 256, device, dtype, block, pcq, down)
    assert ours == sglang_name
    parsed = mt.parse_config_file_name(ours)
    assert parsed["E"] == 384 and parsed["N"] == 256 and parsed["device"] == device.replace(" ", "_")
    assert parsed["dtype"] == dtype and parsed["down_moe"] == down and parsed["per_channel_quant"] == pcq
    assert parsed["block_shape"] == (tuple(block) if block and all(block) else None)


def test_shipped_tables_are_verbatim_copies_of_sglang_tables_for_missing_keys():
    provenance = json.loads((mt.SHIPPED_DIR / mt.PROVENANCE_FILE).read_text())
    shipped = sorted(p.name for p in mt.SHIPPED_DIR.glob("*.json") if p.name != mt.PROVENANCE_FILE)
    assert shipped and sorted(provenance) == shipped
    sglang_names = {p.name for p in SGLANG_CONFIGS.glob("triton_*/*.json")}
    for name in shipped:
        info = mt.parse_config_file_name(name)
        assert info is not None and info["device"] in mt.TARGET_DEVICES
        assert info["E"] in (384, 385) and info["N"] in (128, 256, 512)
        assert name not in sglang_names, f"{name} would shadow a table SGLang ships"
        entry = provenance[name]
        assert "not tuned" in entry["status"]
        source = SGLANG_ROOT.parent / entry["copied_from"]
        assert source.is_file()
        src_info = mt.parse_config_file_name(source.name)
        assert src_info["device"] == info["device"] and src_info["dtype"] == info["dtype"]
        assert src_info["block_shape"] == info["block_shape"]
        assert mt.read_table(mt.SHIPPED_DIR / name) == mt.read_table(source)
        for config in mt.read_table(mt.SHIPPED_DIR / name).values():
            assert {"BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M"} <= set(config)


def test_derive_starting_tables_reproduces_the_shipped_files(tmp_path):
    provenance = derive_starting_tables(SGLANG_CONFIGS, tmp_path)
    for name in provenance:
        assert (tmp_path / name).read_text() == (mt.SHIPPED_DIR / name).read_text()
    assert json.loads((tmp_path / mt.PROVENANCE_FILE).read_text()) == json.loads(
        (mt.SHIPPED_DIR / mt.PROVENANCE_FILE).read_text()
    )


class FakeOriginal:
    """Stands in for SGLang's get_moe_configs: records calls, returns a marker."""

    def __init__(self):
        self.calls = []

    def __call__(self, *args, **kwargs):
        self.calls.append((args, kwargs))
        return {"sglang": "original"}


@pytest.fixture
def on_device(monkeypatch, tmp_path):
    """Pretend SGLang runs on an H200: file names from SGLang's function with that device name; no user dir."""

    def use(device_name="NVIDIA H200"):
        fn = sglang_file_name_fn(device_name)
        monkeypatch.setattr(
            mt,
            "_sglang_config_file_name",
            lambda E, N, dtype, block, pcq, down: fn(E, N, dtype, block, pcq, down_moe=down),
        )
        monkeypatch.setattr(mt, "_deterministic_inference", lambda: False)
        monkeypatch.setenv(mt.USER_DIR_ENV, str(tmp_path / "user"))
        mt._cached_table.cache_clear()
        mt.SERVED.clear()
        return tmp_path / "user"

    yield use
    mt._cached_table.cache_clear()
    mt.SERVED.clear()


def test_hook_serves_the_plugin_table_for_a_matching_device_and_shape(on_device):
    on_device("NVIDIA H200")
    original = FakeOriginal()
    table = mt.around_get_moe_configs(original, 384, 256, "fp8_w8a8", 128, 128)
    name = "E=384,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128].json"
    assert table == mt.read_table(mt.SHIPPED_DIR / name)
    assert all(isinstance(m, int) for m in table)
    assert original.calls == []
    assert name in mt.SERVED


@pytest.mark.parametrize(
    "device,args,kwargs",
    [
        ("NVIDIA H200", (384, 96, "fp8_w8a8", 128, 128), {}),  # a shape with no plugin table
        ("NVIDIA H200", (384, 256, "fp8_w8a8", 128, 128), {"down_moe": True}),  # down tables: none shipped
        ("NVIDIA H200", (384, 128, "fp8_w8a8", 128, 128), {}),  # SGLang ships this key itself
        ("NVIDIA GeForce RTX 4090", (384, 256, "fp8_w8a8", 128, 128), {}),  # a device we ship nothing for
        ("NVIDIA H200", (384, 256, "int8_w8a8", 128, 128), {}),  # another dtype
    ],
)
def test_hook_falls_back_to_sglang_with_the_same_arguments(on_device, device, args, kwargs):
    on_device(device)
    original = FakeOriginal()
    assert mt.around_get_moe_configs(original, *args, **kwargs) == {"sglang": "original"}
    E, N, dtype, bn, bk = args
    assert original.calls == [
        ((E, N, dtype, bn, bk), {"per_channel_quant": False, "down_moe": kwargs.get("down_moe", False)})
    ]
    assert mt.SERVED == {}


def test_user_tables_take_precedence(on_device):
    user_dir = on_device("NVIDIA H200")
    user_dir.mkdir()
    name = "E=384,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128].json"
    tuned = {"8": {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1}}
    (user_dir / name).write_text(json.dumps(tuned))
    assert mt.around_get_moe_configs(FakeOriginal(), 384, 256, "fp8_w8a8", 128, 128) == {8: tuned["8"]}
    assert mt.SERVED[name] == str(user_dir / name)


def test_hook_defers_to_sglang_in_deterministic_mode(on_device, monkeypatch):
    on_device("NVIDIA H200")
    monkeypatch.setattr(mt, "_deterministic_inference", lambda: True)
    original = FakeOriginal()
    assert mt.around_get_moe_configs(original, 384, 256, "fp8_w8a8", 128, 128) == {"sglang": "original"}


def test_hook_as_sglangs_registry_wraps_it(on_device):
    """The AROUND contract as SGLang's HookRegistry applies it: hook(original, *args, **kwargs)."""
    from sglang.srt.plugins.hook_registry import HookType, _wrap_fn

    on_device("NVIDIA H200")
    original = FakeOriginal()
    wrapped = _wrap_fn(original, mt.around_get_moe_configs, HookType.AROUND)
    name = "E=384,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128].json"
    assert wrapped(384, 256, "fp8_w8a8", 128, 128) == mt.read_table(mt.SHIPPED_DIR / name)
    assert wrapped(384, 96, "fp8_w8a8", 128, 128, per_channel_quant=False, down_moe=False) == {"sglang": "original"}
    assert len(original.calls) == 1
    assert wrapped.__wrapped__ is original


def test_install_skips_without_gpu_and_registers_around_hook_on_a_device(monkeypatch):
    monkeypatch.setattr(mt, "_current_device_name", lambda: None)
    assert "no GPU" in mt.install_moe_overrides(mt.HOOK_TARGET)
    registered = []
    import sglang_kimi.hooks as hooks

    monkeypatch.setattr(hooks, "hook", lambda target, fn, kind: registered.append((target, fn, kind)))
    monkeypatch.setattr(mt, "_current_device_name", lambda: "NVIDIA_GeForce_RTX_4090")
    assert "no plugin MoE tables" in mt.install_moe_overrides(mt.HOOK_TARGET)
    assert registered == []
    monkeypatch.setattr(mt, "_current_device_name", lambda: "NVIDIA_H100_80GB_HBM3")
    assert mt.install_moe_overrides(mt.HOOK_TARGET) is None
    assert registered == [(mt.HOOK_TARGET, mt.around_get_moe_configs, "AROUND")]


def test_override_state_lists_device_tables(monkeypatch):
    monkeypatch.setattr(mt, "_current_device_name", lambda: "AMD_Instinct_MI300X")
    rows = mt.moe_override_state()
    assert rows and all(r["kind"] == "moe-config" for r in rows)
    assert all("MI300X" in r["key"] and r["active"] is False for r in rows)
    monkeypatch.setattr(mt, "_current_device_name", lambda: None)
    assert mt.moe_override_state() == [{"kind": "moe-config", "active": False, "why": "no GPU"}]
    kinds = {row["kind"] for row in active_overrides()}
    assert kinds == {"moe-config", "aiter-env"}


def test_verify_m_values_and_search_space():
    assert mt.verify_m_values((1, 2), (2, 4)) == [2, 4, 8]
    assert 1024 in mt.verify_m_values() and 2 in mt.verify_m_values()
    space = tuner.search_space("fp8_w8a8", (128, 128), is_rocm=False)
    assert space and all(c["BLOCK_SIZE_K"] % 128 == 0 for c in space)
    rocm = tuner.search_space("bf16", None, is_rocm=True)
    assert all(c["num_stages"] == 2 and c["waves_per_eu"] == 0 for c in rocm)


def test_tune_moe_cli_fails_clearly_without_gpu(tmp_path, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # also on a machine that has one
    parser = tuner.add_tune_moe_args(argparse.ArgumentParser())
    args = parser.parse_args(["--tp", "8", "--output-dir", str(tmp_path)])
    assert args.dtype == "fp8_w8a8" and args.experts == 384
    with pytest.raises(tuner.TuneError, match="needs a CUDA or ROCm GPU"):
        tuner.run_tune_moe(args)
    assert list(tmp_path.iterdir()) == []


EXEC_CONTEXT_CHECK = """
import torch
from sglang.srt.runtime_context import get_context, get_exec, get_parallel
from sglang_kimi.kernels import moe_tuner as tuner
assert not get_context().is_config_namespace_published("exec")
for _ in range(2):  # set up and torn down cleanly, twice in one process
    with tuner.sglang_exec_context():
        assert get_exec().moe.enable_fused_moe_sum_all_reduce in (False, True)
        assert get_parallel().tp_group.world_size == 1
        with tuner.sglang_exec_context():  # nested: the outer context stays
            assert get_parallel().tp_group.world_size == 1
        assert get_context().is_config_namespace_published("exec")
    assert not get_context().is_config_namespace_published("exec")
    assert not torch.distributed.is_initialized()
print("OK")
"""


def test_exec_context_gives_sglang_fused_moe_what_it_reads_outside_a_server():
    """SGLang 0.5.23's fused MoE reads the published exec config and the tensor-parallel group; a tuning or
    benchmark process has neither until the context provides them (in a fresh process: SGLang's serving modules
    import here with the CPU shims)."""
    import os
    import subprocess
    import sys

    from sglang_kimi.launcher.server import SHIMS_DIR

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(SHIMS_DIR), os.environ.get("PYTHONPATH")]))}
    env.pop("TRITON_INTERPRET", None)
    proc = subprocess.run(
        [sys.executable, "-c", EXEC_CONTEXT_CHECK], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), proc.stderr[-3000:]
