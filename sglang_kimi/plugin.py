"""Everything sglang-kimi registers into SGLang: each area's table, run in the order their hooks nest.

Each area lists its :class:`~sglang_kimi.hooks.Entry` rows in a data-only ``registrations.py``: ``platform/`` (CPU
and CUDA without ``sgl_kernel``), ``speculative/`` (the product), ``models/`` (Kimi-K2.6 variants) and
``hardening/`` (SGLang API fixes that are not about speculation; ``SGLANG_KIMI_HARDENING=0`` turns them off).
:func:`register_all` runs them once per process and records each entry's outcome in :data:`STATUS`; the scheduler
reports that record in ``/server_info`` (``internal_states[i]["sglang_kimi"]``, see ``server_info.py``) and
``sglang-kimi doctor`` prints it, so a registration that failed is never silent.

Where two areas hook one SGLang name, the later area's hook runs outside the earlier one's (``hooks.py``): the
platform's fixes first, the features after them.
"""

from __future__ import annotations

import importlib
import os
import traceback

from sglang_kimi.hardening.registrations import ENTRIES as HARDENING_ENTRIES
from sglang_kimi.hooks import ALWAYS, CPU_ONLY, CUDA_STAND_IN, Entry
from sglang_kimi.log import logger
from sglang_kimi.models.registrations import ENTRIES as MODEL_ENTRIES
from sglang_kimi.platform.capabilities import cuda_without_sgl_kernel
from sglang_kimi.platform.registrations import ENTRIES as PLATFORM_ENTRIES
from sglang_kimi.settings import HARDENING_ENV
from sglang_kimi.speculative.registrations import ENTRIES as SPECULATIVE_ENTRIES
from sglang_kimi.version import SUPPORTED_SGLANG, __version__, sglang_at_least, version_in_range

__all__ = ["ALWAYS", "CPU_ONLY", "CUDA_STAND_IN", "Entry", "REGISTRATIONS", "register_all", "registration_state"]


PLUGIN_ENTRIES: tuple[Entry, ...] = (
    Entry(
        "sglang-version",
        "sglang.version.__version__",
        "sglang_kimi.plugin:check_sglang_version",
        "logs one line when the installed SGLang is outside the tested range",
    ),
    Entry(
        "server-info",
        "sglang.srt.managers.scheduler.Scheduler.get_internal_state",
        "sglang_kimi.server_info:install_server_info",
        "reports the plugin's version and this table's outcome in /server_info from the scheduler process",
    ),
    Entry(
        "plugin-flags",
        "sglang.srt.server_args.ServerArgs.add_cli_args",
        "sglang_kimi.parser_flags:install_flag_help",
        "adds the plugin's server flags (--speculative-dflash-tree-budget, ...) to `launch_server --help`",
    ),
    Entry(
        "plugin-flags-parse",
        "sglang.srt.server_args.ServerArgs.from_cli_args",
        "sglang_kimi.parser_flags:install_flag_parse",
        "keeps the plugin flags' values on the server args (as bookkeeping SGLang pickles into its subprocesses)",
    ),
)

# area -> its entries, in the order they are registered
AREAS: dict[str, tuple[Entry, ...]] = {
    "plugin": PLUGIN_ENTRIES,
    "platform": PLATFORM_ENTRIES,
    "speculative": SPECULATIVE_ENTRIES,
    "models": MODEL_ENTRIES,
    "hardening": HARDENING_ENTRIES,
}
REGISTRATIONS: tuple[Entry, ...] = tuple(entry for entries in AREAS.values() for entry in entries)
AREA_OF: dict[str, str] = {entry.name: area for area, entries in AREAS.items() for entry in entries}

# name -> "ok" | "skipped: <why>" | "failed: <error>"; filled by register_all() in this process.
STATUS: dict[str, str] = {}
_registered = False


def hardening_on(environ=None) -> bool:
    """Whether the hardening group registers: on unless ``SGLANG_KIMI_HARDENING=0``."""
    return (os.environ if environ is None else environ).get(HARDENING_ENV, "1") != "0"


def skip_reason(entry: Entry) -> str | None:
    """Why ``entry`` does not apply in this process (None when it does)."""
    if AREA_OF.get(entry.name) == "hardening" and not hardening_on():
        return f"{HARDENING_ENV}=0 leaves SGLang's own API behaviour"
    if entry.when == CPU_ONLY and os.environ.get("SGLANG_USE_CPU_ENGINE", "0").lower() not in ("1", "true"):
        return f"only when {entry.when}"
    if entry.when == CUDA_STAND_IN and not cuda_without_sgl_kernel():
        return f"only {entry.when}"
    if not installed_sglang_has(entry):
        return f"needs SGLang {'.'.join(map(str, entry.since))} or later"
    return None


def installed_sglang_has(entry: Entry) -> bool:
    """Whether the installed SGLang is at least the release ``entry`` needs (``Entry.since``)."""
    return entry.since is None or sglang_at_least(entry.since)[0]


def _load(dotted: str):
    module_name, _, attr = dotted.partition(":")
    return getattr(importlib.import_module(module_name), attr)


def register_all() -> None:
    """Run every entry of :data:`REGISTRATIONS` once in this process; never raises."""
    global _registered
    if _registered:
        return
    _registered = True
    for entry in REGISTRATIONS:
        skip = skip_reason(entry)
        if skip:
            STATUS[entry.name] = f"skipped: {skip}"
            continue
        try:
            skipped = _load(entry.install)(entry.target, *entry.hooks)
            STATUS[entry.name] = f"skipped: {skipped}" if skipped else "ok"
        except Exception as exc:  # SGLang swallows plugin errors; record ours so they stay visible
            STATUS[entry.name] = f"failed: {type(exc).__name__}: {exc}"
            if getattr(exc, "names_the_fix", False):  # a setting's error: its message is the whole story
                logger.error("sglang-kimi: registration %r failed: %s", entry.name, exc)
            else:
                logger.error("sglang-kimi: registration %r failed:\n%s", entry.name, traceback.format_exc())
    failed = [name for name, state in STATUS.items() if state.startswith("failed")]
    logger.info(
        "sglang-kimi %s registered %d entries%s",
        __version__,
        len(STATUS) - len(failed),
        f"; FAILED: {', '.join(failed)}" if failed else "",
    )


def registration_state() -> dict:
    """The plugin's registrations in this process, as reported in /server_info and by `doctor`: each entry's
    outcome, with "ok" hooks that SGLang then failed to apply reported as failed."""
    from sglang_kimi.hooks import hook_applied, registered_targets

    status = dict(STATUS)
    hooked = registered_targets()
    for entry in REGISTRATIONS:
        if status.get(entry.name) == "ok" and entry.target in hooked and not hook_applied(entry.target):
            status[entry.name] = "failed: SGLang did not apply the hook (see the server log)"
    return {
        "version": __version__,
        "pid": os.getpid(),
        "supported_sglang": list(SUPPORTED_SGLANG),
        "hardening": "on" if hardening_on() else f"off ({HARDENING_ENV}=0)",
        "registrations": status,
        "failed": sorted(name for name, state in status.items() if state.startswith("failed")),
    }


def check_sglang_version(target: str):
    """The ``sglang-version`` entry: one warning when the installed SGLang is outside the tested range."""
    from sglang.version import __version__ as sglang_version

    if not version_in_range(sglang_version, SUPPORTED_SGLANG):
        lo, hi = SUPPORTED_SGLANG
        tested = lo if lo == hi else f"{lo} to {hi}"
        logger.warning(
            "sglang-kimi %s is tested with sglang %s; the installed sglang is %s: its hooks may not apply",
            __version__,
            tested,
            sglang_version,
        )
        return f"sglang {sglang_version} is outside the tested range {tested}"
    return None
