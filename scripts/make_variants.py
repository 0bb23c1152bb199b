#!/usr/bin/env python
"""Write the embedded tiny Kimi-K2.6 in the real checkpoints' quantized layouts.

    python scripts/make_variants.py --out /tmp/variants                  # int4/ and mxfp4/ next to each other
    python scripts/make_variants.py --out /tmp/variants --formats mxfp4 --reference

- ``int4``: Kimi-K2.6's native INT4 compressed-tensors ``pack-quantized`` layout (``text_config.quantization_config``,
  group 32 symmetric, ``weight_packed`` int32 / ``weight_scale`` bf16 / ``weight_shape``; only routed experts).
- ``mxfp4``: the AMD Quark MXFP4 layout (top-level ``quantization_config``, fp4 E2M1 packed two per byte in
  ``weight`` uint8, E8M0 ``weight_scale`` uint8 per group of 32; lm_head, attention, router, shared experts, the
  dense layer-0 MLP and vision excluded).

``--reference`` also writes ``<format>-reference/``: the float32 checkpoint each variant stands for (what a served
variant is checked against). The conversion lives in ``sglang_kimi.models.quant.formats`` (tests call it directly).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sglang_kimi.models.quant import formats  # noqa: E402
from sglang_kimi.models.tiny import TINY_MODEL_DIR  # noqa: E402


def make_variants(out: Path, fmts=formats.FORMATS, source: Path = TINY_MODEL_DIR, reference: bool = False) -> dict:
    """Write each format of ``source`` under ``out/<format>`` (and ``out/<format>-reference``); returns the paths."""
    paths = {}
    for fmt in fmts:
        paths[fmt] = formats.write_variant(source, out / fmt, fmt)
        if reference:
            paths[f"{fmt}-reference"] = formats.dequantize_checkpoint(out / fmt, out / f"{fmt}-reference")
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="folder that receives one sub-folder per format")
    parser.add_argument("--formats", nargs="+", choices=formats.FORMATS, default=list(formats.FORMATS))
    parser.add_argument("--source", type=Path, default=TINY_MODEL_DIR, help="bf16 Kimi checkpoint to convert")
    parser.add_argument("--reference", action="store_true", help="also write the dequantized float32 references")
    args = parser.parse_args(argv)
    for name, path in make_variants(args.out, args.formats, args.source, args.reference).items():
        size = sum(f.stat().st_size for f in path.glob("*.safetensors"))
        print(f"{name:<18} {path}  ({size / 2**20:.1f} MiB of weights)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
