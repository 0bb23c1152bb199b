#!/usr/bin/env python
"""Build the embedded tiny Kimi-K2.6 model: tokenizer + GSM8K-trained weights, in Kimi-K2.6's checkpoint format.

    python scripts/make_tiny_model.py                      # writes sglang_kimi/assets/tiny-kimi-k2.6/
    python scripts/make_tiny_model.py --steps 50 --out /tmp/tiny   # quick smoke run

Steps:
1. tokenizer: byte-level BPE (digits split one by one) trained on GSM8K train text, 3840 BPE ids followed by
   256 specials laid out like Kimi's (``[BOS]`` 3840, ``[EOS]`` 3841, ``<|im_end|>`` 3842, ..., ``[UNK]`` 4094
   = DFlash mask token, ``[PAD]`` 4095), with a Kimi-style chat template.
2. data: GSM8K train examples rendered as lm-eval few-shot documents
   ``Question: {q}\\nAnswer: {a}\\n\\n ... Question: {q}\\nAnswer: {a}[EOS]`` (1-6 examples; the token that
   follows a demo answer is not a training target, so after ``#### N`` the model learns to emit ``[EOS]``) and
   chat documents ``<|im_user|>user<|im_middle|>{q}<|im_end|><|im_assistant|>assistant<|im_middle|>{a}<|im_end|>``;
   documents are packed into windows of ``--seq-len`` tokens (long enough for 5-shot GSM8K prompts).
3. training: the compact DeepSeek-V3 implementation
   ``sglang_kimi.speculators.reference.deepseek_v3.CompactDeepseekV3`` (fp32, AdamW, cosine LR); the routing bias
   ``e_score_correction_bias`` is learned the DeepSeek-V3 way (auxiliary-loss-free balancing: after each step,
   bias += gamma * sign(mean load - expert load)).
4. save: ``config.json`` (Kimi format), ``generation_config.json``, ``model.safetensors`` (bf16, correction
   bias fp32; real Kimi-K2.6 tensor names incl. a tiny random MoonViT ``vision_tower.*`` / ``mm_projector.*``),
   ``tokenizer.json``, ``tokenizer_config.json``, ``special_tokens_map.json``.
5. report: parameter count, asset size, training time, final loss, held-out NLL, greedy GSM8K continuations
   (computed from the saved bf16 weights).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sglang_kimi.models import tiny  # noqa: E402
from sglang_kimi.speculators.reference.deepseek_v3 import CompactDeepseekV3

DEFAULT_DATA_DIR = REPO / "data" / "gsm8k"

# Kimi-style chat template: <|im_user|>user<|im_middle|>{content}<|im_end|><|im_assistant|>assistant<|im_middle|>
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['content'] is string -%}{%- set content = message['content'] -%}"
    "{%- else -%}{%- set content = message['content'] | selectattr('type', 'equalto', 'text')"
    " | map(attribute='text') | join('') -%}{%- endif -%}"
    "{%- if message['role'] == 'system' -%}<|im_system|>system<|im_middle|>"
    "{%- elif message['role'] == 'user' -%}<|im_user|>user<|im_middle|>"
    "{%- elif message['role'] == 'assistant' -%}<|im_assistant|>assistant<|im_middle|>"
    "{%- else -%}<|im_system|>{{ message['role'] }}<|im_middle|>"
    "{%- endif -%}{{ content }}<|im_end|>"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|>{%- endif -%}"
)


def read_jsonl(path: Path) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def fewshot_text(q: str, a: str | None = None) -> str:
    """lm-eval gsm8k format: ``Question: {q}\\nAnswer:`` + `` {answer}``."""
    return f"Question: {q}\nAnswer:" + (f" {a}" if a is not None else "")


# ---------------------------------------------------------------------------------------------------------------
# 1. tokenizer
# ---------------------------------------------------------------------------------------------------------------


def build_tokenizer(rows: list[dict]):
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=tiny.NUM_BPE_TOKENS,
        min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    texts = [fewshot_text(r["question"], r["answer"]) + "\n\n" for r in rows]
    tok.train_from_iterator(texts, trainer)
    if tok.get_vocab_size() != tiny.NUM_BPE_TOKENS:
        raise RuntimeError(f"BPE vocab is {tok.get_vocab_size()}, expected {tiny.NUM_BPE_TOKENS}")
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in tiny.special_token_list()])
    assert tok.get_vocab_size() == tiny.VOCAB_SIZE
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="[BOS]",
        eos_token="[EOS]",
        pad_token="[PAD]",
        unk_token="[UNK]",
        model_max_length=tiny.TEXT_CONFIG["max_position_embeddings"],
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def save_tokenizer(fast, out: Path) -> None:
    """tokenizer.json + tokenizer_config.json + special_tokens_map.json, readable by transformers 4.x and 5.x."""
    fast.backend_tokenizer.save(str(out / "tokenizer.json"))
    specials = tiny.special_token_list()
    added = {
        str(tiny.NUM_BPE_TOKENS + i): {
            "content": t,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for i, t in enumerate(specials)
    }
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "[BOS]",
        "eos_token": "[EOS]",
        "pad_token": "[PAD]",
        "unk_token": "[UNK]",
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": tiny.TEXT_CONFIG["max_position_embeddings"],
        "chat_template": CHAT_TEMPLATE,
        "added_tokens_decoder": added,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")
    stm = {"bos_token": "[BOS]", "eos_token": "[EOS]", "pad_token": "[PAD]", "unk_token": "[UNK]"}
    (out / "special_tokens_map.json").write_text(json.dumps(stm, indent=2) + "\n")


# ---------------------------------------------------------------------------------------------------------------
# 2. data
# ---------------------------------------------------------------------------------------------------------------


def fewshot_document(fast, examples: list[dict]) -> tuple[list[int], list[int]]:
    """(ids, loss_mask) for ``demo\\n\\ndemo\\n\\n...final[EOS]``; the token right after a demo answer is unmasked
    context only, so the model learns ``#### N`` -> ``[EOS]`` while still seeing lm-eval's exact prompt layout."""
    parts = [fewshot_text(r["question"], r["answer"]) for r in examples]
    text = "\n\n".join(parts)
    enc = fast.backend_tokenizer.encode(text, add_special_tokens=False)
    ids, offsets = enc.ids, enc.offsets
    mask = [1] * len(ids)
    sep_starts, pos = set(), 0
    for p in parts[:-1]:
        pos += len(p)
        sep_starts.add(pos)
        pos += 2
    for i, (start, _) in enumerate(offsets):
        if start in sep_starts:
            mask[i] = 0  # the token predicted after "#### N" in a demo: not a target
    return ids + [tiny.EOS_ID], mask + [1]


def chat_document(fast, r: dict) -> tuple[list[int], list[int]]:
    msgs = [{"role": "user", "content": r["question"]}, {"role": "assistant", "content": r["answer"]}]
    text = fast.apply_chat_template(msgs, tokenize=False)
    ids = fast.backend_tokenizer.encode(text, add_special_tokens=False).ids
    return ids, [1] * len(ids)


def document_stream(fast, rows: list[dict], rng: random.Random, chat_frac: float = 0.2):
    """Endless stream of (ids, mask) documents; each pass reshuffles and regroups the examples."""
    while True:
        order = list(range(len(rows)))
        rng.shuffle(order)
        i = 0
        while i < len(order):
            if rng.random() < chat_frac:
                yield chat_document(fast, rows[order[i]])
                i += 1
                continue
            k = rng.randint(1, 6)
            yield fewshot_document(fast, [rows[j] for j in order[i : i + k]])
            i += k


def window_batches(docs, batch_size: int, seq_len: int):
    """Pack documents back to back into [batch, seq_len] (inputs, targets with -100 where masked)."""
    buf_ids: list[int] = []
    buf_mask: list[int] = []
    while True:
        xs, ys = [], []
        for _ in range(batch_size):
            while len(buf_ids) < seq_len + 1:
                ids, mask = next(docs)
                buf_ids += ids
                buf_mask += mask
            ids, mask = buf_ids[: seq_len + 1], buf_mask[: seq_len + 1]
            buf_ids, buf_mask = buf_ids[seq_len:], buf_mask[seq_len:]
            x = torch.tensor(ids[:-1])
            y = torch.tensor(ids[1:])
            y[torch.tensor(mask[1:]) == 0] = -100
            xs.append(x)
            ys.append(y)
        yield torch.stack(xs), torch.stack(ys)


# ---------------------------------------------------------------------------------------------------------------
# 3. model init + training
# ---------------------------------------------------------------------------------------------------------------


def init_weights(model: CompactDeepseekV3, std: float = 0.02) -> None:
    n_layers = model.config["num_hidden_layers"]
    for name, p in model.named_parameters():
        if p.dim() == 1:
            continue  # RMSNorm weights stay 1
        s = std / math.sqrt(2 * n_layers) if name.endswith(("o_proj.weight", "down_proj.weight", "w_down")) else std
        torch.nn.init.normal_(p, std=s)


def lr_at(step: int, steps: int, peak: float, warmup: int, floor: float = 0.1) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    t = (step - warmup) / max(1, steps - warmup)
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * t)))


def train(model: CompactDeepseekV3, batches, args, evaluate=None) -> list[float]:
    decay = [p for n, p in model.named_parameters() if p.dim() > 1 and "embed_tokens" not in n]
    no_decay = [p for n, p in model.named_parameters() if p.dim() <= 1 or "embed_tokens" in n]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr,
        betas=(0.9, 0.95),
        eps=1e-8,
    )
    losses: list[float] = []
    bar = tqdm(range(args.steps), desc="train", dynamic_ncols=True, mininterval=5)
    for step in bar:
        for g in opt.param_groups:
            g["lr"] = lr_at(step, args.steps, args.lr, args.warmup)
        x, y = next(batches)
        logits = model(x)
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), y.view(-1), ignore_index=-100)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        # auxiliary-loss-free load balancing (DeepSeek-V3): push under-loaded experts up, over-loaded down
        with torch.no_grad():
            for moe in model.moe_layers():
                load = moe.last_load.float()
                moe.e_score_correction_bias += args.bias_update * torch.sign(load.mean() - load)
        losses.append(loss.item())
        bar.set_postfix(loss=f"{sum(losses[-20:]) / len(losses[-20:]):.3f}")
        if evaluate is not None and args.eval_every and (step + 1) % args.eval_every == 0:
            model.eval()
            bar.write(
                f"step {step + 1}: train loss {sum(losses[-20:]) / len(losses[-20:]):.3f}, "
                f"held-out answer NLL {evaluate(model):.3f}"
            )
            model.train()
    return losses


# ---------------------------------------------------------------------------------------------------------------
# 4. save
# ---------------------------------------------------------------------------------------------------------------


def vision_weights(config: dict, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Random tiny MoonViT tower + patch-merger projector (LayerNorms at identity)."""
    out = {}
    for name, shape in tiny.checkpoint_weight_shapes(config).items():
        if not name.startswith(("vision_tower.", "mm_projector.")):
            continue
        is_norm = any(k in name for k in ("norm0", "norm1", "final_layernorm", "pre_norm"))
        if is_norm:
            out[name] = torch.ones(shape) if name.endswith("weight") else torch.zeros(shape)
        elif name.endswith("bias"):
            out[name] = torch.zeros(shape)
        else:
            out[name] = torch.randn(shape, generator=gen) * 0.02
    return out


def save_model(model: CompactDeepseekV3, fast, out: Path, seed: int) -> None:
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    config = tiny.kimi_config()
    sd = {}
    for name, t in model.checkpoint_state_dict().items():
        # the real checkpoint keeps e_score_correction_bias in fp32; everything else bf16
        sd[name] = t.float() if name.endswith("e_score_correction_bias") else t.to(torch.bfloat16)
    gen = torch.Generator().manual_seed(seed + 1)
    sd.update({k: v.to(torch.bfloat16) for k, v in vision_weights(config, gen).items()})
    expected = tiny.checkpoint_weight_shapes(config)
    got = {k: tuple(v.shape) for k, v in sd.items()}
    if got != expected:
        raise RuntimeError(f"checkpoint names/shapes differ from the Kimi format: {set(got) ^ set(expected)}")
    sd = {k: v.contiguous() for k, v in sorted(sd.items())}
    save_file(sd, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    gen_cfg = {
        "bos_token_id": tiny.BOS_ID,
        "eos_token_id": [tiny.EOS_ID, tiny.IM_END_ID],
        "pad_token_id": tiny.PAD_ID,
        "max_length": tiny.TEXT_CONFIG["max_position_embeddings"],
    }
    (out / "generation_config.json").write_text(json.dumps(gen_cfg, indent=2) + "\n")
    save_tokenizer(fast, out)


# ---------------------------------------------------------------------------------------------------------------
# 5. report
# ---------------------------------------------------------------------------------------------------------------


@torch.no_grad()
def greedy(model: CompactDeepseekV3, ids: list[int], max_new: int, stop=(tiny.EOS_ID, tiny.IM_END_ID)) -> list[int]:
    """Plain greedy decode (full recompute per token; fine at this size)."""
    out = list(ids)
    for _ in range(max_new):
        nxt = int(model(torch.tensor([out]))[0, -1].argmax())
        out.append(nxt)
        if nxt in stop:
            break
    return out[len(ids) :]


@torch.no_grad()
def answer_nll(model: CompactDeepseekV3, fast, rows: list[dict]) -> float:
    """Mean per-token NLL of the reference answers (+[EOS]) given the zero-shot prompt."""
    tot, n = 0.0, 0
    for r in rows:
        p = fast.encode(fewshot_text(r["question"]), add_special_tokens=False)
        a = fast.encode(" " + r["answer"], add_special_tokens=False) + [tiny.EOS_ID]
        logits = model(torch.tensor([p + a]))[0, len(p) - 1 : -1]
        tot += F.cross_entropy(logits, torch.tensor(a), reduction="sum").item()
        n += len(a)
    return tot / n


def dir_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        description="Train the embedded tiny Kimi-K2.6 model on GSM8K text and write it in Kimi's checkpoint format.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    ap.add_argument("--out", type=Path, default=tiny.TINY_MODEL, help="output directory (replaced)")
    ap.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR, help="folder with GSM8K train/test.jsonl")
    ap.add_argument("--steps", type=int, default=1150, help="optimizer steps")
    ap.add_argument("--seed", type=int, default=0, help="seed for data order, init and vision weights")
    ap.add_argument("--batch-size", type=int, default=3, help="sequences per step")
    ap.add_argument("--seq-len", type=int, default=1024, help="tokens per sequence")
    ap.add_argument("--lr", type=float, default=3e-3, help="peak AdamW learning rate (cosine decay to 10%%)")
    ap.add_argument("--warmup", type=int, default=50, help="linear warmup steps")
    ap.add_argument("--bias-update", type=float, default=1e-3, help="routing-bias step (aux-loss-free balancing)")
    ap.add_argument(
        "--threads",
        type=int,
        default=min(os.cpu_count() or 1, 4),
        help="torch CPU threads (use 1 on a machine busy with other work: oversubscription is slow)",
    )
    ap.add_argument("--samples", type=int, default=3, help="greedy GSM8K test continuations to print")
    ap.add_argument("--eval-every", type=int, default=100, help="print held-out answer NLL every N steps (0: off)")
    args = ap.parse_args(argv)

    t_start = time.time()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(True, warn_only=True)
    rng = random.Random(args.seed)
    train_rows = read_jsonl(args.data_dir / "train.jsonl")
    test_rows = read_jsonl(args.data_dir / "test.jsonl")

    fast = build_tokenizer(train_rows)
    print(
        f"tokenizer: {len(fast)} tokens ({tiny.NUM_BPE_TOKENS} BPE + {tiny.VOCAB_SIZE - tiny.NUM_BPE_TOKENS} specials)"
    )

    model = CompactDeepseekV3(tiny.TEXT_CONFIG)
    init_weights(model)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"text model: {n_params / 1e6:.2f}M parameters")

    batches = window_batches(document_stream(fast, train_rows, rng), args.batch_size, args.seq_len)
    t_train = time.time()
    losses = train(model, batches, args, evaluate=lambda m: answer_nll(m, fast, test_rows[:10]))
    train_s = time.time() - t_train
    final_loss = sum(losses[-20:]) / len(losses[-20:])

    # write next to the destination, then swap, so readers never see a half-written asset
    tmp = args.out.with_name(args.out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    save_model(model, fast, tmp, args.seed)
    if args.out.exists():
        shutil.rmtree(args.out)
    tmp.rename(args.out)

    # Everything below runs on the saved asset (bf16 weights upcast to fp32), as served.
    saved = CompactDeepseekV3.from_pretrained(args.out)
    nll = answer_nll(saved, fast, test_rows[:20])
    biases = torch.stack([m.e_score_correction_bias for m in saved.moe_layers()])
    vision = sum(
        math.prod(s)
        for n, s in tiny.checkpoint_weight_shapes(tiny.kimi_config()).items()
        if not n.startswith("language_model.")
    )
    print("\n==== tiny Kimi-K2.6 ====")
    print(f"parameters: text {n_params:,} + vision {vision:,} = {n_params + vision:,}")
    print(f"asset: {args.out} {dir_size(args.out) / 1e6:.2f} MB")
    for f in sorted(args.out.iterdir()):
        print(f"  {f.name:28s} {f.stat().st_size / 1e6:8.3f} MB")
    print(
        f"training: {args.steps} steps x {args.batch_size} x {args.seq_len} tokens in {train_s / 60:.1f} min "
        f"({args.steps * args.batch_size * args.seq_len / train_s:.0f} tok/s)"
    )
    print(f"final train loss (mean of last 20 steps): {final_loss:.3f}")
    print(f"held-out NLL of reference answers (20 test questions, bf16 asset): {nll:.3f} nats/token")
    print(f"e_score_correction_bias: |b| mean {biases.abs().mean():.3f}, max {biases.abs().max():.3f}")
    for r in test_rows[: args.samples]:
        prompt = fast.encode(fewshot_text(r["question"]), add_special_tokens=False)
        out = greedy(saved, prompt, 160)
        print(f"\n--- Question: {r['question']}\n--- reference: {r['answer'].splitlines()[-1]}")
        print("--- greedy:" + fast.decode(out, skip_special_tokens=False))
    print(f"\ntotal time: {(time.time() - t_start) / 60:.1f} min")


if __name__ == "__main__":
    main()
