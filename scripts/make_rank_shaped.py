#!/usr/bin/env python
"""Write configs for one rank of Kimi-K2.6 at tensor-parallel size N, and its DFlash and EAGLE3 drafters, to serve
with random weights (``--load-format dummy``) on one device: the cost of a step at Kimi's real shapes.

    python scripts/make_rank_shaped.py --out /tmp/rank --layers 8              # TP 8, tensor-parallel MoE
    python scripts/make_rank_shaped.py --out /tmp/rank --layers 8 --moe ep     # the rank's 48 whole experts, top-1
    python scripts/make_rank_shaped.py --out /tmp/rank-cpu --layers 5 --scale 28   # hidden 256: a CPU-sized twin

Writes ``OUT/target`` (Kimi-K2.6's wrapper config around the rank's DeepSeek-V3 text config, with the embedded tiny
model's tokenizer and Kimi's generation config), ``OUT/dflash`` (Kimi-K2.5-DFlash's shapes per rank) and
``OUT/eagle3`` (Kimi-K2.6 EAGLE3's MLA layer per rank; each drafter only when the target is deep enough for its
captured layers: 2 layers for DFlash, 5 for EAGLE3): config files only, no weights. Serve them with
``--load-format dummy`` (the drafters load the same way unless ``--speculative-draft-load-format`` says otherwise)::

    python -m sglang.launch_server --model-path OUT/target --load-format dummy --trust-remote-code \\
        --speculative-algorithm DFLASH --speculative-draft-model-path OUT/dflash

The shapes, and what the one-device rank differs from a rank of a TP deployment in, are in
``sglang_kimi/models/kimi_shapes.py`` and ``docs/kimi-scale.md``. Prints the parameters one rank holds.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sglang_kimi.models import kimi_shapes as ks  # noqa: E402
from sglang_kimi.speculators.pairing import validate_pair  # noqa: E402

TOKENIZER_SOURCE = REPO / "sglang_kimi" / "assets" / "tiny-kimi-k2.6"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def rank_parameters(text: dict) -> dict[str, int]:
    """Parameters one rank holds, by part (its text config is already the rank's)."""
    h, heads = text["hidden_size"], text["num_attention_heads"]
    qk = text["qk_nope_head_dim"] + text["qk_rope_head_dim"]
    attention = (
        text["q_lora_rank"] * h
        + heads * qk * text["q_lora_rank"]
        + (text["kv_lora_rank"] + text["qk_rope_head_dim"]) * h
        + heads * (text["qk_nope_head_dim"] + text["v_head_dim"]) * text["kv_lora_rank"]
        + h * heads * text["v_head_dim"]
    )
    dense_layers = text["first_k_dense_replace"]
    moe_layers = text["num_hidden_layers"] - dense_layers
    expert = 3 * h * text["moe_intermediate_size"]
    return {
        "attention": text["num_hidden_layers"] * attention,
        "dense_mlp": dense_layers * 3 * h * text["intermediate_size"],
        "routed_experts": moe_layers * text["n_routed_experts"] * expert,
        "shared_experts": moe_layers * text["n_shared_experts"] * expert,
        "router": moe_layers * text["n_routed_experts"] * h,
        "embedding_and_lm_head": 2 * text["vocab_size"] * h,
    }


def make_rank_shaped(out: Path, shape: ks.RankShape) -> tuple[dict[str, Path], dict[str, str]]:
    """Write the folders under ``out``: the target's, and each drafter's that the depth allows (a drafter reads
    distinct target layers). Returns (the paths, why each drafter not written was not). Each drafter is checked
    against the target the way serving checks it (``speculators/pairing.py``)."""
    target = ks.rank_target_config(shape)
    drafters, skipped = {}, {}
    for name, make in (("dflash", ks.rank_dflash_config), ("eagle3", ks.rank_eagle3_config)):
        try:
            drafters[name] = make(shape)
        except ks.RankShapeError as e:
            skipped[name] = str(e)
    for name, config in drafters.items():
        validate_pair(target, config, expected_algorithm="DFLASH" if name == "dflash" else "EAGLE3")
    paths = {"target": out / "target", **{name: out / name for name in drafters}}
    for path in paths.values():
        path.mkdir(parents=True, exist_ok=True)
    (paths["target"] / "config.json").write_text(json.dumps(target, indent=2) + "\n")
    generation = {"bos_token_id": ks.BOS_ID, "eos_token_id": [ks.EOS_ID, ks.IM_END_ID], "pad_token_id": ks.PAD_ID}
    (paths["target"] / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    for name in TOKENIZER_FILES:  # text in, token ids out: random weights decode to noise either way
        shutil.copyfile(TOKENIZER_SOURCE / name, paths["target"] / name)
    for name, config in drafters.items():
        (paths[name] / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return paths, skipped


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="folder that receives target/, dflash/, eagle3/")
    parser.add_argument("--tp", type=int, default=8, help="the tensor-parallel size the rank belongs to (default 8)")
    parser.add_argument(
        "--moe", choices=ks.MOE_MODES, default=ks.MOE_TP,
        help="tp: every expert, 1/TP of its width (default); ep: 1/TP of the experts, whole",
    )  # fmt: skip
    parser.add_argument("--layers", type=int, default=ks.KIMI_K26_TEXT["num_hidden_layers"], help="decoder layers")
    parser.add_argument("--scale", type=int, default=1, help="divide every width by this (1: Kimi-K2.6's own)")
    args = parser.parse_args(argv)
    try:
        shape = ks.RankShape(tp=args.tp, moe=args.moe, layers=args.layers, scale=args.scale)
        paths, skipped = make_rank_shaped(args.out, shape)
    except ks.RankShapeError as e:
        parser.error(str(e))
    text = ks.rank_text_config(shape)
    params = rank_parameters(text)
    total = sum(params.values())
    print(f"one rank of Kimi-K2.6 at TP {shape.tp} ({shape.moe} MoE), {shape.layers} layers, scale 1/{shape.scale}:")
    for part, n in params.items():
        print(f"  {part:<22} {n / 1e9:8.3f} B parameters")
    print(f"  {'total':<22} {total / 1e9:8.3f} B parameters ({2 * total / 2**30:.1f} GiB in bf16)")
    for name, path in paths.items():
        print(f"{name:<7} {path}")
    for name, why in skipped.items():
        print(f"{name:<7} not written: {why}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
