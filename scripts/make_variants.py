#!/usr/bin/env python
"""Write the embedded tiny Kimi-K2.6 in the real checkpoints' quantized layouts.

    python scripts/make_variants.py --out /tmp/variants              # int4/, mxfp4/, mxfp4-amd-k25/
    python scripts/make_variants.py --out /tmp/variants --variants mxfp4 --reference

- ``int4``: Kimi-K2.6's native INT4 compressed-tensors ``pack-quantized`` layout (``text_config.quantization_config``,
  group 32 symmetric, ``weight_packed`` int32 / ``weight_scale`` bf16 / ``weight_shape``; only routed experts).
- ``mxfp4``: the AMD Quark MXFP4 layout (top-level ``quantization_config``, fp4 E2M1 packed two per byte in
  ``weight`` uint8, E8M0 ``weight_scale`` uint8 per group of 32; lm_head, attention, router, shared experts, the
  dense layer-0 MLP and vision excluded).
- ``mxfp4-amd-k25``: the same layout with ``amd/Kimi-K2.5-MXFP4``'s wider quantization (shared experts and the dense
  layer-0 MLP in MXFP4 too; only lm_head, attention, the router and vision stay bf16).

``--reference`` also writes ``<format>-reference/``: the float32 checkpoint each variant stands for (what a served
variant is checked against). The conversion lives in ``sglang_kimi.models.quant.formats`` (tests call it directly).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sglang_kimi.assets import TINY_MODEL  # noqa: E402
from sglang_kimi.models.quant import formats  # noqa: E402


def make_variants(out: Path, names=tuple(formats.VARIANTS), source: Path = TINY_MODEL, reference: bool = False):
    """Write each variant of ``source`` under ``out/<name>`` (and ``out/<name>-reference``); returns the paths."""
    paths = {}
    for name in names:
        paths[name] = formats.write_named_variant(source, out / name, name)
        if reference:
            paths[f"{name}-reference"] = formats.dequantize_checkpoint(out / name, out / f"{name}-reference")
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="folder that receives one sub-folder per format")
    parser.add_argument("--variants", nargs="+", choices=sorted(formats.VARIANTS), default=list(formats.VARIANTS))
    parser.add_argument("--source", type=Path, default=TINY_MODEL, help="bf16 Kimi checkpoint to convert")
    parser.add_argument("--reference", action="store_true", help="also write the dequantized float32 references")
    args = parser.parse_args(argv)
    for name, path in make_variants(args.out, args.variants, args.source, args.reference).items():
        size = sum(f.stat().st_size for f in path.glob("*.safetensors"))
        print(f"{name:<18} {path}  ({size / 2**20:.1f} MiB of weights)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
