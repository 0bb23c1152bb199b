#!/usr/bin/env python
"""Load drafter checkpoints with SGLang's own config reader and model classes (CPU, world size 1).

    python scripts/_drafter_sglang_check.py sglang_kimi/assets/tiny-kimi-k2.6-dflash \
        sglang_kimi/assets/tiny-kimi-k2.6-eagle3

For each folder: SGLang's ``get_config`` reads config.json; DFlash configs go through
``dflash_utils.parse_dflash_draft_config`` (block size, target layer ids, mask token id); the model class named by
``architectures`` is built from SGLang's ``ModelRegistry``; every parameter is filled with NaN and SGLang's
``load_weights`` streams the safetensors in: afterwards every parameter except the target-shared embedding must
be finite (so every SGLang parameter received a checkpoint tensor) and every fused tensor must equal ours.
Then pieces of the computation are compared with ``sglang_kimi.speculators``: DFlash RoPE cache and context K/V
(``project_target_hidden`` / ``kv_proj_only`` / ``apply_k_norm`` / ``apply_k_rope``); EAGLE3 ``hot_token_id``.
Prints one JSON report per folder; exits 1 on any failure. Needs the CPU shims on PYTHONPATH (set here).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _reexec_with_cpu_env() -> None:
    shims = str(REPO / "sglang_kimi" / "platform" / "cpu" / "shims")
    if os.environ.get("SGLANG_USE_CPU_ENGINE") == "1" and shims in os.environ.get("PYTHONPATH", ""):
        return
    env = dict(os.environ, SGLANG_USE_CPU_ENGINE="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [shims, env.get("PYTHONPATH")]))
    os.execve(sys.executable, [sys.executable, *sys.argv], env)


def publish_cpu_context() -> None:
    from types import SimpleNamespace

    from sglang.srt.runtime_context import get_parallel, reset_context
    from sglang.srt.server_args import ServerArgs
    from sglang.test.parallel_groups import publish

    reset_context()
    publish(ServerArgs(model_path="dummy", device="cpu"), role="test")
    get_parallel().override_permanently(
        pp_group=SimpleNamespace(is_last_rank=True, is_first_rank=True, world_size=1, rank_in_group=0)
    )


def check(path: Path) -> dict:
    import torch
    from safetensors.torch import load_file
    from sglang.srt.models.registry import ModelRegistry
    from sglang.srt.utils.hf_transformers_utils import get_config

    from sglang_kimi.speculators.configs import DFLASH_ARCHITECTURES
    from sglang_kimi.speculators.reference import dflash, eagle3
    from sglang_kimi.speculators.reference.layers import rope_for

    hf_config = get_config(str(path), trust_remote_code=False)
    arch = hf_config.architectures[0]
    model_cls, _ = ModelRegistry.resolve_model_cls([arch])
    report: dict = {
        "path": str(path),
        "architecture": arch,
        "sglang_class": f"{model_cls.__module__}.{model_cls.__name__}",
    }
    torch.manual_seed(0)
    with torch.device("cpu"):
        model = model_cls(hf_config).float()
    params = dict(model.named_parameters())
    with torch.no_grad():
        for p in params.values():
            p.fill_(float("nan"))
    weights = load_file(path / "model.safetensors")
    model.load_weights([(k, v.float() if v.is_floating_point() else v) for k, v in weights.items()])
    shared = {n for n in params if "embed_tokens" in n}
    unfilled = sorted(n for n, p in params.items() if n not in shared and not torch.isfinite(p).all())
    report.update(sglang_parameters=sorted(params), checkpoint_tensors=sorted(weights), unfilled=unfilled)
    ok = not unfilled

    if arch in DFLASH_ARCHITECTURES:
        from sglang.srt.speculative.dflash_utils import parse_dflash_draft_config

        parsed = parse_dflash_draft_config(draft_hf_config=hf_config)
        ours = dflash.DFlashDrafter.from_pretrained(path)
        cfg = ours.config
        report["sglang_parsed"] = {
            "block_size": parsed.resolve_block_size(default=16),
            "target_layer_ids": parsed.resolve_target_layer_ids(target_num_layers=parsed.num_target_layers or 0),
            "mask_token_id": parsed.mask_token_id,
            "num_target_layers": parsed.num_target_layers,
        }
        ok &= report["sglang_parsed"] == {
            "block_size": cfg.block_size,
            "target_layer_ids": cfg.resolve_target_layer_ids(),
            "mask_token_id": cfg.mask_token_id,
            "num_target_layers": cfg.num_target_layers,
        }
        # fused tensors equal ours, RoPE cache equal, context K/V equal
        attn, our_attn = model.layers[0].self_attn, ours.layers[0].self_attn
        qkv = torch.cat([our_attn.q_proj.weight, our_attn.k_proj.weight, our_attn.v_proj.weight])
        ok &= torch.equal(attn.qkv_proj.weight, qkv)
        rope = attn.rotary_emb
        pos = torch.arange(0, 300)
        cos, sin = rope_for(cfg).cos_sin(pos)
        cache = rope.cos_sin_cache[pos].float()
        rope_err = max(
            (cache[:, : cos.shape[1]] - cos).abs().max().item(), (cache[:, cos.shape[1] :] - sin).abs().max().item()
        )
        report["rope"] = {
            "sglang_mscale": float(rope.mscale),
            "ours": cfg.rope_attention_factor,
            "max_abs_diff": rope_err,
        }
        ok &= rope_err < 1e-5 and abs(rope.mscale - cfg.rope_attention_factor) < 1e-12
        target_hidden = torch.randn(5, ours.fc.in_features)
        ctx_sg = model.project_target_hidden(target_hidden)
        ctx_ours = ours.project_context(target_hidden)
        k, v = attn.kv_proj_only(ctx_sg)
        k = attn.apply_k_rope(torch.arange(5), attn.apply_k_norm(k))
        ok_k, ok_v = ours.layers[0].self_attn.context_kv(ctx_ours[None], *rope_for(cfg).cos_sin(torch.arange(5)[None]))
        kv_err = max(
            (k.view_as(ok_k[0]) - ok_k[0]).abs().max().item(), (v.view_as(ok_v[0]) - ok_v[0]).abs().max().item()
        )
        report["context_kv_max_abs_diff"] = kv_err
        ok &= kv_err < 1e-4
    else:
        ours = eagle3.Eagle3Drafter.from_pretrained(path)
        hot = model.get_hot_token_id()
        report["hot_token_id_matches_token_map"] = bool(hot is not None and torch.equal(hot, ours.token_map))
        ok &= report["hot_token_id_matches_token_map"] or ours.config.draft_vocab_size == ours.config.vocab_size
        layer = model.model.layers[0] if hasattr(model.model, "layers") else model.model.midlayer
        if hasattr(layer.self_attn, "qkv_proj"):
            a = ours.midlayer.self_attn
            ok &= torch.equal(
                layer.self_attn.qkv_proj.weight, torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight])
            )
        report["lm_head_rows"] = int(getattr(model.lm_head, "org_vocab_size", model.lm_head.weight.shape[0]))
        ok &= report["lm_head_rows"] == ours.config.draft_vocab_size
    report["ok"] = bool(ok)
    return report


def main(argv: list[str]) -> int:
    _reexec_with_cpu_env()
    sys.path.insert(0, str(REPO))
    import torch

    torch.set_num_threads(1)
    publish_cpu_context()
    failed = False
    for arg in argv:
        report = check(Path(arg))
        failed |= not report["ok"]
        brief = {k: v for k, v in report.items() if k not in ("sglang_parameters", "checkpoint_tensors")}
        print(json.dumps(brief, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
