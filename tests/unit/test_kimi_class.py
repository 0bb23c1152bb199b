"""The plugin's Kimi-K2.5/K2.6 class in place of SGLang's keeps what SGLang reads from the class.

SGLang's model modules need the CPU import shims, so the test runs in the session's CPU SGLang child process
(``cpu_sglang_child``); in the parent, one test fails with the child's report.
"""

from __future__ import annotations

import inspect

import pytest

pytestmark = pytest.mark.cpu_sglang_child


def test_forward_keeps_every_parameter_of_sglangs_kimi_forward():
    # SGLang's ModelRunner inspects the forward signature: ``pp_proxy_tensors`` there is what enables pipeline
    # parallelism (``support_pp``); a parameter hidden in **kwargs turns the feature off
    from sglang.srt.models.kimi_k25 import KimiK25ForConditionalGeneration as Upstream

    from sglang_kimi.models.kimi_k25 import KimiK25ForConditionalGeneration as Ours

    ours = inspect.signature(Ours.forward).parameters
    missing = [name for name in inspect.signature(Upstream.forward).parameters if name not in ours]
    assert missing == [], f"the plugin's Kimi forward hides SGLang's parameters {missing}"
    assert "input_embeds" in ours
