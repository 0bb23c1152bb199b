#!/usr/bin/env python
"""Train the DFlash2 drafter of the embedded tiny Kimi-K2.6: the shipped DFlash drafter (frozen) with a candidate
selector trained on top, on CPU, seeded, in SGLang's DFlash2 format.

    python scripts/train_dflash2_selector.py            # sglang_kimi/assets/tiny-kimi-k2.6-dflash2/
    python scripts/train_dflash2_selector.py --prompts 64 --minutes 0.5 --out /tmp/dflash2   # a quick run

A DFlash2 drafter drafts a block as DFlash does, then takes each position's top ``--top-k`` tokens under the
target's LM head (their logits: the unary scores) and walks them: the score of candidate c at position e after
candidate p at e - 1 is ``unary[e, c] + <A[p] * W h_e, B[c]>`` (A, B: [vocab, r] codebooks, W: [r, hidden]; the
anchor precedes position 0), the chain takes the best edge step by step. The selector is SGLang's own
(``sglang.srt.models.dflash.CandidateSelector``: its ``build_lattice`` scores, its ``sample_path`` walks), trained
here with teacher forcing: at each position the true previous token is the predecessor, and the loss is the
cross-entropy over the K candidates of the true next token (positions whose true tokens fall outside the top K are
skipped), weighted like DFlash's exp(-(k-1)/gamma). Data: ``train_drafters.py``'s GSM8K regeneration (or
``--data``, SpecForge's conversation rows), the blocks its DFlash training draws.

Saves config.json (``DFlash2DraftModel``, ``dflash_config.selector_rank`` / ``selector_top_k``) and
model.safetensors (the DFlash tensors and ``candidate_selector.*``), loads them back with SGLang's classes
(``_drafter_sglang_check.py``), and merges a report into ``bench/results/bench_tau_training.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _drafter_sglang_check
import train_drafters as td

REPO = td.REPO


def selector_loss(selector, logits, hidden, blocks, top_k: int, decay):
    """(loss, metrics) of the selector on the blocks' drafts: logits [S, n, B-1, V], hidden [S, n, B-1, H]."""
    import torch
    import torch.nn.functional as F

    d = logits.shape[2]
    vals, ids = logits.topk(top_k, dim=-1)  # [S, n, D, K]
    b = vals.shape[0] * vals.shape[1]
    ids, vals, hidden = ids.reshape(b, d, top_k), vals.reshape(b, d, top_k), hidden.reshape(b, d, -1)
    labels, ok = blocks.labels.reshape(b, d), blocks.label_ok.reshape(b, d)
    anchor = blocks.ids[:, :, 0].reshape(b)
    scores = selector.build_lattice(candidate_ids=ids, unary_logits=vals.float(), hidden_states=hidden.float(),
                                    anchor_token_ids=anchor)  # [b, D, K, K]  # fmt: skip
    hit = ids == labels[:, :, None]  # [b, D, K]
    present = hit.any(-1) & ok
    index = hit.float().argmax(-1)  # [b, D]: the true token's candidate (where present)
    prev_index = torch.cat([torch.zeros_like(index[:, :1]), index[:, :-1]], dim=1)  # slot 0: the anchor's row 0
    prev_present = torch.cat([torch.ones_like(present[:, :1]), present[:, :-1]], dim=1)
    rows = scores.gather(2, prev_index[:, :, None, None].expand(-1, -1, 1, top_k))[:, :, 0]  # [b, D, K]
    valid = present & prev_present
    ce = F.cross_entropy(rows.flatten(0, 1), index.flatten(), reduction="none").view(b, d)
    w = decay[None, :] * valid
    loss = (ce * w).sum() / w.sum().clamp(min=1)
    with torch.no_grad():  # the chain SGLang serves: the selector's greedy walk
        greedy = torch.ones(b, dtype=torch.bool)
        tokens, _ = selector.sample_path(candidate_ids=ids, scores=scores, uniforms=torch.zeros(b, d),
                                         temperatures=torch.ones(b), greedy_mask=greedy)  # fmt: skip
        run = torch.cumprod(((tokens == labels) & ok).float(), dim=1).sum(1)
        argmax_run = torch.cumprod(((ids[:, :, 0] == labels) & ok).float(), dim=1).sum(1)
        real = blocks.anchor_ok.reshape(b)
        metrics = {"tau_est": float(1 + run[real].mean()), "tau_est_argmax": float(1 + argmax_run[real].mean()),
                   "in_top_k": float(present.sum() / ok.sum())}  # fmt: skip
    return loss, metrics


def save(backbone_dir: Path, selector, args, out: Path) -> None:
    import torch
    from safetensors.torch import load_file, save_file

    from sglang_kimi.speculators.configs import DFlashConfig
    from sglang_kimi.speculators.drafter_tensors import SELECTOR_PREFIX

    out.mkdir(parents=True, exist_ok=True)
    config = DFlashConfig.from_pretrained(backbone_dir).to_dict()
    config["architectures"] = ["DFlash2DraftModel"]
    config["dflash_config"].update(selector_rank=args.rank, selector_top_k=args.top_k)
    DFlashConfig.from_dict(config)  # the plugin reads it back
    tensors = load_file(backbone_dir / "model.safetensors")
    for name, value in selector.state_dict().items():
        tensors[SELECTOR_PREFIX + name] = value.detach().to(torch.bfloat16).contiguous()
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")


def main() -> int:
    os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")  # SGLang's torch.compile'd lattice scoring runs eagerly
    _drafter_sglang_check._reexec_with_cpu_env()  # SGLang's model modules import its kernels' CPU shims
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backbone", type=Path, default=td.ASSETS_DIR / "tiny-kimi-k2.6-dflash", help="DFlash drafter")
    ap.add_argument("--out", type=Path, default=td.ASSETS_DIR / "tiny-kimi-k2.6-dflash2")
    ap.add_argument("--rank", type=int, default=16, help="dflash_config.selector_rank")
    ap.add_argument("--top-k", type=int, default=8, help="dflash_config.selector_top_k")
    ap.add_argument("--prompts", type=int, default=512, help="GSM8K train questions regenerated (without --data)")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--data", type=Path, help="SpecForge's regenerated-conversation rows instead")
    ap.add_argument("--minutes", type=float, default=4.0)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--anchors", type=int, default=24)
    ap.add_argument("--gamma", type=float, default=4.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--report", type=Path, default=REPO / "bench" / "results" / "bench_tau_training.json")
    args = ap.parse_args()

    import torch

    from sglang_kimi.speculators.reference import dflash
    from sglang_kimi.speculators.reference.deepseek_v3 import CompactDeepseekV3

    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    _drafter_sglang_check.publish_cpu_context()
    from sglang.srt.models.dflash import CandidateSelector

    target = CompactDeepseekV3.from_pretrained(td.tiny.TINY_MODEL)
    for p in target.parameters():
        p.requires_grad_(False)
    tokenizer = td.common.load_tokenizer()
    if args.data:
        seqs, _ = td.conversation_sequences(args.data, tokenizer, 512)
    else:
        seqs = td.regenerate(target, tokenizer, args.prompts, args.new_tokens, 64, args.seed)
    td.extract_features(target, seqs, batch=32)
    model = dflash.DFlashDrafter.from_pretrained(args.backbone).eval()
    model.attach_target(target.embed_tokens.weight, target.lm_head.weight)
    for p in model.parameters():
        p.requires_grad_(False)
    cfg = model.config
    selector = CandidateSelector(hidden_size=cfg.hidden_size, vocab_size=cfg.vocab_size, state_rank=args.rank,
                                 top_k=args.top_k)  # fmt: skip
    with torch.no_grad():  # SGLang zero-fills the codebooks for loading; a zero product has no gradient
        for codebook in (selector.predecessor_codebook, selector.successor_codebook):
            codebook.normal_(0.0, 0.1)
    params = [p.requires_grad_(True) for p in selector.parameters()]
    slots = td.layer_slots(cfg.target_layer_ids)
    decay = torch.exp(-torch.arange(cfg.block_size - 1) / args.gamma)  # [B-1]
    rng = random.Random(args.seed)

    def step_fn(step: int):
        blocks = td.sample_blocks(rng.sample(seqs, args.batch), slots, cfg.block_size, args.anchors, rng)
        with torch.no_grad():
            hidden = td.block_hidden(model, blocks)  # [S, n, B-1, H]
            logits = model.logits(hidden)
        return selector_loss(selector, logits, hidden, blocks, args.top_k, decay)

    start = time.time()
    report = td.train_loop("dflash2 selector", step_fn, params, args.minutes, args.lr, args.seed)
    save(args.backbone, selector.eval(), args, args.out)
    check = subprocess.run([sys.executable, str(REPO / "scripts" / "_drafter_sglang_check.py"), str(args.out)],
                           capture_output=True, text=True, check=False)  # fmt: skip
    print(check.stdout[-2000:], check.stderr[-2000:] if check.returncode else "")
    report.update(
        seconds_total=round(time.time() - start, 1),
        history=report["history"][-10:],
        sglang_loader_check_ok=check.returncode == 0,
        asset_bytes=(args.out / "model.safetensors").stat().st_size,
        args={k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
    )
    td.merge_report(args.report, {"dflash2_selector": report})
    print(f"wrote {args.out}; report: {args.report}")
    return 0 if check.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
