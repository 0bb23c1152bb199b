"""`sglang-kimi doctor --strict`: the image-build gate names every drifted hook target, signature, unsupported SGLang
version and missing entry point, with exit code 1. That the installed SGLang passes it is checked where the images'
install script runs it (``test_fresh_install.py``)."""

import os
import subprocess
import sys
import textwrap

import pytest

from sglang_kimi.cli import audit, doctor


def _doctor(*args, sitecustomize: str | None = None, env: dict | None = None, tmp_path=None) -> subprocess.Popen:
    """`sglang-kimi doctor` started in a subprocess (its output read by :func:`_finished`); ``sitecustomize`` runs
    first in it and in doctor's SGLang probe."""
    env = dict(os.environ, **(env or {}))
    if sitecustomize is not None:
        (tmp_path / "sitecustomize.py").write_text(textwrap.dedent(sitecustomize))
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tmp_path), env.get("PYTHONPATH")]))
    return subprocess.Popen(
        [sys.executable, "-m", "sglang_kimi.cli.main", "doctor", *args], env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, cwd=tmp_path,
    )  # fmt: skip


def _finished(run: subprocess.Popen) -> subprocess.CompletedProcess:
    try:
        stdout, stderr = run.communicate(timeout=600)
    finally:
        run.kill()
    return subprocess.CompletedProcess(run.args, run.returncode, stdout, stderr)


# Drifted environments, each a `sitecustomize` run before SGLang is imported; independent problems share a run (one
# doctor run costs an SGLang import): every problem must be named, and the exit code is 1.
# The SGLang patches come last: in doctor's own process (no CPU shims on its path) importing SGLang fails and ends
# the sitecustomize there; doctor's SGLang probe, which has the shims, runs all of it.

RENAMED_TARGET = """
    # SGLang without eagle_utils.eagle_sample (as if a release had renamed it): the hook cannot apply.
    import sglang.srt.speculative.eagle_utils as eagle_utils
    eagle_utils.eagle_sample_renamed = eagle_utils.eagle_sample
    del eagle_utils.eagle_sample
"""
OLD_VERSION = """
    import importlib.metadata as md
    _version = md.version
    md.version = lambda name: "0.4.9" if name == "sglang" else _version(name)
"""
CHANGED_SIGNATURE = """
    # a release that renamed eagle_sample's keyword `watermark_state`: the plugin's wrapper passes it by name
    import sglang.srt.speculative.eagle_utils as eagle_utils
    def eagle_sample(verify_input, batch, logits_output, grammar_mask=None, uno_target_max_top_k=None, *,
                     watermark=None, watermark_full_mask=True):
        raise AssertionError("not called by the audit")
    eagle_utils.eagle_sample = eagle_sample
"""
NOT_A_DISTRIBUTION = """
    # importable (from a checkout on PYTHONPATH, say) but with no dist-info: no entry point for SGLang to find
    import importlib.metadata as md
    _entry_points = md.entry_points
    def entry_points(**kwargs):
        found = _entry_points(**kwargs)
        if kwargs.get("group") == "sglang.srt.plugins":
            return md.EntryPoints(ep for ep in found if ep.name != "kimi")
        return found
    md.entry_points = entry_points
"""


@pytest.fixture(scope="module")
def drifted(tmp_path_factory) -> dict[str, subprocess.CompletedProcess]:
    """The doctor runs of the drifted environments, side by side (each one mostly imports SGLang):

    - ``sglang``: a renamed hook target, an unsupported version, and an allow-list that skips the plugin;
    - ``signature``: a hook target whose keyword was renamed;
    - ``distribution``: the plugin without its entry point, so never loaded in SGLang's processes."""
    environments = {
        "sglang": (textwrap.dedent(OLD_VERSION) + textwrap.dedent(RENAMED_TARGET), {"SGLANG_PLUGINS": "someone_else"}),
        "signature": (CHANGED_SIGNATURE, None),
        "distribution": (NOT_A_DISTRIBUTION, None),
    }
    runs = {
        name: _doctor("--strict", tmp_path=tmp_path_factory.mktemp(f"drifted_{name}"), sitecustomize=code, env=env)
        for name, (code, env) in environments.items()
    }
    return {name: _finished(run) for name, run in runs.items()}


@pytest.fixture(scope="module")
def drifted_sglang(drifted):
    return drifted["sglang"]


@pytest.fixture(scope="module")
def drifted_signature(drifted):
    return drifted["signature"]


def test_a_renamed_hook_target_fails_the_build(drifted_sglang):
    assert drifted_sglang.returncode == 1, drifted_sglang.stdout[-3000:]
    assert "entry 'lossless-eagle-sampling': the installed SGLang has no sglang.srt.speculative.eagle_utils." \
           "eagle_sample" in drifted_sglang.stdout  # fmt: skip


def test_an_unsupported_sglang_version_fails(drifted_sglang):
    assert drifted_sglang.returncode == 1
    assert "sglang 0.4.9 is outside the supported range" in drifted_sglang.stdout


def test_a_plugin_the_loader_skips_fails(drifted_sglang):
    assert drifted_sglang.returncode == 1
    assert "SGLANG_PLUGINS=someone_else does not name `kimi`" in drifted_sglang.stdout
    assert "SGLang's plugin loader did not call sglang-kimi" in drifted_sglang.stdout


def test_a_changed_hook_signature_fails_the_build(drifted_signature):
    assert drifted_signature.returncode == 1, drifted_signature.stdout[-3000:]
    assert "hook on sglang.srt.speculative.eagle_utils.eagle_sample: the plugin passes keyword parameters " \
           "['watermark_state']" in drifted_signature.stdout  # fmt: skip


def test_a_plugin_not_installed_as_a_distribution_fails(drifted):
    out = drifted["distribution"]
    assert out.returncode == 1, out.stdout[-3000:]
    assert "no `kimi` entry point in the sglang.srt.plugins group: sglang-kimi is not installed as a distribution" \
        in out.stdout  # fmt: skip


# -- the signature rule alone ------------------------------------------------------------------------------------


def _target(verify_input, batch, logits_output, grammar_mask=None, *, watermark_state=None):
    pass


def test_signature_rule():
    def around(original, verify_input, batch, logits_output, grammar_mask=None, *, watermark_state=None):
        pass

    def passthrough(original, *args, **kwargs):
        pass

    def too_many(original, a, b, c, d, e):
        pass

    def takes_too_few(original, verify_input):
        pass

    def after(result, controller, *args, **kwargs):
        pass

    assert audit.signature_mismatch(around, _target, "AROUND") is None
    assert audit.signature_mismatch(passthrough, _target, "AROUND") is None
    assert audit.signature_mismatch(after, _target, "AFTER") is None
    assert "positional parameters ['e']" in audit.signature_mismatch(too_many, _target, "AROUND")
    assert "requires 'batch'" in audit.signature_mismatch(takes_too_few, _target, "AROUND")

    def renamed(verify_input, batch, logits_output, grammar_mask=None, *, watermark=None):
        pass

    assert "keyword parameters ['watermark_state']" in audit.signature_mismatch(around, renamed, "AROUND")

    def new_required(verify_input, batch, logits_output, grammar_mask=None, *, watermark_state=None, mode):
        pass

    assert "requires keyword 'mode'" in audit.signature_mismatch(around, new_required, "AROUND")
    assert audit.signature_mismatch(around, dict, "AROUND") is None  # classes: resolution is the whole check


def test_entry_point_problems_when_the_allow_list_names_the_plugin(monkeypatch):
    monkeypatch.setenv("SGLANG_PLUGINS", "other, kimi")
    assert doctor.entry_point_problems() == []
