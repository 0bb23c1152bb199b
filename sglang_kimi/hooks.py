"""Registering hooks with SGLang's ``HookRegistry``, and the record of every hook this plugin registered.

A leaf module: the installers of ``plugin.py``'s table call :func:`hook` with the target their table entry passes
them; ``plugin.registration_state`` asks :func:`hook_applied`; ``audit.py`` checks every recorded hook's signature
against its target.

Several AROUND hooks of the plugin on one target (a CPU fix and a feature on the same worker method) are registered
with SGLang as one AROUND that nests them as SGLang would (the later one outside): SGLang warns in every process about
several AROUND hooks on a target, in case one of them skips the original, and each of the plugin's calls it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass


@dataclass(frozen=True)
class Hook:
    target: str  # dotted SGLang name
    fn: object  # the plugin's wrapper
    hook_type: str  # BEFORE | AFTER | AROUND | REPLACE


HOOKS: list[Hook] = []
_AROUND: dict[str, list] = {}  # target -> the plugin's AROUND hooks on it, in registration order


def _nested(chain: list):
    """One AROUND hook running ``chain``'s hooks around ``original``, the last registered outermost."""

    def around(original, *args, **kwargs):
        call = original
        for fn in chain:
            call = functools.partial(fn, call)
        return call(*args, **kwargs)

    return around


def hook(target: str, fn, hook_type: str = "AFTER") -> None:
    """Register ``fn`` on ``target`` with SGLang's HookRegistry (``hook_type``: BEFORE/AFTER/AROUND/REPLACE)."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HOOKS.append(Hook(target, fn, hook_type))
    if hook_type == "AROUND":
        chain = _AROUND.get(target)
        if chain is not None:  # SGLang's registry already holds this target's nesting AROUND
            chain.append(fn)
            return
        chain = _AROUND[target] = [fn]
        fn = _nested(chain)
    HookRegistry.register(target, fn, HookType[hook_type])


def registered_targets() -> set[str]:
    return {h.target for h in HOOKS}


def hook_applied(target: str) -> bool:
    """SGLang applies hooks after every plugin has registered; a hook that failed to apply is only logged."""
    from sglang.srt.plugins.hook_registry import HookRegistry

    return target in HookRegistry._patched
