"""The registration table's row (:class:`Entry`), registering hooks with SGLang's ``HookRegistry``, and the record
of every hook this plugin registered.

A leaf module: each area's ``registrations.py`` lists its :class:`Entry` rows, ``plugin.py`` runs them; the installers
call :func:`hook` with the SGLang names their entry passes them; ``plugin.registration_state`` asks
:func:`hook_applied`; ``cli/audit.py`` checks every recorded hook's signature against its target.

Several AROUND hooks of the plugin on one target (a CPU fix and a feature on the same worker method) are registered
with SGLang as one AROUND that nests them as SGLang would (the later one outside): SGLang warns in every process about
several AROUND hooks on a target, in case one of them skips the original, and each of the plugin's calls it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

ALWAYS = "always"
CPU_ONLY = "cpu"  # only in processes started with SGLANG_USE_CPU_ENGINE=1
CUDA_STAND_IN = "cuda without sgl_kernel"  # only on a CUDA device whose sgl_kernel is the plugin's shim


@dataclass(frozen=True)
class Entry:
    """One registration: ``install`` (``"module:function"``, imported lazily) is called with ``target`` and then
    ``hooks``, the SGLang names it hooks or writes; ``reads`` are further SGLang names its code uses. Each name is
    written here once: the strict audit resolves all of them (``sglang_names``)."""

    name: str  # short id, shown in /server_info and `sglang-kimi doctor`
    target: str  # the SGLang object hooked first, or the registry written to
    install: str  # "module:function" inside sglang_kimi; returns None, or why it skipped
    why: str  # one or two lines: the feature it adds, or the upstream bug it works around
    when: str = ALWAYS
    hooks: tuple[str, ...] = ()  # further SGLang names the installer hooks, passed to it after ``target``
    reads: tuple[str, ...] = ()  # further SGLang names the installer's code reads
    since: tuple[int, int, int] | None = None  # the first SGLang release with these names; older ones skip it

    def sglang_names(self) -> tuple[str, ...]:
        """The SGLang names the strict audit resolves (``os.environ`` and ``sys.excepthook`` are not SGLang's)."""
        return tuple(n for n in (self.target, *self.hooks, *self.reads) if n.startswith("sglang."))


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
