"""The plugin's AROUND hooks on one target reach SGLang as one AROUND that nests them (``sglang_kimi/hooks.py``)."""

import logging
import sys
import types
from collections import defaultdict

import pytest
from sglang.srt.plugins.hook_registry import HookRegistry

from sglang_kimi import hooks


@pytest.fixture
def target(monkeypatch):
    module = types.ModuleType("kimi_hook_probe")

    class Worker:
        def forward(self, x):
            return [f"forward({x})"]

    module.Worker = Worker
    monkeypatch.setitem(sys.modules, "kimi_hook_probe", module)
    monkeypatch.setattr(hooks, "HOOKS", [])
    monkeypatch.setattr(hooks, "_AROUND", {})
    monkeypatch.setattr(HookRegistry, "_hooks", defaultdict(list))
    monkeypatch.setattr(HookRegistry, "_patched", set())
    return module


def tagging(tag):
    def around(original, self, x):
        return [f"{tag} in", *original(self, x), f"{tag} out"]

    return around


def test_two_around_hooks_nest_as_sglang_would_and_without_its_warning(target, caplog):
    name = "kimi_hook_probe.Worker.forward"
    hooks.hook(name, tagging("first"), "AROUND")
    hooks.hook(name, tagging("second"), "AROUND")
    hooks.hook(name, lambda result, self, x: [*result, "after"], "AFTER")
    assert len(HookRegistry._hooks[name]) == 2  # one nesting AROUND, one AFTER
    assert [h.hook_type for h in hooks.HOOKS] == ["AROUND", "AROUND", "AFTER"]  # each recorded for the audit
    with caplog.at_level(logging.WARNING):
        HookRegistry.apply_hooks()
    assert "Multiple AROUND hooks" not in caplog.text
    assert target.Worker().forward(1) == ["second in", "first in", "forward(1)", "first out", "second out", "after"]
