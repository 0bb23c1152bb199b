"""``sglang-kimi doctor``: versions, device, what the plugin registers, problems found."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, entry_points, version
from pathlib import Path

from sglang_kimi.assets import TINY_MODEL
from sglang_kimi.launcher.server import SGLANG_INSTALL_HINT, has_gpu, sglang_env
from sglang_kimi.version import SUPPORTED_SGLANG, __version__

PACKAGES = ("sglang", "torch", "triton", "transformers", "amd-aiter", "lm-eval")
STATE_MARK = "SGLANG_KIMI_STATE="

# Runs in a fresh interpreter with the environment `sglang-kimi serve` gives SGLang: SGLang's own plugin loader,
# then the plugin's record of what it registered and whether SGLang applied each hook; with "strict" also the
# audit of every hook target, hook signature and serving module against this SGLang (sglang_kimi/cli/audit.py).
PROBE = f"""
import json, sys
from sglang.srt.plugins import GENERAL_PLUGINS_GROUP, load_plugins
load_plugins()
from sglang_kimi.plugin import registration_state
from sglang_kimi.kernels import active_overrides
report = {{
    "plugin": registration_state(), "kernel_overrides": active_overrides(), "plugin_group": GENERAL_PLUGINS_GROUP
}}
if "strict" in sys.argv[1:]:
    from sglang_kimi.cli.audit import audit
    report["audit"] = audit()
print({STATE_MARK!r} + json.dumps(report))
"""


def package_versions() -> dict[str, str | None]:
    versions = {"sglang-kimi": __version__}
    for name in PACKAGES:
        try:
            versions[name] = version(name)
        except PackageNotFoundError:
            versions[name] = None
    return versions


def device_description() -> str:
    import torch

    if not has_gpu():
        return "cpu (no CUDA or ROCm device: `sglang-kimi serve` applies the CPU settings)"
    backend = f"ROCm {torch.version.hip}" if torch.version.hip else f"CUDA {torch.version.cuda}"
    names = sorted({torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())})
    return f"{torch.cuda.device_count()} x {', '.join(names)} ({backend})"


def probe_registration(cpu: bool, strict: bool = False) -> tuple[dict | None, str]:
    """Load the plugins in a fresh SGLang process; returns the plugin's state, or None and the error output."""
    env, _ = sglang_env(cpu)
    argv = [sys.executable, "-c", PROBE] + (["strict"] if strict else [])
    result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    for line in result.stdout.splitlines():
        if line.startswith(STATE_MARK):
            return json.loads(line[len(STATE_MARK) :]), ""
    return None, (result.stderr or result.stdout)[-2000:]


# ---------------------------------------------------------------------------------------------------------------
# What text-only serving (--language-model-only) saves: read from the safetensors headers, no weight is loaded.

VISION_PREFIXES = ("vision_tower.", "mm_projector.")
_DTYPE_BYTES = {
    "F64": 8,
    "I64": 8,
    "U64": 8,
    "F32": 4,
    "I32": 4,
    "U32": 4,
    "F16": 2,
    "BF16": 2,
    "I16": 2,
    "U16": 2,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "F8_E8M0": 1,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
}


def safetensors_header(path: Path) -> dict:
    """The JSON header of a .safetensors file (8-byte little-endian length, then the header): names, dtypes,
    shapes and byte offsets of every tensor, without reading any tensor data."""
    with open(path, "rb") as f:
        length = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(length))
    header.pop("__metadata__", None)
    return header


def checkpoint_tensor_bytes(model_path: str | Path) -> dict[str, int]:
    """Bytes of every tensor of a local checkpoint (single file or sharded with model.safetensors.index.json)."""
    path = Path(model_path).expanduser()
    if not path.is_dir():
        raise FileNotFoundError(f"{model_path} is not a local checkpoint folder: pass --model-path with one")
    index = path / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.exists() else None
    files = [path / f for f in files] if files else sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{model_path} has no *.safetensors files")
    sizes: dict[str, int] = {}
    for file in files:
        for name, info in safetensors_header(file).items():
            start, end = info["data_offsets"]
            sizes[name] = end - start
    return sizes


def text_only_savings(model_path: str | Path) -> dict:
    """What ``--language-model-only`` leaves out of memory for a Kimi-K2.5/K2.6 checkpoint: the MoonViT tower and
    the projector (``vision_tower.*``, ``mm_projector.*``), from the checkpoint's headers."""
    sizes = checkpoint_tensor_bytes(model_path)
    tower = {n: b for n, b in sizes.items() if n.startswith(VISION_PREFIXES[0])}
    projector = {n: b for n, b in sizes.items() if n.startswith(VISION_PREFIXES[1])}
    total = sum(sizes.values())
    skipped = sum(tower.values()) + sum(projector.values())
    return {
        "model_path": str(model_path),
        "checkpoint_bytes": total,
        "vision_tower_bytes": sum(tower.values()),
        "vision_tower_tensors": len(tower),
        "mm_projector_bytes": sum(projector.values()),
        "mm_projector_tensors": len(projector),
        "skipped_bytes": skipped,
        "skipped_fraction": skipped / total if total else 0.0,
    }


def _mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB" if n < 2**30 else f"{n / 2**30:,.2f} GiB"


PLUGIN_GROUP = "sglang.srt.plugins"  # SGLang's GENERAL_PLUGINS_GROUP (the probe reads SGLang's own constant)
PLUGIN_NAME = "kimi"
PLUGIN_VALUE = "sglang_kimi:register"
DIST_NAME = "sglang-kimi"


def entry_point_problems(group: str = PLUGIN_GROUP) -> list[str]:
    """Whether SGLang's plugin loader can see and will load this plugin: an installed distribution declaring
    the entry point, and an ``SGLANG_PLUGINS`` allow-list (if set) that names it."""
    import os

    found = [ep for ep in entry_points(group=group) if ep.name == PLUGIN_NAME]
    if not found:
        return [
            f"no `{PLUGIN_NAME}` entry point in the {group} group: sglang-kimi is not installed as a distribution "
            "(importable from a checkout is not enough), so SGLang's plugin loader never calls it; install it with "
            "`pip install sglang-kimi` (or `pip install --no-deps sglang_kimi-*.whl`)"
        ]
    problems = []
    if found[0].value != PLUGIN_VALUE:
        problems.append(
            f"the `{PLUGIN_NAME}` entry point is {found[0].value!r}, not {PLUGIN_VALUE!r}: another package claims "
            "the name; uninstall it or reinstall sglang-kimi"
        )
    dist = getattr(found[0], "dist", None)
    if dist is not None and dist.metadata["Name"] != DIST_NAME:
        problems.append(f"the `{PLUGIN_NAME}` entry point belongs to {dist.metadata['Name']}, not {DIST_NAME}")
    allowed = os.environ.get("SGLANG_PLUGINS", "").strip()
    if allowed and PLUGIN_NAME not in {x.strip() for x in allowed.split(",")}:
        problems.append(
            f"SGLANG_PLUGINS={allowed} does not name `{PLUGIN_NAME}`: SGLang will skip the plugin; add it or unset "
            "SGLANG_PLUGINS"
        )
    return problems


def collect(model_path: str | None = None, strict: bool = False) -> dict:
    from sglang_kimi.environment_check import EnvironmentSettingError, check_environment
    from sglang_kimi.plugin import AREA_OF, REGISTRATIONS
    from sglang_kimi.version import version_in_range

    problems: list[str] = []
    versions = package_versions()
    cpu = not has_gpu()
    report = {"versions": versions, "device": device_description(), "cpu_mode": cpu, "strict": strict}

    plugins = {ep.name: ep.value for ep in entry_points(group=PLUGIN_GROUP)}
    report["entry_point"] = plugins.get(PLUGIN_NAME)
    problems += entry_point_problems()
    try:  # what a launch from this environment would refuse
        check_environment()
    except EnvironmentSettingError as exc:
        problems.append(str(exc))

    sglang = versions["sglang"]
    if sglang is None:
        problems.append(f"SGLang is not installed: {SGLANG_INSTALL_HINT}")
    else:
        if not version_in_range(sglang, SUPPORTED_SGLANG):
            problems.append(
                f"sglang {sglang} is outside the supported range {SUPPORTED_SGLANG[0]}..{SUPPORTED_SGLANG[1]}: "
                f"install a supported SGLang (pip install sglang=={SUPPORTED_SGLANG[1]}) or a sglang-kimi release "
                "that supports this one"
            )
        probed, error = probe_registration(cpu, strict)
        state = probed and probed["plugin"]
        report["plugin"] = state
        report["kernel_overrides"] = probed and probed["kernel_overrides"]
        report["audit"] = probed.get("audit") if probed else None
        if state is None:
            problems.append("SGLang could not load the plugin in a fresh process:\n" + error)
        else:
            if probed["plugin_group"] != PLUGIN_GROUP:
                problems += entry_point_problems(probed["plugin_group"])
            if not state.get("registrations"):
                problems.append(
                    "SGLang's plugin loader did not call sglang-kimi in a fresh SGLang process (see the entry-point "
                    "problems above, or SGLANG_PLUGINS)"
                )
            for name in state.get("failed", []):
                problems.append(f"registration {name!r} failed: {state['registrations'][name]}")
            problems += (report["audit"] or {}).get("problems", [])
    report["registrations"] = [
        {"name": e.name, "area": AREA_OF[e.name], "target": e.target, "when": e.when, "why": e.why}
        for e in REGISTRATIONS
    ]
    report["tiny_model"] = str(TINY_MODEL) if (TINY_MODEL / "config.json").exists() else None
    if report["tiny_model"] is None:
        problems.append(f"the embedded tiny model is missing at {TINY_MODEL}: reinstall sglang-kimi")
    if model_path is not None:
        try:
            report["text_only"] = text_only_savings(model_path)
        except (OSError, ValueError, KeyError) as exc:
            problems.append(f"cannot read the checkpoint's safetensors headers: {exc}")
    report["problems"] = problems
    return report


def print_report(report: dict) -> None:
    print(f"sglang-kimi {report['versions']['sglang-kimi']}")
    print("versions:")
    for name, ver in report["versions"].items():
        print(f"  {name:<14} {ver or 'not installed'}")
    print(f"device: {report['device']}")
    state = report.get("plugin") or {}
    outcomes = state.get("registrations", {})
    print("registrations (checked in a fresh SGLang process):")
    area = None
    for entry in report["registrations"]:
        if entry["area"] != area:
            area = entry["area"]
            print(f"  [{area}]" + (_hardening_line(state, report["registrations"]) if area == "hardening" else ""))
        outcome = outcomes.get(entry["name"], "not run")
        print(f"  {entry['name']:<24} {outcome}")
        print(f"      {entry['target']}")
        print(f"      {entry['why']}")
    print("kernel overrides (as a server process on this machine would have them):")
    for row in report.get("kernel_overrides") or []:
        what = row.get("name") or row.get("key") or ""
        value = f"={row['value']} (set by {row['set_by']})" if "value" in row else ""
        state = "active" if row.get("active") else "inactive"
        print(f"  {row['kind']:<11} {state:<8} {what}{value}: {row.get('why', '')}")
    print(f"tiny model: {report['tiny_model'] or 'missing'}")
    saved = report.get("text_only")
    if saved:
        print(f"text-only serving (--language-model-only) of {saved['model_path']}:")
        print(f"  vision tower  {_mib(saved['vision_tower_bytes']):>12}  ({saved['vision_tower_tensors']} tensors)")
        print(f"  mm projector  {_mib(saved['mm_projector_bytes']):>12}  ({saved['mm_projector_tensors']} tensors)")
        print(
            f"  not loaded    {_mib(saved['skipped_bytes']):>12}  = {100 * saved['skipped_fraction']:.2f}% of the "
            f"{_mib(saved['checkpoint_bytes'])} checkpoint"
        )
    if report.get("strict"):
        audit = report.get("audit")
        if audit is None:
            print("strict audit: not run (SGLang could not load the plugin)")
        else:
            n = audit["checked"]
            print(
                f"strict audit against sglang {report['versions']['sglang']}: {n['sglang_names']} SGLang names, "
                f"{n['hook_signatures']} hook signatures, {n['modules']} serving modules: "
                f"{len(audit['problems'])} problem(s)"
            )
    if report["problems"]:
        print("problems:")
        for problem in report["problems"]:
            print(f"  - {problem}")
    else:
        print("no problems found")


def _hardening_line(state: dict, rows: list[dict]) -> str:
    from sglang_kimi.plugin import HARDENING_ENV

    count = sum(row["area"] == "hardening" for row in rows)
    switch = f"{HARDENING_ENV}=0 turns them off" if state.get("hardening", "on") == "on" else "unset it to turn on"
    return f" {state.get('hardening', 'not run')}: {count} fixes to SGLang's API behaviour ({switch})"


def run_doctor(args: argparse.Namespace) -> int:
    report = collect(getattr(args, "model_path", None), strict=getattr(args, "strict", False))
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_report(report)
    return 1 if report["problems"] else 0
