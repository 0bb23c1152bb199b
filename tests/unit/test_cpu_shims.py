"""The CPU import shims: importable, loud when an unimplemented op is used, and only on the CLI's path."""

import subprocess
import sys

from sglang_kimi.launcher.server import SHIMS_DIR, shims_needed


def _run(code: str, with_shims: bool = True) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(SHIMS_DIR) if with_shims else ""}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


def test_sgl_kernel_shim_names_missing_ops():
    out = _run(
        "import sgl_kernel\n"
        "from sgl_kernel.kvcacheio import transfer_kv_per_layer\n"
        "try:\n    transfer_kv_per_layer(1, 2)\nexcept NotImplementedError as e:\n    print('ERR', e)\n"
        "try:\n    sgl_kernel.some_cuda_op()\nexcept NotImplementedError as e:\n    print('ERR', e)\n"
    )
    assert out.returncode == 0, out.stderr
    errors = [line for line in out.stdout.splitlines() if line.startswith("ERR")]
    assert "sgl_kernel.kvcacheio.transfer_kv_per_layer" in errors[0]
    assert "sgl_kernel.some_cuda_op" in errors[1]


def test_torchvision_stub_imports_but_cannot_be_used():
    out = _run(
        "import importlib.metadata as m\n"
        "from torchvision.transforms import InterpolationMode\n"
        "from torchvision.io import decode_image\n"
        "import torchvision.transforms as T\n"
        "print(InterpolationMode.BICUBIC.value)\n"
        "try:\n    m.version('torchvision')\nexcept m.PackageNotFoundError:\n    print('no dist-info')\n"
        "try:\n    T.Resize(3)\nexcept RuntimeError as e:\n    print('ERR', e)\n"
    )
    assert out.returncode == 0, out.stderr
    assert "bicubic" in out.stdout and "no dist-info" in out.stdout
    assert "ERR torchvision.transforms.Resize is not available" in out.stdout


def test_flash_mla_stub_lets_sglang_import_its_flashmla_backend_and_refuses_use():
    # SGLang's EAGLE worker imports FlashMLABackend on CUDA while capturing the drafter's graphs, only to test
    # isinstance; without the sgl-flash-mla wheel that import failed and the server stopped at start-up
    out = _run(
        "from sglang.srt.layers.attention.flashmla_backend import FlashMLABackend\n"
        "import flash_mla\n"
        "from flash_mla.flash_mla_interface import FlashMLASchedMeta\n"
        "print('imported', FlashMLABackend.__name__)\n"
        "try:\n    flash_mla.fused_norm_rope_attn_rope_cast(1)\nexcept RuntimeError as e:\n    print('ERR', e)\n"
        "try:\n    FlashMLASchedMeta()\nexcept RuntimeError as e:\n    print('ERR', e)\n"
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "imported FlashMLABackend" in out.stdout
    errors = [line for line in out.stdout.splitlines() if line.startswith("ERR")]
    assert "flash_mla.fused_norm_rope_attn_rope_cast is not available" in errors[0]
    assert "flash_mla.flash_mla_interface.FlashMLASchedMeta is not available" in errors[1]
    assert "attention backend other than flashmla" in errors[1]


def test_shims_are_not_importable_without_the_cli():
    # without the CLI's path, `sgl_kernel` is the real package (a GPU machine) or missing (this CPU): never the shim
    out = _run(
        "import sglang_kimi, sglang_kimi.plugin\nimport sgl_kernel\nprint(sgl_kernel.__file__)", with_shims=False
    )
    if out.returncode == 0:
        assert not out.stdout.strip().startswith(str(SHIMS_DIR)), out.stdout
    else:
        assert "No module named 'sgl_kernel'" in out.stderr


def test_shims_needed_only_for_missing_packages():
    needed = shims_needed()
    for name in ("sgl_kernel", "torchvision"):
        real = subprocess.run([sys.executable, "-c", f"import {name}"], capture_output=True).returncode == 0
        assert (name in needed) == (not real)
