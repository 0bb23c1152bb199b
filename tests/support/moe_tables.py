"""The derivation of the MoE starting-point tables the package ships (``kernels/configs/moe/``, served by
``sglang_kimi.kernels.moe_configs``), and of their ``PROVENANCE.json``: for every Kimi key SGLang ships no table for,
the nearest SGLang table of the same device and dtype, copied verbatim. ``tests/unit/test_kernel_moe_tuning.py``
checks that it reproduces the shipped files; run :func:`derive_starting_tables` to regenerate them (after an SGLang
upgrade, say)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from sglang_kimi.kernels.moe_configs import (
    BF16,
    FP8_BLOCK,
    KIMI_EXPERTS,
    KIMI_MOE_INTERMEDIATE,
    PROVENANCE_FILE,
    SHIPPED_DIR,
    TARGET_DEVICES,
    config_file_name,
    parse_config_file_name,
    read_table,
)
from sglang_kimi.kernels.moe_tuner import _version_key


def _sglang_shipped_tables(sglang_configs_root: Path) -> list[tuple[dict, Path, str]]:
    """(parsed key, path, triton version dir) of every table SGLang ships."""
    out = []
    for vdir in sorted(sglang_configs_root.glob("triton_*")):
        for path in vdir.glob("*.json"):
            info = parse_config_file_name(path.name)
            if info:
                out.append((info, path, vdir.name))
    return out


MIN_SOURCE_EXPERTS = 64


def nearest_shipped(
    shipped: list[tuple[dict, Path, str]],
    E: int,
    N: int,
    device: str,
    dtype: str | None,
    block_shape,
) -> tuple[dict, Path, str] | None:
    """Nearest SGLang table of the same device, dtype and block shape (up-projection tables only): same N first
    (|log2 N ratio|), then nearest E, then the newest Triton version directory. Only tables of the same regime
    qualify: N within a factor of 2, and a fine-grained MoE (E >= MIN_SOURCE_EXPERTS: at verify M each expert sees
    a few tokens, unlike an 8-expert model's tables)."""
    block = tuple(block_shape) if block_shape else None
    same = [
        s
        for s in shipped
        if s[0]["device"] == device
        and s[0]["dtype"] == dtype
        and s[0]["block_shape"] == block
        and not s[0]["per_channel_quant"]
        and not s[0]["down_moe"]
        and s[0]["E"] >= MIN_SOURCE_EXPERTS
        and abs(math.log2(s[0]["N"] / N)) <= 1
    ]
    if not same:
        return None
    return min(
        same,
        key=lambda s: (abs(math.log2(s[0]["N"] / N)), abs(s[0]["E"] - E), tuple(-v for v in _version_key(s[2]))),
    )


def derive_starting_tables(
    sglang_configs_root: Path,
    out_dir: Path = SHIPPED_DIR,
    devices=TARGET_DEVICES,
    experts=(KIMI_EXPERTS, KIMI_EXPERTS + 1),
    tps=(4, 8, 16),
    variants=(FP8_BLOCK, BF16),
) -> dict[str, dict]:
    """Write the shipped starting-point tables and ``PROVENANCE.json``; returns the provenance map.

    For every (device, variant, E, N = 2048 / tp) that SGLang has no file for, copy the nearest SGLang table of the
    same device and variant verbatim. Keys SGLang already covers, and devices with no table of that variant, get
    nothing (nothing is invented). bf16 tables are made for E = 384 only (the shared expert is fused into the
    routed GEMM only in quantized checkpoints).
    """
    shipped = _sglang_shipped_tables(Path(sglang_configs_root))
    have = {(s[0]["E"], s[0]["N"], s[0]["device"], s[0]["dtype"], s[0]["block_shape"]) for s in shipped}
    out_dir.mkdir(parents=True, exist_ok=True)
    provenance = {}
    for device in devices:
        for dtype, block in variants:
            for E in experts:
                if dtype is None and E != KIMI_EXPERTS:
                    continue
                for tp in tps:
                    N = KIMI_MOE_INTERMEDIATE // tp
                    if (E, N, device, dtype, block) in have:
                        continue
                    src = nearest_shipped(shipped, E, N, device, dtype, block)
                    if src is None:
                        continue
                    info, path, vdir = src
                    name = config_file_name(E, N, device, dtype, block)
                    table = read_table(path)
                    with open(out_dir / name, "w") as f:
                        json.dump({str(k): table[k] for k in sorted(table)}, f, indent=4)
                        f.write("\n")
                    provenance[name] = {
                        "status": "starting point, not tuned: run `sglang-kimi tune moe` on this device",
                        "copied_from": f"sglang/srt/layers/moe/moe_runner/triton_utils/configs/{vdir}/{path.name}",
                        "sglang_triton_dir": vdir,
                        "why": f"SGLang ships no table for E={E},N={N} (Kimi at TP{tp}) on {device}; nearest "
                        f"table of the same device and dtype is E={info['E']},N={info['N']}",
                    }
    with open(out_dir / PROVENANCE_FILE, "w") as f:
        json.dump(dict(sorted(provenance.items())), f, indent=2)
        f.write("\n")
    return provenance
