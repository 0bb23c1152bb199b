#!/usr/bin/env python
"""Train the DFlash and EAGLE3 drafters of the embedded tiny Kimi-K2.6, on CPU, seeded, in the published formats.

    python scripts/train_drafters.py   # both: sglang_kimi/assets/tiny-kimi-k2.6-{dflash,eagle3}/
    python scripts/train_drafters.py --prompts 64 --minutes 1 --out-dir /tmp/drafters   # smoke run
    # from conversations a served target answered (`sglang-kimi drafter regenerate`), as SpecForge trains, and
    # written as a SpecForge training checkpoint that `specforge export --to hf` turns into the served folder:
    python scripts/train_drafters.py --only dflash --data regenerated.jsonl --specforge-checkpoint out/ckpt

Steps:
1. regenerate (SpecForge-style): the tiny target decodes ``"Question: {q}\\nAnswer:"`` for GSM8K *train*
   questions greedily, ``--new-tokens`` tokens each (EOS is kept like any token, as the benchmark decodes a fixed
   length); batched with a KV cache (``_drafter_common.generate_greedy``).
2. teacher features: one causal pass of the target over every regenerated sequence keeps the outputs of layers
   1..5 (bf16): DFlash reads layers ``--dflash-layers``, EAGLE3 its aux layers, the last one gives the target's
   logits (EAGLE3's soft labels).
3. DFlash (z-lab / SpecForge recipe): random anchors a in the generated part; block = [t_a, mask x (B-1)] at
   positions a..a+B-1; context = projected target features of positions < a only; bidirectional in the block;
   position k predicts t_{a+k}; cross-entropy with weights exp(-(k-1)/gamma); the target's embedding and LM head
   are frozen and not saved.
4. EAGLE3 (SpecForge recipe): draft vocabulary = the ``--draft-vocab`` most frequent generated tokens (d2t/t2d);
   rows (h_i, t_{i+1}) at position i; a training-time-test unroll of ``--ttt`` steps where step j feeds each row its
   own previous output and the token j further, at position i+j, attending to the causal step-0 rows and to its
   own earlier steps; loss = soft cross-entropy against the target's distribution restricted to the draft vocab
   (rows whose target argmax is outside it are skipped), weighted 0.8^j.
With ``--data``, step 1 reads SpecForge's regenerated-conversation rows instead (``sglang-kimi drafter regenerate``
writes them from a served target): each assistant turn is one sequence, the conversation before it rendered by the
target's chat template with the generation prompt (the context, no loss), then the turn as the template closes it
(the generated part, where anchors and labels lie); longer sequences are cut at ``--max-seq-len``.

5. save (bf16, the published layouts), load back with SGLang's own config reader and model classes
   (``_drafter_sglang_check.py``), and measure tau on a few GSM8K *test* prompts in the reference loop.

Each drafter trains for ``--minutes`` of wall time (the step count is set from the measured step time, so the
cosine schedule completes). A JSON report goes to ``bench/results/bench_tau_training.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _drafter_common as common

from sglang_kimi.assets import ASSETS_DIR
from sglang_kimi.models import tiny
from sglang_kimi.speculators import configs, pairing
from sglang_kimi.speculators.reference import dflash, eagle3
from sglang_kimi.speculators.reference.deepseek_v3 import CompactDeepseekV3
from sglang_kimi.speculators.reference.loop import ChainProposer, EagleProposer, generate

REPO = common.REPO
FEATURE_LAYERS = (1, 2, 3, 4, 5)  # stored layer outputs; 5 (the last) only feeds the teacher logits


# ---------------------------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------------------------


def regenerate(model, tokenizer, num_prompts: int, new_tokens: int, batch: int, seed: int) -> list[dict]:
    """[{"ids": prompt + continuation (list[int]), "prompt_len": int}] for num_prompts shuffled train questions."""
    prompts = common.gsm8k_prompts("train", None, tokenizer)
    random.Random(seed).shuffle(prompts)
    prompts = sorted(prompts[:num_prompts], key=len)  # similar lengths per batch: little padding
    out = []
    start = time.time()
    for i in range(0, len(prompts), batch):
        chunk = prompts[i : i + batch]
        for p, g in zip(chunk, common.generate_greedy(model, chunk, new_tokens)):
            out.append({"ids": list(p) + g, "prompt_len": len(p)})
        done = min(i + batch, len(prompts))
        print(f"  regenerated {done}/{len(prompts)} ({time.time() - start:.0f} s)", flush=True)
    return out


def conversation_sequences(path: Path, tokenizer, max_len: int) -> tuple[list[dict], dict]:
    """[{"ids", "prompt_len"}] from SpecForge's regenerated rows: one sequence per assistant turn, the context
    rendered with the generation prompt, the turn as the chat template closes it; and counts of what was left out."""
    from sglang_kimi.drafters.regenerate import read_rows, turns

    def render(messages, prompt: bool) -> list[int]:
        return list(tokenizer.apply_chat_template(messages, add_generation_prompt=prompt, tokenize=True,
                                                  return_dict=True)["input_ids"])  # fmt: skip

    seqs, skipped = [], {"rows_without_conversation": 0, "turns_not_extending_the_context": 0, "turns_past_max_len": 0}
    for row in read_rows(path):
        if isinstance(row, dict) and row.get("status", "success") != "success":
            skipped["rows_without_conversation"] += 1
            continue
        messages, _ = turns(row)
        if messages is None:
            skipped["rows_without_conversation"] += 1
            continue
        for k, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            context, full = render(messages[:k], True), render(messages[: k + 1], False)
            if full[: len(context)] != context or len(full) <= len(context) + 1:
                skipped["turns_not_extending_the_context"] += 1
                continue
            if len(context) + 2 > max_len:
                skipped["turns_past_max_len"] += 1
                continue
            seqs.append({"ids": full[:max_len], "prompt_len": len(context)})
    if not seqs:
        raise SystemExit(f"{path}: no assistant turn to train on ({skipped})")
    return sorted(seqs, key=lambda s: len(s["ids"])), skipped


def write_specforge_checkpoint(model: dflash.DFlashDrafter, folder: Path, target_name: str) -> Path:
    """SpecForge's training checkpoint of the DFlash drafter: ``training_state.pt`` (the draft's state dict, whose
    names are SpecForge's ``DFlashDraftModel``'s, and the strategy), and ``draft_config.json`` for its exporter."""
    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()}
    torch.save({"draft_state_dict": state, "strategy": "dflash"}, folder / "training_state.pt")
    config = {**model.config.to_dict(), "target_model_name_or_path": target_name}
    (folder / "draft_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return folder


@torch.no_grad()
def extract_features(model, seqs: list[dict], batch: int) -> None:
    """Adds "feats" [T, len(FEATURE_LAYERS), H] bf16 (layer outputs) to every sequence (right padding)."""
    start = time.time()
    for i in range(0, len(seqs), batch):
        chunk = seqs[i : i + batch]
        longest = max(len(s["ids"]) for s in chunk)
        ids = torch.tensor([s["ids"] + [tiny.PAD_ID] * (longest - len(s["ids"])) for s in chunk])
        positions = torch.arange(longest).expand(len(chunk), -1)
        mask = torch.ones(longest, longest, dtype=torch.bool).tril()[None].expand(len(chunk), -1, -1)
        _, hidden = model(ids, positions, mask, output_hidden_states=True)
        feats = torch.stack([hidden[layer + 1] for layer in FEATURE_LAYERS], dim=2).to(torch.bfloat16)
        for j, s in enumerate(chunk):
            s["feats"] = feats[j, : len(s["ids"])].clone()
    print(f"  features of {len(seqs)} sequences ({time.time() - start:.0f} s)", flush=True)


def layer_slots(layer_ids) -> list[int]:
    return [FEATURE_LAYERS.index(layer) for layer in layer_ids]


def pad_batch(seqs: list[dict], slots: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ids [S, T] PAD-padded, features [S, T, len(slots) * H] float32, lengths [S])."""
    longest = max(len(s["ids"]) for s in seqs)
    ids = torch.full((len(seqs), longest), tiny.PAD_ID, dtype=torch.long)
    h = seqs[0]["feats"].shape[-1]
    feats = torch.zeros(len(seqs), longest, len(slots) * h)
    for j, s in enumerate(seqs):
        n = len(s["ids"])
        ids[j, :n] = torch.tensor(s["ids"])
        feats[j, :n] = s["feats"][:, slots].float().reshape(n, -1)
    return ids, feats, torch.tensor([len(s["ids"]) for s in seqs])


def autocast(args):
    """bf16 autocast for the drafter's forward (AMX / AVX512-BF16 matmuls); weights and optimizer stay fp32."""
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16)


class Schedule:
    """Linear warmup then cosine decay to 10 % over the planned steps."""

    def __init__(self, opt, lr: float, warmup: int) -> None:
        self.opt, self.lr, self.warmup, self.total = opt, lr, warmup, None

    def set(self, step: int) -> None:
        if step < self.warmup or self.total is None:
            f = min(1.0, (step + 1) / self.warmup)
        else:
            t = min(1.0, (step - self.warmup) / max(1, self.total - self.warmup))
            f = 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t))
        for g in self.opt.param_groups:
            g["lr"] = self.lr * f


def train_loop(name: str, step_fn, params, minutes: float, lr: float, seed: int, log_every: int = 50) -> dict:
    """Runs step_fn(step) -> (loss, metrics) for ``minutes``: the step count is fixed after 30 timed steps."""
    torch.manual_seed(seed)
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.01)
    sched = Schedule(opt, lr, warmup=60)
    budget = minutes * 60
    start = time.time()
    step, history, window = 0, [], []
    while sched.total is None or step < sched.total:
        sched.set(step)
        loss, metrics = step_fn(step)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        window.append({"loss": float(loss), **metrics})
        step += 1
        if step == 30 and sched.total is None:
            per_step = (time.time() - start) / 30
            sched.total = max(60, int(budget / per_step))
            print(f"  {name}: {per_step:.2f} s/step -> {sched.total} steps", flush=True)
        if step % log_every == 0 or step == sched.total:
            avg = {k: sum(w[k] for w in window) / len(window) for k in window[0]}
            avg.update(step=step, seconds=round(time.time() - start, 1))
            history.append(avg)
            window = []
            print(
                f"  {name} step {step}: " + " ".join(f"{k} {v:.4g}" for k, v in avg.items() if k != "step"), flush=True
            )
    return {"steps": step, "seconds": round(time.time() - start, 1), "final": history[-1], "history": history}


# ---------------------------------------------------------------------------------------------------------------
# DFlash
# ---------------------------------------------------------------------------------------------------------------


def dflash_config(args) -> configs.DFlashConfig:
    t = tiny.TEXT_CONFIG
    return configs.DFlashConfig.from_dict(
        {
            "architectures": ["DFlashDraftModel"],
            "model_type": "qwen3",
            "hidden_size": t["hidden_size"],
            "num_hidden_layers": args.dflash_num_layers,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 64,
            "intermediate_size": args.dflash_intermediate,
            "vocab_size": t["vocab_size"],
            "rms_norm_eps": 1e-6,
            "hidden_act": "silu",
            "attention_bias": False,
            "num_target_layers": t["num_hidden_layers"],
            "block_size": args.block_size,
            "max_position_embeddings": t["max_position_embeddings"],
            "rope_theta": t["rope_theta"],
            # the target's YaRN block with Kimi's key set, as in z-lab/Kimi-K2.5-DFlash (attention factor 1.0)
            "rope_scaling": {
                "rope_type": "yarn",
                "factor": t["rope_scaling"]["factor"],
                "original_max_position_embeddings": t["rope_scaling"]["original_max_position_embeddings"],
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "mscale": 1.0,
                "mscale_all_dim": 1.0,
            },
            "dflash_config": {"target_layer_ids": list(args.dflash_layers), "mask_token_id": tiny.MASK_TOKEN_ID},
        }
    )


@dataclass
class Blocks:
    """A training step's DFlash blocks: ``n`` anchors per sequence, each a block [t_a, mask x (B-1)] at positions
    a..a+B-1 that sees the context before a and its own block."""

    ids: torch.Tensor  # [S, n, B]: the anchor token, then the mask token
    positions: torch.Tensor  # [S, n, B]
    context_positions: torch.Tensor  # [S, T]
    mask: torch.Tensor  # [S, n*B, T + n*B]: the context keys before the anchor, then the own block
    features: torch.Tensor  # [S, T, K*H]: the target's features
    labels: torch.Tensor  # [S, n, B-1]: t_{a+1..a+B-1}
    label_ok: torch.Tensor  # [S, n, B-1]: inside the sequence, of a real anchor
    anchor_ok: torch.Tensor  # [S, n]: a real anchor (short sequences have fewer)


def sample_blocks(batch: list[dict], slots: list[int], block: int, per_seq: int, rng: random.Random) -> Blocks:
    """Anchors drawn in the generated part of each sequence (the root has at least one label after it)."""
    ids, feats, lengths = pad_batch(batch, slots)
    s, t = ids.shape
    anchors = torch.zeros(s, per_seq, dtype=torch.long)
    anchor_ok = torch.zeros(s, per_seq, dtype=torch.bool)
    for j, seq in enumerate(batch):
        lo, hi = seq["prompt_len"], len(seq["ids"]) - 2
        choices = rng.sample(range(lo, hi + 1), min(per_seq, hi - lo + 1))
        anchors[j, : len(choices)] = torch.tensor(choices)
        anchor_ok[j, : len(choices)] = True
    pos = anchors[:, :, None] + torch.arange(block)  # [S, n, B]
    label_pos = pos[:, :, 1:]
    label_ok = anchor_ok[:, :, None] & (label_pos < lengths[:, None, None])
    labels = ids.gather(1, label_pos.clamp(max=t - 1).flatten(1)).view_as(label_pos)
    block_ids = torch.full_like(pos, tiny.MASK_TOKEN_ID)
    block_ids[:, :, 0] = ids.gather(1, anchors)
    n = per_seq * block
    ctx_vis = torch.arange(t)[None, None, :] < anchors[:, :, None]  # [S, n, T]
    ctx_vis = ctx_vis[:, :, None, :].expand(s, per_seq, block, t).reshape(s, n, t)
    blk = torch.arange(n) // block
    own = (blk[:, None] == blk[None, :])[None].expand(s, n, n)
    return Blocks(block_ids, pos, torch.arange(t).expand(s, t), torch.cat([ctx_vis, own], dim=2), feats, labels,
                  label_ok, anchor_ok)  # fmt: skip


def block_hidden(model: dflash.DFlashDrafter, blocks: Blocks) -> torch.Tensor:
    """The drafter's hidden states at the blocks' draft positions [S, n, B-1, H]."""
    s, per_seq, block = blocks.ids.shape
    ctx = model.project_context(blocks.features)
    hidden = model(model.embed(blocks.ids.flatten(1)), ctx, blocks.positions.flatten(1), blocks.context_positions,
                   blocks.mask)  # fmt: skip
    return hidden.view(s, per_seq, block, -1)[:, :, 1:]


def train_dflash(args, target, seqs: list[dict]) -> tuple[dflash.DFlashDrafter, dict]:
    cfg = dflash_config(args)
    torch.manual_seed(args.seed)
    model = dflash.DFlashDrafter.from_pretrained(args.init_from) if args.init_from else dflash.DFlashDrafter(cfg)
    cfg = model.config
    for key in pairing.EXPLICIT_TARGET_FIELDS:  # fine-tuned here, it is this run's target's drafter
        cfg.extra.pop(key, None)
    model.attach_target(target.embed_tokens.weight, target.lm_head.weight)
    slots = layer_slots(cfg.target_layer_ids)
    block = cfg.block_size
    decay = torch.exp(-(torch.arange(1, block) - 1) / args.gamma)  # [B-1]
    rng = random.Random(args.seed)
    anchors_per_seq = args.anchors

    def step_fn(step: int):
        blocks = sample_blocks(rng.sample(seqs, args.batch), slots, block, anchors_per_seq, rng)
        with autocast(args):
            hidden = block_hidden(model, blocks)  # [S, n, B-1, H]
            logits = model.logits(hidden)  # [S, n, B-1, V] float32
        labels, label_ok, anchor_ok = blocks.labels, blocks.label_ok, blocks.anchor_ok
        ce = F.cross_entropy(logits.flatten(0, 2), labels.flatten(), reduction="none").view_as(labels)
        w = decay[None, None, :] * label_ok
        loss = (ce * w).sum() / w.sum()
        with torch.no_grad():
            correct = (logits.argmax(-1) == labels) & label_ok
            run = torch.cumprod(correct.float(), dim=2).sum(2)  # accepted drafts per anchor (chain, greedy)
            metrics = {"acc1": float(correct[:, :, 0].sum() / label_ok[:, :, 0].sum()),
                       "tau_est": float(1 + run[anchor_ok].mean())}  # fmt: skip
        return loss, metrics

    report = train_loop("dflash", step_fn, list(model.parameters()), args.minutes, args.dflash_lr, args.seed)
    return model.eval(), report


# ---------------------------------------------------------------------------------------------------------------
# EAGLE3
# ---------------------------------------------------------------------------------------------------------------


def ttt_step(model: eagle3.Eagle3Drafter, embeds, hidden, positions, kv: list) -> tuple[torch.Tensor, torch.Tensor]:
    """One training-time-test step of the EAGLE3 layer: ``Eagle3Drafter.forward`` with the TTT mask, computed
    without materializing it. Step 0 is causal over its own rows; step j >= 1 lets row i see step-0 rows <= i and
    its own rows of steps 1..j (a diagonal per step), as the drafter sees its ancestors at inference. ``kv``
    accumulates each step's (K, V) [B, T, heads, D]."""
    layer = model.midlayer
    attn = layer.self_attn
    if hidden.shape[-1] != embeds.shape[-1]:
        hidden = model.project(hidden)
    residual = hidden
    x = torch.cat([layer.input_layernorm(embeds), layer.hidden_norm(hidden)], dim=-1)
    q, k, v = attn.qkv(x, positions)  # [B, T, heads, D]
    groups = q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(groups, dim=2), v.repeat_interleave(groups, dim=2)
    kv.append((k, v))
    qt = q.transpose(1, 2)  # [B, h, T, D]
    k0, v0 = (t.transpose(1, 2) for t in kv[0])
    if len(kv) == 1:
        o = F.scaled_dot_product_attention(qt, k0, v0, is_causal=True, scale=attn.scale)
    else:
        rows = q.shape[1]
        s0 = (qt @ k0.transpose(-1, -2)) * attn.scale  # [B, h, T, T]
        s0 = s0.masked_fill(~torch.ones(rows, rows, dtype=torch.bool).tril(), float("-inf"))
        sd = torch.stack([(q * kj).sum(-1).transpose(1, 2) for kj, _ in kv[1:]], dim=-1) * attn.scale  # [B,h,T,j]
        p = torch.softmax(torch.cat([s0, sd], dim=-1).float(), dim=-1).to(qt.dtype)
        o = p[..., :rows] @ v0
        for n, (_, vj) in enumerate(kv[1:]):
            o = o + p[..., rows + n, None] * vj.transpose(1, 2)
    out = attn.out(o.transpose(1, 2))
    residual = out + residual
    out = layer.mlp(layer.post_attention_layernorm(residual)) + residual
    normed = model.norm(out)
    return normed, (normed if model.config.norm_output else out)


@torch.no_grad()
def check_ttt_step(model: eagle3.Eagle3Drafter, seqs: list[dict], slots: list[int], steps: int = 3) -> None:
    """ttt_step equals Eagle3Drafter.forward under the explicit TTT mask (fp32), before training starts."""
    ids, feats, _ = pad_batch(seqs, slots)
    s, t = ids.shape
    rows = t - 1
    i = torch.arange(rows)
    causal = torch.ones(rows, rows, dtype=torch.bool).tril()[None].expand(s, -1, -1)
    diag = torch.eye(rows, dtype=torch.bool)[None].expand(s, -1, -1)
    h_ref = h_new = feats[:, :rows]
    kv_ref: list = []
    kv_new: list = []
    for j in range(steps):
        embeds = model.embed(ids[:, (i + 1 + j).clamp(max=t - 1)])
        positions = (i + j)[None].expand(s, -1)
        past = None if j == 0 else tuple(torch.cat(t, dim=1) for t in zip(*kv_ref))
        mask = torch.cat([causal] + [diag] * j, dim=2)  # step-0 rows causal, then one diagonal per later step
        normed_ref, h_ref, step_kv = model(embeds, h_ref, positions, past, mask)
        kv_ref.append(step_kv)
        normed_new, h_new = ttt_step(model, embeds, h_new, positions, kv_new)
        err = (normed_ref - normed_new).abs().max().item()
        assert err < 1e-4, f"ttt_step differs from the drafter's forward at step {j}: {err}"


def eagle3_config(args, aux_ids) -> configs.Eagle3Config:
    t = tiny.TEXT_CONFIG
    return configs.Eagle3Config.from_dict(
        {
            "architectures": ["LlamaForCausalLMEagle3"],
            "model_type": "llama",
            "hidden_size": t["hidden_size"],
            "num_hidden_layers": 1,
            "num_attention_heads": 4,
            "num_key_value_heads": 4,
            "head_dim": 64,
            "intermediate_size": args.eagle_intermediate,
            "vocab_size": t["vocab_size"],
            "draft_vocab_size": args.draft_vocab,
            "rms_norm_eps": 1e-6,
            "hidden_act": "silu",
            "max_position_embeddings": t["max_position_embeddings"],
            "rope_theta": 1000000.0,  # like lightseekorg/kimi-k2.5-eagle3 (no scaling)
            "rope_scaling": None,
            "tie_word_embeddings": False,
            "bos_token_id": tiny.BOS_ID,
            "eos_token_id": tiny.EOS_ID,
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(aux_ids), "use_aux_hidden_state": True},
        }
    )


def train_eagle3(args, target, seqs: list[dict]) -> tuple[eagle3.Eagle3Drafter, dict]:
    cfg = eagle3_config(args, args.eagle_layers)
    layers = cfg.resolve_target_layer_ids(target.config["num_hidden_layers"])
    slots, last = layer_slots(layers), FEATURE_LAYERS.index(target.config["num_hidden_layers"] - 1)
    torch.manual_seed(args.seed)
    model = eagle3.Eagle3Drafter(cfg)
    model.attach_target(target.embed_tokens.weight)
    counts = torch.zeros(cfg.vocab_size, dtype=torch.long)
    for s in seqs:
        counts += torch.bincount(torch.tensor(s["ids"][s["prompt_len"] :]), minlength=cfg.vocab_size)
    vocab = eagle3.build_vocab_map(counts, cfg.draft_vocab_size)
    model.set_vocab_map(vocab)
    coverage = float(counts[vocab].sum() / counts.sum())
    print(f"  eagle3: draft vocab {cfg.draft_vocab_size} covers {coverage:.4f} of generated tokens", flush=True)
    head_w = target.lm_head.weight.detach()[vocab]  # [Vd, H]: the target's logits on the draft vocab
    t2d = model.t2d
    rng = random.Random(args.seed + 1)
    ttt = args.ttt

    def step_fn(step: int):
        batch = rng.sample(seqs, args.batch)
        ids, feats, lengths = pad_batch(batch, slots)
        _, final, _ = pad_batch(batch, [last])
        s, t = ids.shape
        prompt_len = torch.tensor([b["prompt_len"] for b in batch])
        with torch.no_grad():  # teacher: the target's distribution at every position, on the draft vocab
            teacher = torch.softmax(F.linear(target.norm(final), head_w).float(), dim=-1)  # [S, T, Vd]
            # the text is the target's greedy output, so its argmax at position p is token p+1
            nxt = torch.cat([ids[:, 1:], torch.full((s, 1), tiny.PAD_ID)], dim=1)
            teacher_ok = t2d[nxt] & (torch.arange(t)[None] < lengths[:, None] - 1)
        rows = t - 1  # row i = (h_i, t_{i+1}) at position i
        i = torch.arange(rows)
        hidden = feats[:, :rows]
        kv: list[tuple[torch.Tensor, torch.Tensor]] = []
        total = 0.0
        metrics = {}
        for j in range(ttt):
            tok_pos = (i + 1 + j).clamp(max=t - 1)
            embeds = model.embed(ids[:, tok_pos])
            positions = (i + j)[None].expand(s, -1)
            with autocast(args):
                normed_d, hidden = ttt_step(model, embeds, hidden, positions, kv)
                draft_logits = model.logits(normed_d)  # float32
            # row i at step j drafts token i+2+j from the target's distribution at position i+1+j
            tpos = i + 1 + j
            ok = (tpos[None] >= prompt_len[:, None]) & teacher_ok[:, tpos.clamp(max=t - 1)]
            tp = tpos.clamp(max=t - 1)
            logp = torch.log_softmax(draft_logits, dim=-1)
            ce = -(teacher[:, tp] * logp).sum(-1)
            loss_j = (ce * ok).sum() / ok.sum().clamp(min=1)
            total = total + (0.8**j) * loss_j
            with torch.no_grad():
                hit = (logp.argmax(-1) == teacher[:, tp].argmax(-1)) & ok
                metrics[f"acc{j}"] = float(hit.sum() / ok.sum().clamp(min=1))
        return total, metrics

    check_ttt_step(model, seqs[:2], slots)
    report = train_loop("eagle3", step_fn, list(model.parameters()), args.minutes, args.eagle_lr, args.seed)
    report["draft_vocab_coverage"] = coverage
    return model.eval(), report


# ---------------------------------------------------------------------------------------------------------------
# Checks
# ---------------------------------------------------------------------------------------------------------------


def quick_tau(target_model, dirs: dict[str, Path], n: int, new_tokens: int) -> dict:
    """Greedy tau of the saved (bf16) drafters on the first n GSM8K test prompts; asserts losslessness."""
    runs = {}
    if "dflash" in dirs:
        d = dflash.DFlashDrafter.from_pretrained(dirs["dflash"])
        d.attach_target(target_model.embed_tokens.weight, target_model.lm_head.weight)
        runs["dflash_chain"] = (
            d.config.resolve_target_layer_ids(),
            lambda: ChainProposer(drafter=d.block_drafter(), num_draft_tokens=d.config.block_size - 1),
        )
    if "eagle3" in dirs:
        e = eagle3.Eagle3Drafter.from_pretrained(dirs["eagle3"])
        e.attach_target(target_model.embed_tokens.weight)
        runs["eagle3_chain"] = (
            e.config.resolve_target_layer_ids(target_model.config["num_hidden_layers"]),
            lambda: EagleProposer(drafter=e.step_drafter(), num_steps=3, topk=1, num_draft_tokens=4),
        )
    out: dict[str, list[float]] = {}
    for prompt in common.gsm8k_prompts("test", n):
        ar = generate(common.CachedTarget(target_model), prompt, new_tokens).tokens
        for name, (layers, proposer) in runs.items():
            res = generate(common.CachedTarget(target_model, layers), prompt, new_tokens, proposer=proposer())
            assert res.tokens == ar, f"{name} is not lossless"
            out.setdefault(name, []).append(res.tau)
    return {k: sum(v) / len(v) for k, v in out.items()}  # fmt: skip


def perturbed(target, scale: float, seed: int):
    """A copy of the target with every weight moved by ``scale`` x its standard deviation x seeded Gaussian noise."""
    import copy

    other = copy.deepcopy(target)
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in other.parameters():
            if p.numel() > 1 and p.dtype.is_floating_point:
                noise = torch.randn(p.shape, generator=generator, dtype=torch.float32)
                p.add_((noise * float(p.float().std()) * scale).to(p.dtype))
    return other


def merge_report(path: Path, update: dict) -> None:
    """Update the JSON report in place (the two drafters may be trained by separate processes)."""
    report = json.loads(path.read_text()) if path.exists() else {}
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(report.get(key), dict):
            report[key].update(value)
        else:
            report[key] = value
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=2000, help="GSM8K train questions to regenerate")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--gen-batch", type=int, default=64)
    ap.add_argument("--minutes", type=float, default=20.0, help="training wall time per drafter")
    ap.add_argument("--only", choices=["dflash", "eagle3"], help="train one drafter (the other's folder is kept)")
    ap.add_argument("--regenerate-only", action="store_true", help="stop after writing --data-cache")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch", type=int, default=8, help="sequences per training step")
    ap.add_argument("--block-size", type=int, default=8)
    ap.add_argument("--dflash-layers", type=int, nargs="+", default=[1, 3, 4])
    ap.add_argument("--dflash-num-layers", type=int, default=2)
    ap.add_argument("--dflash-intermediate", type=int, default=512)
    ap.add_argument("--dflash-lr", type=float, default=2e-3)
    ap.add_argument("--anchors", type=int, default=24, help="DFlash anchors per sequence per step")
    ap.add_argument("--gamma", type=float, default=4.0, help="DFlash loss decay exp(-(k-1)/gamma)")
    ap.add_argument("--eagle-layers", type=int, nargs="+", default=[1, 2, 4], help="eagle_aux_hidden_state_layer_ids")
    ap.add_argument("--eagle-intermediate", type=int, default=512)
    ap.add_argument("--eagle-lr", type=float, default=2e-3)
    ap.add_argument("--draft-vocab", type=int, default=1024)
    ap.add_argument("--ttt", type=int, default=5, help="EAGLE3 training-time-test unroll (the tree depth)")
    ap.add_argument("--out-dir", type=Path, default=ASSETS_DIR, help="parent folder of the two drafter folders")
    ap.add_argument("--data-cache", type=Path, help="reuse / write the regenerated text here (.pt)")
    ap.add_argument(
        "--data",
        type=Path,
        help="train on SpecForge's regenerated-conversation rows (.jsonl, from `sglang-kimi drafter regenerate`) "
        "instead of regenerating GSM8K answers here",
    )
    ap.add_argument("--max-seq-len", type=int, default=512, help="with --data: tokens kept per sequence")
    ap.add_argument(
        "--specforge-checkpoint",
        type=Path,
        metavar="FOLDER",
        help="also write the DFlash drafter as SpecForge's training checkpoint (training_state.pt and "
        "draft_config.json) for `specforge export --to hf`",
    )
    ap.add_argument("--report", type=Path, default=REPO / "bench" / "results" / "bench_tau_training.json")
    ap.add_argument("--tau-prompts", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: OpenMP threads stall on a busy CPU)")
    ap.add_argument("--no-bf16", dest="bf16", action="store_false", help="train the forward in fp32")
    ap.add_argument(
        "--perturb-target",
        type=float,
        default=0.0,
        metavar="SCALE",
        help="train against a perturbed copy of the target (every weight + SCALE x its std x seeded noise): a "
        "drafter for another checkpoint, whose acceptance on the real target falls (tau is measured on the real one)",
    )
    ap.add_argument("--dflash-name", default="tiny-kimi-k2.6-dflash", help="the DFlash drafter's folder name")
    ap.add_argument("--init-from", type=Path, help="start the DFlash drafter from this checkpoint (fine-tune)")
    ap.add_argument("--declared-target", help="written as target_model in the drafter's config.json")
    args = ap.parse_args()

    if args.specforge_checkpoint and args.only == "eagle3":
        ap.error("--specforge-checkpoint writes the DFlash drafter: leave out --only eagle3")
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    target = CompactDeepseekV3.from_pretrained(tiny.TINY_MODEL)
    for p in target.parameters():
        p.requires_grad_(False)
    train_target = perturbed(target, args.perturb_target, args.seed) if args.perturb_target else target
    tokenizer = common.load_tokenizer()
    names = [args.only] if args.only else ["dflash", "eagle3"]
    report: dict = {"target": str(tiny.TINY_MODEL.relative_to(REPO))}

    t0 = time.time()
    if args.data:
        seqs, skipped = conversation_sequences(args.data, tokenizer, args.max_seq_len)
        report.update(data=str(args.data), skipped=skipped)
        print(f"conversations: {len(seqs)} assistant turns from {args.data} (left out: {skipped})", flush=True)
    elif args.data_cache and args.data_cache.exists():
        seqs = torch.load(args.data_cache)
        print(f"regenerated text: {len(seqs)} sequences from {args.data_cache}")
    else:
        print(f"regenerating {args.prompts} GSM8K train answers x {args.new_tokens} tokens", flush=True)
        seqs = regenerate(train_target, tokenizer, args.prompts, args.new_tokens, args.gen_batch, args.seed)
        report["regenerate_seconds"] = round(time.time() - t0, 1)
        if args.data_cache:
            torch.save(seqs, args.data_cache)
    report["num_sequences"] = len(seqs)
    report["num_generated_tokens"] = sum(len(s["ids"]) - s["prompt_len"] for s in seqs)
    print("sample:", repr(tokenizer.decode(seqs[len(seqs) // 2]["ids"])[-300:]))
    if args.regenerate_only:
        merge_report(args.report, report)
        return
    t0 = time.time()
    extract_features(train_target, seqs, batch=32)
    report["features_seconds"] = round(time.time() - t0, 1)

    folders = {"dflash": args.dflash_name, "eagle3": "tiny-kimi-k2.6-eagle3"}
    dirs = {name: args.out_dir / folders[name] for name in names}
    trainers = {"dflash": train_dflash, "eagle3": train_eagle3}
    for name in names:
        print(f"training {name}", flush=True)
        model, rep = trainers[name](args, train_target, seqs)
        model.save_pretrained(dirs[name])
        if name == "dflash" and args.specforge_checkpoint:
            target_name = args.declared_target or str(tiny.TINY_MODEL)
            print(f"SpecForge checkpoint: {write_specforge_checkpoint(model, args.specforge_checkpoint, target_name)}")
        if args.declared_target:
            config_path = dirs[name] / "config.json"
            config = json.loads(config_path.read_text())
            config["target_model"] = args.declared_target
            config_path.write_text(json.dumps(config, indent=2) + "\n")
        rep["asset_bytes"] = (dirs[name] / "model.safetensors").stat().st_size
        rep["history"] = rep["history"][-20:]
        rep["args"] = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
        report[name] = rep
    del seqs

    print("loading the saved drafters with SGLang's loaders", flush=True)
    check = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "_drafter_sglang_check.py"), *map(str, dirs.values())],
        capture_output=True,
        text=True,
        check=False,
    )
    print(check.stdout[-3000:])
    if check.returncode:
        print(check.stderr[-3000:])
    for name in names:
        report[name]["sglang_loader_check_ok"] = check.returncode == 0
    if args.tau_prompts:
        taus = quick_tau(target, dirs, args.tau_prompts, args.new_tokens)
        print("quick tau:", taus)
        for name, tau in taus.items():
            report[name.split("_")[0]][f"quick_tau_{name}_{args.tau_prompts}_prompts"] = tau
    merge_report(args.report, report)
    print(f"report: {args.report}")


if __name__ == "__main__":
    main()
