"""`sglang-kimi doctor --strict` (the images' build gate) on the other SGLang releases the plugin supports, each
installed from PyPI into a scratch folder by ``scripts/check_sglang_range.py``. The installed release is audited where
the images' install script runs the gate (``test_fresh_install.py``); serving every release in every mode is that
script's full run (minutes a release), not this test's.

An entry whose SGLang names arrived after the range's first release must carry ``since``; without it the audit of the
older releases fails, and so does an image built on them (the default base images carry SGLang 0.5.21)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from support.paths import SCRIPTS, scripts_importable

from sglang_kimi import SUPPORTED_SGLANG

pytestmark = pytest.mark.e2e

scripts_importable()
import check_sglang_range  # noqa: E402


def test_the_script_checks_the_supported_range():
    versions = check_sglang_range.DEFAULT_VERSIONS
    assert (versions[0], versions[-1]) == SUPPORTED_SGLANG


def test_the_strict_audit_passes_on_every_other_supported_release(tmp_path):
    import sglang.version

    others = [v for v in check_sglang_range.DEFAULT_VERSIONS if v != sglang.version.__version__]
    out = tmp_path / "range.json"
    run = subprocess.run(
        [sys.executable, str(SCRIPTS / "check_sglang_range.py"), "--versions", ",".join(others),
         "--steps", "audit", "--scratch", str(tmp_path / "scratch"), "--out", str(out)],
        capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    assert out.exists(), run.stdout[-3000:] + run.stderr[-3000:]
    results = json.loads(out.read_text())["results"]
    assert sorted(results) == sorted(others)
    for version, result in results.items():
        assert result["install"]["status"] == "pass", f"{version}: {result['install']}"
        audit = result["audit"]
        assert audit["status"] == "pass", f"sglang {version}: " + "\n".join(audit.get("problems", []))
    assert run.returncode == 0, run.stdout[-3000:]
