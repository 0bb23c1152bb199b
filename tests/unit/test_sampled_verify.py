"""Where the plugin verifies sampled requests itself (``workers.sampled_verify.plugin_verifies_sampling``)."""

import pytest
import sglang.srt.utils as sglang_utils

from sglang_kimi.speculative.workers import sampled_verify


@pytest.mark.parametrize(
    ("device", "flashinfer", "expected"),
    [
        ("cpu", False, True),
        ("hip", True, True),
        ("cuda", True, False),  # SGLang's CUDA kernel, built from FlashInfer's headers
        ("cuda", False, True),  # that kernel cannot be built: the plugin verifies
        ("xpu", False, False),
    ],
)
def test_the_plugin_verifies_where_sglang_has_no_sampling_kernel(monkeypatch, device, flashinfer, expected):
    for name in ("cpu", "hip", "cuda"):
        monkeypatch.setattr(sglang_utils, f"is_{name}", lambda name=name: name == device)
    monkeypatch.setattr(sampled_verify, "flashinfer_installed", lambda: flashinfer)
    sampled_verify.plugin_verifies_sampling.cache_clear()
    try:
        assert sampled_verify.plugin_verifies_sampling() is expected
    finally:
        sampled_verify.plugin_verifies_sampling.cache_clear()
