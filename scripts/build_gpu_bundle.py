#!/usr/bin/env python
"""Build the wheels that let SGLang 0.5.23 and this plugin run on an offline GPU machine with a stock PyTorch image.

Such a machine (Python 3.12, PyTorch, Triton, transformers, the common scientific packages, no SGLang, no network)
gets SGLang and the packages its serving path imports from ``requirements/gpu-bundle.txt`` as wheels copied next
to the repository. This script downloads them here for CPython 3.12 on manylinux x86-64 (versions pinned by
``requirements/constraints.txt``), rewrites the SGLang wheel without the parts the plugin never imports (its
compiled Rust front ends, ~18 MB, and the diffusion runtime ``sglang/multimodal_gen``), checks the total size
against ``--max-mib`` (bundle + this repository's tracked files), and prints the commands that install it there.

``sgl_kernel`` (SGLang's CUDA kernels; its wheel is hundreds of MB) is not in the bundle: on such a machine the
plugin's import shim stands in for it (``sglang_kimi/platform/cpu/shims``).

    .venv/bin/python scripts/build_gpu_bundle.py                  # into .gpu-bundle/
    .venv/bin/python scripts/build_gpu_bundle.py --max-mib 64 --out /tmp/bundle

On the GPU machine, from the repository root::

    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu-bundle/*.whl
    python3 -m pip install -q --no-index --no-deps --no-build-isolation -e .
    export PYTHONPATH=/tmp/site
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
REQUIREMENTS = REPO / "requirements" / "gpu-bundle.txt"
CONSTRAINTS = REPO / "requirements" / "constraints.txt"
SGLANG = "sglang==0.5.23"
PYTHON = "3.12"
PLATFORMS = (
    "manylinux_2_34_x86_64",
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_26_x86_64",
    "manylinux_2_24_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
)
# Members of the SGLang wheel left out: compiled Rust extensions (HTTP/gRPC front ends, multimodal preprocessing,
# a radix-tree core) that SGLang loads only when asked for them, and the diffusion runtime.
SGLANG_DROP = re.compile(
    r"^sglang/(multimodal_gen/|srt/rust_extensions/_\w+\.cpython|srt/mem_cache/rust_tree_core/.*\.so$)"
)
MIB = 1 << 20


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pinned(requirements: Path, constraints: Path) -> list[str]:
    """Each requirement with its ``==`` pin from the constraints file; a name without a pin is an error."""
    pins = {}
    for line in constraints.read_text().splitlines():
        line = line.split("#")[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            pins[normalize(name)] = version.strip()
    names = [ln.split("#")[0].strip() for ln in requirements.read_text().splitlines()]
    names = [n for n in names if n]
    missing = [n for n in names if normalize(n) not in pins]
    if missing:
        raise SystemExit(f"build_gpu_bundle: no pin in {constraints.name} for {missing}: add one there")
    return [f"{n}=={pins[normalize(n)]}" for n in names]


def download(specs: list[str], dest: Path) -> None:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--dest", str(dest)]
    cmd += ["--python-version", PYTHON, "--implementation", "cp", "--abi", "cp" + PYTHON.replace(".", "")]
    cmd += ["--abi", "abi3", "--abi", "none"]
    for platform in PLATFORMS:
        cmd += ["--platform", platform]
    cmd += ["--platform", "any"]
    print(f"downloading {len(specs)} wheels for CPython {PYTHON} ...", flush=True)
    subprocess.run(cmd + specs, check=True)


def strip_sglang(dest: Path) -> Path:
    """Rewrite the SGLang wheel without :data:`SGLANG_DROP` members (its RECORD lists what remains)."""
    wheels = sorted(dest.glob("sglang-*.whl"))
    if len(wheels) != 1:
        raise SystemExit(f"build_gpu_bundle: expected one SGLang wheel in {dest}, found {[w.name for w in wheels]}")
    src = wheels[0]
    tmp = src.with_suffix(".tmp")
    dropped = 0
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zout:
        for info in zin.infolist():
            if SGLANG_DROP.match(info.filename):
                dropped += info.compress_size
                continue
            data = zin.read(info)
            if info.filename.endswith(".dist-info/RECORD"):
                keep = [ln for ln in data.decode().splitlines() if not SGLANG_DROP.match(ln.split(",")[0])]
                data = ("\n".join(keep) + "\n").encode()
            zout.writestr(info, data)
    tmp.replace(src)
    print(f"{src.name}: dropped {dropped / MIB:.1f} MiB (Rust extensions, diffusion runtime)")
    return src


def tracked_bytes() -> int:
    names = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout.split(b"\0")
    return sum((REPO / n.decode()).stat().st_size for n in names if n and (REPO / n.decode()).is_file())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=REPO / ".gpu-bundle", help="folder for the wheels (emptied first)")
    p.add_argument(
        "--max-mib",
        type=float,
        default=64.0,
        help="the most the bundle and the repository's tracked files may weigh together (default 64)",
    )
    args = p.parse_args(argv)
    specs = pinned(REQUIREMENTS, CONSTRAINTS) + [SGLANG]
    args.out.mkdir(parents=True, exist_ok=True)
    for old in args.out.glob("*.whl"):
        old.unlink()
    download(specs, args.out)
    strip_sglang(args.out)
    wheels = sorted(args.out.glob("*.whl"))
    bundle = sum(w.stat().st_size for w in wheels)
    tree = tracked_bytes()
    together = (bundle + tree) / MIB
    print(f"\n{len(wheels)} wheels, {bundle / MIB:.1f} MiB; tracked files {tree / MIB:.1f} MiB", end="")
    print(f"; together {together:.1f} MiB")
    for w in sorted(wheels, key=lambda w: -w.stat().st_size)[:5]:
        print(f"  {w.stat().st_size / MIB:5.1f} MiB  {w.name}")
    if bundle + tree > args.max_mib * MIB:
        print(f"build_gpu_bundle: over --max-mib {args.max_mib:g}", file=sys.stderr)
        return 1
    print(f"\nwithin --max-mib {args.max_mib:g}; on the GPU machine: see this script's docstring")
    try:
        carry = args.out.resolve().relative_to(REPO)
    except ValueError:
        carry = args.out
    print(f'carry: ["{carry}"] (an ignored path: it travels only when named), {together:.1f} MiB with the tree')
    return 0


if __name__ == "__main__":
    sys.exit(main())
