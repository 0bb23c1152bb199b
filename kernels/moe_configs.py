"""Triton fused-MoE config tables for Kimi's verify shapes, served through SGLang's config lookup.

What SGLang does (``sglang/srt/layers/moe/moe_runner/triton_utils/fused_moe_triton_config.py``): the fused-MoE
Triton kernel takes its tile sizes from a JSON table ``{M: {BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K,
GROUP_SIZE_M, num_warps, num_stages, ...}}`` (M = tokens in the batch; the row nearest to the actual M is used)
found by ``get_moe_configs(E, N, dtype, block_n, block_k, per_channel_quant, down_moe)`` under the file name::

    E={E},N={N},device_name={torch device name, spaces -> _}[,dtype={dtype}][,block_shape=[bn, bk]][_down].json

with E = experts on this rank (384 for Kimi; 385 with the shared expert fused in; 384 / ep under expert
parallelism) and N = ``w2.shape[2]`` = the per-rank shard of ``moe_intermediate_size`` = 2048 / tp (256 at TP8;
the gate+up weight w13 is 2N wide). A missing file means SGLang's generic default tiles.

Speculative verify runs the MoE at M = batch x draft tokens (2..16 per request), small M where the right tiles
matter most. This module ships tables for the Kimi keys SGLang has no file for, on the devices we target, and
installs an AROUND hook on ``get_moe_configs`` that returns the plugin's table when one exists for the exact key
(device name included) and otherwise calls SGLang's own lookup unchanged. Precedence::

    $SGLANG_KIMI_MOE_CONFIG_DIR (tables written by `sglang-kimi tune moe`)  >  kernels/configs/moe/ (shipped)
    >  SGLang's lookup (its shipped files, then its defaults)

**The shipped tables are starting points, not tuned numbers**: each is a verbatim copy of the SGLang-shipped table
for the *same device and dtype* whose shape is nearest (same N if possible, then nearest E), recorded in
``kernels/configs/moe/PROVENANCE.json`` (source file, Triton version directory, reason). They are better than
SGLang's generic defaults for a shape it has no file for, and they are replaced, row by row for the verify M values,
when ``sglang-kimi tune moe`` (``moe_tuner.tune_moe``) is run on the GPU. Regenerate them with
``derive_starting_tables`` in ``tests/support/moe_tables.py`` (the tests check it reproduces them). This module is
what serving imports; the offline tuner is ``moe_tuner.py``.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re
from pathlib import Path

logger = logging.getLogger("sglang_kimi")


MOE_CONFIG_MODULE = "sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe_triton_config"


HOOK_TARGET = MOE_CONFIG_MODULE + ".get_moe_configs"


SHIPPED_DIR = Path(__file__).resolve().parent / "configs" / "moe"


PROVENANCE_FILE = "PROVENANCE.json"


USER_DIR_ENV = "SGLANG_KIMI_MOE_CONFIG_DIR"


DEFAULT_USER_DIR = Path.home() / ".cache" / "sglang_kimi" / "moe_configs"


# Kimi-K2.6 MoE: 384 routed experts (+1 when the shared expert is fused in), hidden 7168, moe_intermediate 2048, top-8.
KIMI_EXPERTS = 384


KIMI_HIDDEN = 7168


KIMI_MOE_INTERMEDIATE = 2048


KIMI_TOPK = 8


VERIFY_DRAFT_TOKENS = tuple(range(2, 17))  # tokens verified per request per step (root + drafts)


VERIFY_BATCHES = (1, 2, 4, 8, 16, 32, 64)


# Devices we target, as SGLang names them (torch.cuda.get_device_name with spaces replaced).
TARGET_DEVICES = ("NVIDIA_H100_80GB_HBM3", "NVIDIA_H200", "AMD_Instinct_MI300X", "AMD_Instinct_MI325X")


# (dtype selector, block_shape) variants of the Kimi MoE the tables cover.
FP8_BLOCK = ("fp8_w8a8", (128, 128))


BF16 = (None, None)


def verify_m_values(batches=VERIFY_BATCHES, draft_tokens=VERIFY_DRAFT_TOKENS) -> list[int]:
    """Distinct M = batch x draft tokens, sorted. Example: batches (1, 2), tokens (2, 4) -> [2, 4, 8]."""
    return sorted({b * d for b in batches for d in draft_tokens})


def config_file_name(
    E: int,
    N: int,
    device_name: str,
    dtype: str | None = None,
    block_shape: tuple[int, int] | list[int] | None = None,
    per_channel_quant: bool = False,
    down_moe: bool = False,
) -> str:
    """SGLang's ``get_config_file_name`` for an explicit device name (used to name the shipped files; the hook
    itself asks SGLang's function, so the live naming is SGLang's by construction)."""
    device = device_name.replace(" ", "_")
    dtype_sel = f",dtype={dtype}" if dtype else ""
    block_sel = f",block_shape={list(block_shape)}" if block_shape and all(block_shape) else ""
    pcq = ",per_channel_quant=True" if per_channel_quant else ""
    return f"E={E},N={N},device_name={device}{dtype_sel}{block_sel}{pcq}{'_down' if down_moe else ''}.json"


_NAME_RE = re.compile(
    r"^E=(?P<E>\d+),N=(?P<N>\d+),device_name=(?P<device>[^,]*?)(?:,dtype=(?P<dtype>[a-z0-9_]+?))?"
    r"(?:,block_shape=\[(?P<bn>\d+), (?P<bk>\d+)\])?(?P<pcq>,per_channel_quant=True)?(?P<down>_down)?\.json$"
)


def parse_config_file_name(name: str) -> dict | None:
    """Inverse of :func:`config_file_name`; None for names that are not MoE tables."""
    m = _NAME_RE.match(name)
    if not m:
        return None
    block = (int(m["bn"]), int(m["bk"])) if m["bn"] else None
    return {
        "E": int(m["E"]),
        "N": int(m["N"]),
        "device": m["device"],
        "dtype": m["dtype"],
        "block_shape": block,
        "per_channel_quant": bool(m["pcq"]),
        "down_moe": bool(m["down"]),
    }


def read_table(path: Path) -> dict[int, dict]:
    """A table file -> ``{M: config}`` exactly as SGLang reads it (keys starting with "_" are notes, skipped)."""
    with open(path) as f:
        raw = json.load(f)
    return {int(k): v for k, v in raw.items() if not k.startswith("_")}


def user_table_dir(environ=None) -> Path:
    """The folder of ``sglang-kimi tune moe`` tables: ``$SGLANG_KIMI_MOE_CONFIG_DIR`` as given, else the default."""
    env = os.environ if environ is None else environ
    return Path(env.get(USER_DIR_ENV, str(DEFAULT_USER_DIR)))


def table_dirs() -> list[Path]:
    """Where the hook looks, highest precedence first."""
    return [user_table_dir(), SHIPPED_DIR]


def find_table(file_name: str, dirs: list[Path] | None = None) -> tuple[dict[int, dict], Path] | None:
    """The plugin's table for ``file_name`` and where it came from, or None when no plugin directory has it."""
    for d in dirs if dirs is not None else table_dirs():
        path = Path(d) / file_name
        if path.is_file():
            return read_table(path), path
    return None


# file name -> (table, path) for every table the hook served in this process (for `doctor`)
SERVED: dict[str, str] = {}


def _sglang_config_file_name(E, N, dtype, block_shape, per_channel_quant, down_moe) -> str:
    import importlib

    module = importlib.import_module(MOE_CONFIG_MODULE)
    return module.get_config_file_name(E, N, dtype, block_shape, per_channel_quant, down_moe=down_moe)


def _deterministic_inference() -> bool:
    try:
        from sglang.srt.runtime_context import get_exec

        return bool(get_exec().deterministic.enable_deterministic_inference)
    except Exception:  # noqa: BLE001 - outside a server process there is no exec context: not deterministic
        return False


@functools.lru_cache(maxsize=None)
def _cached_table(file_name: str, dirs: tuple[str, ...]):
    found = find_table(file_name, [Path(d) for d in dirs])
    if found is None:
        return None
    table, path = found
    return table, str(path)


def around_get_moe_configs(
    original,
    E: int,
    N: int,
    dtype,
    block_n=0,
    block_k=0,
    per_channel_quant: bool = False,
    down_moe: bool = False,
):
    """AROUND hook for SGLang's ``get_moe_configs``: the plugin's table for this exact key, else SGLang's lookup."""
    if _deterministic_inference():  # SGLang then uses fixed default tiles on purpose; keep that
        return original(E, N, dtype, block_n, block_k, per_channel_quant=per_channel_quant, down_moe=down_moe)
    name = _sglang_config_file_name(E, N, dtype, [block_n, block_k], per_channel_quant, down_moe)
    found = _cached_table(name, tuple(str(d) for d in table_dirs()))
    if found is None:
        return original(E, N, dtype, block_n, block_k, per_channel_quant=per_channel_quant, down_moe=down_moe)
    table, path = found
    if name not in SERVED:
        logger.info("sglang-kimi: MoE kernel config %s from %s", name, path)
    SERVED[name] = path
    return dict(table)


def _current_device_name() -> str | None:
    import torch

    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_name(torch.cuda.current_device()).replace(" ", "_")


def tables_for_device(device_name: str, dirs: list[Path] | None = None) -> list[tuple[str, Path]]:
    """(file name, path) of every plugin table for ``device_name``, highest-precedence copy of each name."""
    seen: dict[str, Path] = {}
    for d in dirs if dirs is not None else table_dirs():
        d = Path(d)
        if not d.is_dir():
            continue
        for path in sorted(d.glob("*.json")):
            info = parse_config_file_name(path.name)
            if info and info["device"] == device_name and path.name not in seen:
                seen[path.name] = path
    return sorted(seen.items())


def install_moe_overrides(target: str):
    """Register the AROUND hook on SGLang's ``get_moe_configs``. Returns None, or why it skipped."""
    device = _current_device_name()
    if device is None:
        return "no GPU (the Triton fused-MoE kernel runs on CUDA/ROCm only)"
    if not tables_for_device(device):
        return f"no plugin MoE tables for {device} (run `sglang-kimi tune moe` to make some)"
    from sglang_kimi.hooks import hook

    hook(target, around_get_moe_configs, "AROUND")
    return None


def moe_override_state() -> list[dict]:
    """What the MoE hook serves in this process, for ``active_overrides``."""
    device = _current_device_name()
    if device is None:
        return [{"kind": "moe-config", "active": False, "why": "no GPU"}]
    rows = []
    for name, path in tables_for_device(device):
        rows.append(
            {
                "kind": "moe-config",
                "key": name,
                "path": str(path),
                "active": name in SERVED,
                "why": "tuned with sglang-kimi tune moe"
                if Path(path).parent != SHIPPED_DIR
                else "starting point copied from the nearest SGLang table for this device (see PROVENANCE.json)",
            }
        )
    return rows
