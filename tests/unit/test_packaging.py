"""The wheel: sglang_kimi.{speculators,kernels,evals} inside, no top-level names of other packages, assets in."""

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from support.paths import REPO
from support.wheel import build_wheel


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("wheel"))


def test_wheel_file_list(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    top_level = {name.split("/")[0] for name in names}
    assert {n for n in top_level if not n.endswith(".dist-info")} == {"sglang_kimi"}
    for required in (
        "sglang_kimi/__init__.py",
        "sglang_kimi/plugin.py",
        "sglang_kimi/cli/main.py",
        "sglang_kimi/speculators/__init__.py",
        "sglang_kimi/kernels/__init__.py",
        "sglang_kimi/evals/__init__.py",
        "sglang_kimi/platform/cpu/shims/sgl_kernel/__init__.py",
        "sglang_kimi/platform/cpu/shims/torchvision/__init__.py",
        "sglang_kimi/platform/cpu/shims/flash_mla/__init__.py",
        "sglang_kimi/assets/tiny-kimi-k2.6/config.json",
        "sglang_kimi/assets/tiny-kimi-k2.6/model.safetensors",
        "sglang_kimi/assets/tiny-kimi-k2.6/tokenizer.json",
    ):
        assert required in names, required
    for source in (REPO / "speculators").rglob("*.py"):
        assert f"sglang_kimi/speculators/{source.relative_to(REPO / 'speculators')}" in names, source
    for package in ("speculators", "kernels", "evals"):  # every subpackage is declared: nothing is left out
        for source in (REPO / package).rglob("*.py"):
            assert f"sglang_kimi/{package}/{source.relative_to(REPO / package)}" in names, source
    for source in (REPO / "sglang_kimi").rglob("*.py"):
        assert f"sglang_kimi/{source.relative_to(REPO / 'sglang_kimi')}" in names, source
    assert not any(name.startswith(("tests/", "bench/", "scripts/")) for name in names)
    assert not any("torchvision" in n and n.endswith(".dist-info/METADATA") for n in names)


def test_wheel_declares_the_plugin_and_the_cli(wheel):
    archive = zipfile.ZipFile(wheel)
    (entry_points,) = [n for n in archive.namelist() if n.endswith(".dist-info/entry_points.txt")]
    text = archive.read(entry_points).decode()
    assert "[sglang.srt.plugins]\nkimi = sglang_kimi:register" in text
    assert "sglang-kimi = sglang_kimi.cli.main:main" in text
    (metadata,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
    requires = [line for line in archive.read(metadata).decode().splitlines() if line.startswith("Requires-Dist")]
    hard = [line for line in requires if "extra ==" not in line]
    assert not any("sglang" in line for line in hard), "SGLang must be an extra, not a hard dependency"
    assert any("sglang==0.5.23" in line and 'extra == "sglang"' in line for line in requires)


def test_installed_wheel_imports_from_site_packages(wheel, tmp_path):
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(target), str(wheel)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    probe = (
        "import sglang_kimi, sglang_kimi.speculators, sglang_kimi.kernels, sglang_kimi.evals\n"
        "print(sglang_kimi.__file__); print(sglang_kimi.speculators.__file__)"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], env={"PYTHONPATH": str(target)}, cwd=tmp_path, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert all(line.startswith(str(target)) for line in out.stdout.split())
