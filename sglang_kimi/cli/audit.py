"""The strict check of the plugin against the installed SGLang (``sglang-kimi doctor --strict``).

The plugin hooks SGLang internals by dotted path, and SGLang logs and swallows a plugin's exceptions: a base image
with another SGLang can lose a hook without failing. Run in a process where SGLang has loaded its plugins, this
module checks, for every entry of :data:`sglang_kimi.plugin.REGISTRATIONS`:

- every SGLang name the entry needs resolves (``pkgutil.resolve_name``, the resolver SGLang's HookRegistry uses);
- every function hook still fits its target: the positional arguments the plugin's wrapper takes exist, its keyword
  arguments are parameters of the target, and every required parameter of the target reaches the wrapper;
- every plugin module that imports SGLang at import time (the serving workers, the CPU backend, the Kimi model
  classes, the kernels) imports, so a moved SGLang name fails here and not at the first request.

Each problem is one line naming the entry, the missing name and what it means.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil

# Plugin packages whose modules serving imports lazily (worker creation, backend creation, model loading).
SERVING_PACKAGES = (
    "sglang_kimi.speculative.workers",
    "sglang_kimi.platform.cpu",
    "sglang_kimi.models",
    "sglang_kimi.speculators",
    "sglang_kimi.kernels",
)
NOT_IMPORTED = ("sglang_kimi.platform.cpu.shims",)  # import shims, put on a CPU server's path as top-level packages

# The first parameter of a wrapper per hook type: SGLang passes the original function (AROUND) or its result
# (AFTER); BEFORE and REPLACE wrappers take the target's arguments directly.
_LEADING = {"AROUND": 1, "AFTER": 1, "BEFORE": 0, "REPLACE": 0}


def unresolved_names() -> list[str]:
    """One problem per SGLang name a table entry needs that the installed SGLang does not have."""
    from sglang_kimi.plugin import REGISTRATIONS, installed_sglang_has

    problems = []
    for entry in REGISTRATIONS:
        if not installed_sglang_has(entry):
            continue  # skipped on this release (Entry.since): start-up refuses what needs it
        for name in entry.sglang_names():
            try:
                pkgutil.resolve_name(name)
            except Exception as exc:  # ImportError, AttributeError, or an import-time failure of that module
                problems.append(
                    f"entry {entry.name!r}: the installed SGLang has no {name} ({type(exc).__name__}: {exc}); "
                    f"this plugin release does not support it: {entry.why}"
                )
    return problems


def _parameters(fn) -> list[inspect.Parameter]:
    return list(inspect.signature(fn).parameters.values())


def signature_mismatch(wrapper, target, hook_type: str) -> str | None:
    """Why ``wrapper`` cannot wrap ``target`` (None when it can), from their parameter lists alone."""
    P = inspect.Parameter
    if not callable(target) or isinstance(target, type):
        return None  # classes and registries: resolution is the whole check
    try:
        ours = _parameters(wrapper)[_LEADING[hook_type] :]
        theirs = _parameters(inspect.unwrap(target))
    except (TypeError, ValueError):
        return None  # builtins without a signature
    positional = (P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD)
    our_positional = [p for p in ours if p.kind in positional]
    our_keywords = {p.name for p in ours if p.kind == P.KEYWORD_ONLY}
    our_varargs = any(p.kind == P.VAR_POSITIONAL for p in ours)
    our_varkw = any(p.kind == P.VAR_KEYWORD for p in ours)
    their_positional = [p for p in theirs if p.kind in positional]
    their_names = {p.name for p in theirs if p.kind != P.POSITIONAL_ONLY}
    their_varargs = any(p.kind == P.VAR_POSITIONAL for p in theirs)
    their_varkw = any(p.kind == P.VAR_KEYWORD for p in theirs)

    if len(our_positional) > len(their_positional) and not their_varargs:
        extra = [p.name for p in our_positional[len(their_positional) :]]
        return f"the plugin expects positional parameters {extra} that the target no longer has"
    missing = sorted(our_keywords - their_names) if not their_varkw else []
    if missing:
        return f"the plugin passes keyword parameters {missing} that the target no longer has"
    required = [p for p in theirs if p.default is P.empty and p.kind not in (P.VAR_POSITIONAL, P.VAR_KEYWORD)]
    for i, param in enumerate(p for p in required if p.kind in positional):
        if i >= len(our_positional) and not our_varargs and not (param.name in our_keywords or our_varkw):
            return f"the target now requires {param.name!r}, which the plugin's wrapper does not take"
    for param in (p for p in required if p.kind == P.KEYWORD_ONLY):
        if param.name not in our_keywords and not our_varkw:
            return f"the target now requires keyword {param.name!r}, which the plugin's wrapper does not take"
    return None


def hook_mismatches() -> list[str]:
    """One problem per registered hook whose wrapper no longer fits its SGLang target's signature."""
    from sglang_kimi.hooks import HOOKS

    problems = []
    for target, wrapper, hook_type in ((h.target, h.fn, h.hook_type) for h in HOOKS):
        try:
            original = pkgutil.resolve_name(target)
        except Exception:
            continue  # reported by unresolved_names()
        why = signature_mismatch(wrapper, original, hook_type)
        if why:
            problems.append(f"hook on {target}: {why} (the plugin's {wrapper.__qualname__})")
    return problems


def serving_modules() -> list[str]:
    names = []
    for package_name in SERVING_PACKAGES:
        package = importlib.import_module(package_name)
        names.append(package_name)
        for info in pkgutil.walk_packages(package.__path__, package_name + "."):
            if not info.name.startswith(NOT_IMPORTED):
                names.append(info.name)
    return names


def import_failures() -> list[str]:
    """One problem per plugin module serving needs that does not import against the installed SGLang."""
    problems = []
    for name in serving_modules():
        try:
            importlib.import_module(name)
        except Exception as exc:
            problems.append(f"module {name} does not import: {type(exc).__name__}: {exc}")
    return problems


def audit() -> dict:
    """What was checked (counts) and every problem found; no problem: the installed SGLang carries every name and
    signature the plugin needs."""
    from sglang_kimi.hooks import HOOKS
    from sglang_kimi.plugin import REGISTRATIONS

    return {
        "checked": {
            "sglang_names": sum(len(entry.sglang_names()) for entry in REGISTRATIONS),
            "hook_signatures": len(HOOKS),
            "modules": len(serving_modules()),
        },
        "problems": unresolved_names() + hook_mismatches() + import_failures(),
    }
