"""scripts/build_gpu_bundle.py without the network: every carried package is pinned, and the SGLang wheel keeps
what its serving path imports while losing the compiled Rust front ends and the diffusion runtime."""

from __future__ import annotations

import pytest
from support.repo_scripts import load_script


@pytest.fixture(scope="module")
def bundle():
    return load_script("scripts/build_gpu_bundle.py")


def test_every_carried_package_is_pinned(bundle):
    specs = bundle.pinned(bundle.REQUIREMENTS, bundle.CONSTRAINTS)
    assert specs and all("==" in s for s in specs)
    assert any(s.startswith("fastapi==") for s in specs) and any(s.startswith("opentelemetry-api==") for s in specs)


def test_an_unpinned_package_is_refused_by_name(bundle, tmp_path):
    req = tmp_path / "req.txt"
    req.write_text("fastapi\nsome-new-package  # comment\n")
    with pytest.raises(SystemExit, match="some-new-package"):
        bundle.pinned(req, bundle.CONSTRAINTS)


@pytest.mark.parametrize(
    "member,dropped",
    [
        ("sglang/srt/rust_extensions/_server.cpython-312-x86_64-linux-gnu.so", True),
        ("sglang/srt/rust_extensions/_grpc.cpython-312-x86_64-linux-gnu.so", True),
        ("sglang/srt/mem_cache/rust_tree_core/mem_cache.cpython-312-x86_64-linux-gnu.so", True),
        ("sglang/multimodal_gen/runtime/managers/gpu_worker.py", True),
        ("sglang/srt/rust_extensions/__init__.py", False),
        ("sglang/srt/rust_extensions/loader.py", False),
        ("sglang/srt/mem_cache/rust_tree_core/adapter.py", False),
        ("sglang/srt/entrypoints/http_server.py", False),
        ("sglang/test/test_utils.py", False),
        ("sglang/kernels/jit/csrc/attention/kda_prefill.cu", False),
    ],
)
def test_sglang_members_dropped(bundle, member, dropped):
    assert bool(bundle.SGLANG_DROP.match(member)) is dropped


def test_stripped_wheel_lists_only_what_it_holds(bundle, tmp_path):
    import zipfile

    wheel = tmp_path / "sglang-0.5.23-cp312-cp312-manylinux_2_34_x86_64.whl"
    kept, dropped = "sglang/srt/server_args.py", "sglang/multimodal_gen/x.py"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr(kept, "x = 1\n")
        z.writestr(dropped, "y = 2\n")
        z.writestr("sglang-0.5.23.dist-info/RECORD", f"{kept},sha256=a,6\n{dropped},sha256=b,6\n")
    bundle.strip_sglang(tmp_path)
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        record = z.read("sglang-0.5.23.dist-info/RECORD").decode()
    assert kept in names and dropped not in names
    assert kept in record and dropped not in record


def test_the_ipython_stand_in_serves_sglangs_import():
    """IPython is not carried (2.2 MiB of the 64 that travel): the GPU machine's stand-in serves the one import SGLang
    makes of it, ``from IPython.display import HTML, display`` in sglang/utils.py, ahead of any real IPython."""
    import os
    import subprocess
    import sys

    from support.paths import SCRIPTS

    code = (
        "import IPython; from IPython.display import HTML, display; display(HTML('<b>x</b>')); print(IPython.__file__)"
    )
    env = dict(os.environ, PYTHONPATH=str(SCRIPTS / "gpu_shims"))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    shown, path = out.splitlines()
    assert shown == "<b>x</b>" and "gpu_shims" in path
