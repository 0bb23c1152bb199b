"""Registering hooks with SGLang's ``HookRegistry``, and the record of every hook this plugin registered.

A leaf module: the installers of ``plugin.py``'s table call :func:`hook` with the target their table entry passes
them; ``plugin.registration_state`` asks :func:`hook_applied`; ``audit.py`` checks every recorded hook's signature
against its target.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Hook:
    target: str  # dotted SGLang name
    fn: object  # the plugin's wrapper
    hook_type: str  # BEFORE | AFTER | AROUND | REPLACE


HOOKS: list[Hook] = []


def hook(target: str, fn, hook_type: str = "AFTER") -> None:
    """Register ``fn`` on ``target`` with SGLang's HookRegistry (``hook_type``: BEFORE/AFTER/AROUND/REPLACE)."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(target, fn, HookType[hook_type])
    HOOKS.append(Hook(target, fn, hook_type))


def registered_targets() -> set[str]:
    return {h.target for h in HOOKS}


def hook_applied(target: str) -> bool:
    """SGLang applies hooks after every plugin has registered; a hook that failed to apply is only logged."""
    from sglang.srt.plugins.hook_registry import HookRegistry

    return target in HookRegistry._patched
