#!/usr/bin/env python
"""Kimi-K2.6 served at TP 8: what a decode step of one rank reads, computes and sends, the lower bound on its time
on H200 and MI300X / MI325X / MI355X, and, with the acceptance curves, the tokens/s per user and per node of
autoregressive decoding, each DFlash chain length, each DDTree budget and EAGLE3 chains, and the best width at
each concurrency. Derived in ``docs/kimi-scale.md``.

    python bench/project_kimi.py                                   # roofline projections, every device, INT4
    python bench/project_kimi.py --devices H200 --format fp8 --concurrency 1,8,32
    python bench/project_kimi.py --measured bench/results/bench_step_cost.json --devices H200   # measured t(B, w)
    python bench/project_kimi.py --devices H200 --step-costs /tmp/h200-tp8.json   # a table for the adaptive policy

A step of width w for B requests: the target's forward over ``T = B (w + 1)`` tokens (weights: attention, the dense
layer, the shared expert and router of every MoE layer, the distinct routed experts the T tokens pick, the LM head
shard; the MLA latent KV of every request; ``2 L + 1`` all-reduces of the hidden state and the logits' all-gather),
the drafter's forwards, and per-step host work (``--overhead-ms``, 0: the bound). Each forward takes at least
``max(bytes / HBM bandwidth, FLOPs / peak) + all-reduce time``. With ``--measured``, the target's forward is the
bench's, scaled from the measured rank-shaped model to Kimi-K2.6's depth and vocabulary shard by the roofline's ratio
on the device, and the drafter and the rest are as measured; the all-reduces (none on one device) are added.

Expected tokens per step ``E_w`` come from acceptance curves: ``P(accepted length >= d)`` by draft position for
chains (``E_w = 1 + sum_{d <= w} P_d``) and the measured tau for tree budgets. Tokens/s per user ``E_w / t``, per node
(one TP 8 replica) ``B E_w / t``. The seeds' numbers on 8x MI300X are checked against the projection.

Prints the tables, writes ``bench/results/project_kimi.json`` and ``project_kimi.png`` (``--out-dir``, ``--name``).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
sys.path.insert(0, str(REPO))

from sglang_kimi.models import kimi_shapes as ks  # noqa: E402
from sglang_kimi.speculative.adaptive.profile import StepCosts, write_step_costs  # noqa: E402


class ProjectionError(ValueError):
    """Inputs the projection cannot use; the message names the fix."""


# ---------------------------------------------------------------------------------------------------------------
# Devices and weight formats (docs/kimi-scale.md cites every number)
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Device:
    name: str
    hbm_tb_s: float  # peak HBM bandwidth, TB/s
    bf16_tflops: float  # dense (no sparsity) BF16 matrix peak
    fp8_tflops: float  # dense FP8 matrix peak
    link_gb_s: float  # peak bandwidth one GPU sends to its 7 peers at once, GB/s, one direction
    memory_gb: float
    torch_name: str  # torch.cuda.get_device_name(): what a server's step costs are keyed by ("cuda:" + it)


DEVICES = {
    "H200": Device("H200", 4.8, 989.4, 1978.9, 450.0, 141, "NVIDIA H200"),  # NVLink 4: 900 GB/s both directions
    # 7 Infinity Fabric links per GPU, 128 GB/s each both ways (MI355X: 153.6)
    "MI300X": Device("MI300X", 5.3, 1307.4, 2614.9, 448.0, 192, "AMD Instinct MI300X"),
    "MI325X": Device("MI325X", 6.0, 1307.4, 2614.9, 448.0, 256, "AMD Instinct MI325X"),
    "MI355X": Device("MI355X", 8.0, 2516.6, 5033.2, 537.6, 288, "AMD Instinct MI355X"),
}
ALL_REDUCE_LATENCY_US = 8.0  # per all-reduce of a decode step's small message (an assumption: docs/kimi-scale.md)


@dataclass(frozen=True)
class WeightFormat:
    name: str
    expert_bytes: float  # bytes per routed-expert weight
    linear_bytes: float  # attention, dense layer, shared expert
    head_bytes: float  # embedding and LM head
    compute: str  # the matrix precision the forward runs at: bf16 or fp8


FORMATS = {
    # Kimi-K2.6 as published: routed experts INT4, groups of 32 sharing one bf16 scale (4 + 16 / 32 bits); the rest
    # bf16; W4A16 matmuls run in bf16
    "int4": WeightFormat("int4", 0.5 + 2 / 32, 2.0, 2.0, "bf16"),
    "fp8": WeightFormat("fp8", 1.0 + 4 / (128 * 128), 1.0 + 4 / (128 * 128), 2.0, "fp8"),  # 128 x 128 fp32 scales
    "bf16": WeightFormat("bf16", 2.0, 2.0, 2.0, "bf16"),
    "fp32": WeightFormat("fp32", 4.0, 4.0, 4.0, "bf16"),  # a CPU server's default dtype (measured tables only)
}
DRAFTER_BYTES = 2.0  # drafters in bf16


# ---------------------------------------------------------------------------------------------------------------
# One rank's model, from a (per-rank) text config
# ---------------------------------------------------------------------------------------------------------------


def mla_attention_params(hidden: int, heads: int, q_lora: int, kv_lora: int, rope: int, nope: int, v: int) -> int:
    """One MLA layer: q_a, q_b, kv_a (latent and rope key), kv_b (absorbed into w_kc / w_vc at decode), o."""
    return (
        q_lora * hidden
        + heads * (nope + rope) * q_lora
        + (kv_lora + rope) * hidden
        + heads * (nope + v) * kv_lora
        + hidden * heads * v
    )


@dataclass(frozen=True)
class RankModel:
    """What one rank holds, per layer kind (its text config is the rank's own: a rank-shaped config served at TP 1,
    or Kimi-K2.6's divided by the deployment's TP)."""

    hidden: int
    layers: int
    dense_layers: int
    heads: int
    q_lora: int
    kv_lora: int
    rope: int
    nope: int
    v: int
    dense_inter: int
    held_experts: int  # routed experts on the rank
    routed_per_token: float  # of a token's routed experts, the mean number on this rank
    router_experts: int  # width of the router (replicated)
    moe_inter: int
    shared_inter: int
    vocab: int  # the rank's LM-head rows
    tp: int = 1  # ranks that all-reduce with it

    @classmethod
    def from_text_config(cls, t: dict, tp: int = 1, **overrides) -> RankModel:
        experts, k = int(t["n_routed_experts"]), int(t["num_experts_per_tok"])
        model = cls(
            hidden=int(t["hidden_size"]),
            layers=int(t["num_hidden_layers"]),
            dense_layers=int(t["first_k_dense_replace"]),
            heads=int(t["num_attention_heads"]),
            q_lora=int(t["q_lora_rank"]),
            kv_lora=int(t["kv_lora_rank"]),
            rope=int(t["qk_rope_head_dim"]),
            nope=int(t["qk_nope_head_dim"]),
            v=int(t["v_head_dim"]),
            dense_inter=int(t["intermediate_size"]),
            held_experts=experts,
            routed_per_token=float(k),
            router_experts=experts,
            moe_inter=int(t["moe_intermediate_size"]),
            shared_inter=int(t["moe_intermediate_size"]) * int(t.get("n_shared_experts") or 0),
            vocab=int(t["vocab_size"]),
            tp=tp,
        )
        return replace(model, **overrides)

    @property
    def moe_layers(self) -> int:
        return self.layers - self.dense_layers

    @property
    def attention_params(self) -> int:
        return mla_attention_params(self.hidden, self.heads, self.q_lora, self.kv_lora, self.rope, self.nope, self.v)

    def distinct_experts(self, tokens: float) -> float:
        """Expected routed experts of this rank that ``tokens`` tokens read (random routing)."""
        return ks.expected_distinct_experts(self.held_experts, self.routed_per_token, tokens)


def deployment_model(tp: int, moe: str, scale: int = 1) -> RankModel:
    """One rank of Kimi-K2.6 (61 layers) at ``--tp tp``: the rank-shaped config at full depth, with the LM head's
    vocabulary shard and, under EP, the router's full width."""
    shape = ks.RankShape(tp=tp, moe=moe, layers=ks.KIMI_K26_TEXT["num_hidden_layers"], scale=scale)
    text = ks.rank_text_config(shape)
    router = text["n_routed_experts"] * (tp if moe == ks.MOE_EP else 1)
    return RankModel.from_text_config(text, tp=tp, vocab=text["vocab_size"] // tp, router_experts=router)


@dataclass
class Cost:
    bytes: float = 0.0
    flops: float = 0.0
    all_reduces: int = 0
    comm_bytes: float = 0.0  # bytes each rank sends over all its all-reduces and gathers

    def __add__(self, other: Cost) -> Cost:
        return Cost(
            self.bytes + other.bytes,
            self.flops + other.flops,
            self.all_reduces + other.all_reduces,
            self.comm_bytes + other.comm_bytes,
        )


def target_forward(m: RankModel, fmt: WeightFormat, batch: int, window: int, context: float, kv_bytes: float) -> Cost:
    """One target forward over ``window`` tokens for each of ``batch`` requests with ``context`` tokens of KV."""
    tokens = batch * window
    h = m.hidden
    experts = m.distinct_experts(tokens)
    weights = (
        m.layers * m.attention_params * fmt.linear_bytes
        + m.dense_layers * 3 * h * m.dense_inter * fmt.linear_bytes
        + m.moe_layers * (3 * h * m.shared_inter * fmt.linear_bytes + m.router_experts * h * 2.0)
        + m.moe_layers * experts * 3 * h * m.moe_inter * fmt.expert_bytes
        + m.vocab * h * fmt.head_bytes
    )
    latent = m.kv_lora + m.rope
    kv = m.layers * latent * kv_bytes * (batch * (context + window) + tokens)  # every request's cache, the new rows
    per_token = (
        m.layers * m.attention_params
        + m.dense_layers * 3 * h * m.dense_inter
        + m.moe_layers * (3 * h * m.shared_inter + m.router_experts * h + m.routed_per_token * 3 * h * m.moe_inter)
        + m.vocab * h
    )
    attention = m.layers * m.heads * (2 * m.kv_lora + m.rope) * tokens * (context + (window + 1) / 2)
    comm = Cost()
    if m.tp > 1:
        ar = 2 * m.layers + 1  # after attention and after the MLP in every layer; the vocabulary-parallel embedding
        comm = Cost(all_reduces=ar + 1, comm_bytes=ar * tokens * h * 2.0 + tokens * m.vocab * 2.0)
    return Cost(weights + kv, 2.0 * (tokens * per_token + attention)) + comm


def dflash_forward(d: dict, m: RankModel, batch: int, block: int, context: float) -> Cost:
    """The DFlash drafter over ``block`` positions of ``batch`` requests (``d``: its per-rank config), its readout
    through the target's LM head shard, and its context K/V reads."""
    h, layers = d["hidden_size"], d["num_hidden_layers"]
    heads, kvh, hd, inter = d["num_attention_heads"], d["num_key_value_heads"], d["head_dim"], d["intermediate_size"]
    features = len(d["dflash_config"]["target_layer_ids"])
    per_layer = h * heads * hd + 2 * h * kvh * hd + heads * hd * h + 3 * h * inter
    params = layers * per_layer + features * h * h  # fc is replicated on every rank
    tokens = batch * block
    kv = layers * 2 * kvh * hd * DRAFTER_BYTES * batch * (context + block)
    weights = params * DRAFTER_BYTES + m.vocab * h * 2.0
    flops = 2.0 * tokens * (layers * per_layer + m.vocab * h) + 2.0 * batch * features * h * h
    flops += 4.0 * layers * heads * hd * tokens * (context + block)
    comm = Cost(all_reduces=2 * layers, comm_bytes=2 * layers * tokens * h * 2.0) if m.tp > 1 else Cost()
    return Cost(weights + kv, flops) + comm


def eagle3_forward(e: dict, m: RankModel, batch: int, tokens_per_request: int, context: float) -> Cost:
    """One EAGLE3 drafter forward (its MLA layer, MLP, fc over three target features for extend rows) with its
    readout through its own head shard."""
    h, heads, kv_lora, rope = e["hidden_size"], e["num_attention_heads"], e["kv_lora_rank"], e["qk_rope_head_dim"]
    attention = mla_attention_params(h, heads, e["q_lora_rank"], kv_lora, rope, e["qk_nope_head_dim"], e["v_head_dim"])
    head = e["draft_vocab_size"] // m.tp
    params = attention + 3 * h * e["intermediate_size"] + 3 * h * h
    tokens = batch * tokens_per_request
    kv = (kv_lora + rope) * DRAFTER_BYTES * batch * (context + tokens_per_request)
    weights = params * DRAFTER_BYTES + head * h * DRAFTER_BYTES
    flops = 2.0 * tokens * (params + head * h) + 2.0 * heads * (2 * kv_lora + rope) * tokens * context
    comm = Cost(all_reduces=2, comm_bytes=2 * tokens * h * 2.0) if m.tp > 1 else Cost()
    return Cost(weights + kv, flops) + comm


def seconds(cost: Cost, device: Device, compute: str, tp: int, latency_us: float = ALL_REDUCE_LATENCY_US) -> dict:
    """The bound on one piece of work: memory, compute, and the collective time after it."""
    memory = cost.bytes / (device.hbm_tb_s * 1e12)
    peak = device.fp8_tflops if compute == "fp8" else device.bf16_tflops
    compute_s = cost.flops / (peak * 1e12)
    comm = 0.0
    if tp > 1:  # ring all-reduce: each rank sends 2 (p - 1) / p of the message
        comm = cost.all_reduces * latency_us * 1e-6 + 2 * (tp - 1) / tp * cost.comm_bytes / (device.link_gb_s * 1e9)
    return {"memory_s": memory, "compute_s": compute_s, "comm_s": comm, "total_s": max(memory, compute_s) + comm}


# ---------------------------------------------------------------------------------------------------------------
# Modes and acceptance curves
# ---------------------------------------------------------------------------------------------------------------


Mode = ks.StepMode


def parse_mode(name: str) -> Mode:
    try:
        return ks.parse_step_mode(name)
    except ValueError as exc:
        raise ProjectionError(str(exc)) from None


DFLASH_BLOCK = ks.KIMI_K25_DFLASH["block_size"]


def step_cost(
    mode: Mode, m: RankModel, shape: ks.RankShape, fmt: WeightFormat, batch: int, context: float, kv_bytes: float
) -> tuple[Cost, Cost]:
    """(the target's forward, the drafter's forwards) of one step of ``mode``."""
    target = target_forward(m, fmt, batch, mode.window, context, kv_bytes)
    if mode.family == "ar":
        return target, Cost()
    if mode.family in ("chain", "tree"):
        block = mode.window if mode.family == "chain" else DFLASH_BLOCK  # a chain's block is its window
        return target, dflash_forward(ks.rank_dflash_config(shape), m, batch, block, context)
    e = ks.rank_eagle3_config(shape)
    draft = Cost()
    for _ in range(mode.width - 1):  # the drafts after the first (which the previous extend gave)
        draft += eagle3_forward(e, m, batch, 1, context)
    return target, draft + eagle3_forward(e, m, batch, mode.window, context)  # the extend over the window


@dataclass(frozen=True)
class Curve:
    name: str
    chain: tuple[float, ...]  # P(accepted length >= d), d = 1, 2, ...
    trees: dict  # budget -> tokens per step
    source: str

    def tokens_per_step(self, mode: Mode) -> float | None:
        if mode.family == "ar":
            return 1.0
        if mode.family == "tree":
            return self.trees.get(mode.width)
        if mode.width > len(self.chain) and self.chain and self.chain[-1] > 0:
            return None  # positions the curve does not reach
        return 1.0 + sum(self.chain[: mode.width])


# The seeds' Kimi-K2.5 DFlash drafter on Kimi-K2.6: 64 / 34 / 18 / 9 / <3 % at positions 1..5, taken as 3 % at the
# fifth and nothing after.
SEED_CHAIN = (0.64, 0.34, 0.18, 0.09, 0.03, 0.0, 0.0)


def tiny_curves() -> dict[str, Curve]:
    """The embedded tiny drafters' recorded curves: the matched DFlash drafter and EAGLE3 (``bench_tau.json``), the
    mismatched DFlash drafter as served (``bench_adaptive.json``, concurrency 1)."""
    curves = {}
    tau = json.loads((RESULTS / "bench_tau.json").read_text())["results"]
    trees = {int(k.split("_")[1]): v["tau"] for k, v in tau.items() if k.startswith("ddtree_")}
    curves["tiny-matched"] = Curve(
        "tiny-matched",
        tuple(tau["dflash_chain"]["acceptance_by_position"]),
        trees,
        "bench/results/bench_tau.json: tiny-kimi-k2.6-dflash, GSM8K",
    )
    curves["tiny-eagle3"] = Curve(
        "tiny-eagle3",
        tuple(tau["eagle3_chain"]["acceptance_by_position"]),
        {},
        "bench/results/bench_tau.json: tiny-kimi-k2.6-eagle3 chain, GSM8K",
    )
    served = json.loads((RESULTS / "bench_adaptive.json").read_text())["results"]["drafters"]["mismatched"]
    first = {name: runs[0] for name, runs in served.items()}
    mis_trees = {int(n.split("-")[1]): lv["tau"] for n, lv in first.items() if n.startswith("tree-")}
    curves["tiny-mismatched"] = Curve(
        "tiny-mismatched",
        tuple(first["chain-7"]["acceptance"]["acceptance_per_position"]),
        mis_trees,
        "bench/results/bench_adaptive.json: tiny-kimi-k2.5-dflash served on the tiny K2.6, concurrency 1",
    )
    return curves


def transfer_trees(chain: tuple[float, ...], like: Curve) -> dict:
    """Tree budgets for a chain-only curve: ``like``'s gain of each budget over its own 7-draft chain, in accepted
    drafts, scaled to this chain's (an assumption: the tree adds in proportion)."""
    base = sum(like.chain[:7])
    mine = sum(chain[:7])
    return {n: 1.0 + (t - 1.0) * mine / base for n, t in like.trees.items()} if base > 0 else {}


def curves() -> dict[str, Curve]:
    tiny = tiny_curves()
    seed = Curve(
        "seed-k25-on-k26",
        SEED_CHAIN,
        transfer_trees(SEED_CHAIN, tiny["tiny-mismatched"]),
        "the seeds' K2.5 DFlash on K2.6: 64/34/18/9/<3 %; trees by the tiny mismatched drafter's gain",
    )
    return {seed.name: seed, **tiny}


# ---------------------------------------------------------------------------------------------------------------
# Measured tables
# ---------------------------------------------------------------------------------------------------------------

SHAPE_EXEMPT = ("num_hidden_layers", "vocab_size")  # what the projection corrects for


def measured_model(result: dict) -> tuple[RankModel, dict]:
    """The rank-shaped model a bench run measured, and its rank signature, from the run's server config."""
    server = next(iter(result.get("servers", {}).values()), None)
    config = Path(str((server or {}).get("model_path") or "")) / "config.json"
    if server is None or not config.is_file():
        raise ProjectionError(
            "the measured run names no model config on this machine: run the projection where the "
            "bench ran, or copy the model folder to the path its JSON records"
        )
    data = json.loads(config.read_text())
    tp = int(server.get("tp_size") or 1)
    return RankModel.from_text_config(dict(ks.text_config_of(data)), tp=tp), ks.rank_signature(data, tp)


def check_measured_shape(measured: dict, deployment: dict, tp: int, moe: str, scale: int) -> None:
    """A measured table of another model (not a rank of Kimi-K2.6 at this TP, MoE split and scale) is refused."""
    diffs = [
        f"{k} {measured.get(k)} (measured) vs {deployment.get(k)}"
        for k in sorted(deployment)
        if k not in SHAPE_EXEMPT and measured.get(k) != deployment.get(k)
    ]
    if diffs:
        raise ProjectionError(
            f"the cost table was measured on another model than one rank of Kimi-K2.6 at TP {tp} ({moe} MoE, scale "
            f"1/{scale}): {'; '.join(diffs)}. Measure a rank-shaped Kimi-K2.6 (scripts/make_rank_shaped.py --tp {tp} "
            f"--moe {moe}), or project for the setup it was measured at (--tp, --moe, --scale)"
        )


def measured_rows(result: dict) -> dict[tuple[str, int], dict]:
    return {(r["mode"], int(r["concurrency"])): r for r in result.get("rows", []) if r.get("steps")}


# ---------------------------------------------------------------------------------------------------------------
# Projection
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class Setup:
    tp: int = 8
    moe: str = ks.MOE_TP
    fmt: str = "int4"
    context: float = 2048.0
    kv_bytes: float = 2.0
    overhead_ms: float = 0.0
    latency_us: float = ALL_REDUCE_LATENCY_US
    scale: int = 1


def step_time(mode: Mode, batch: int, device: Device, setup: Setup, measured: dict | None = None) -> dict:
    """The step's time and its parts: roofline, or the measured parts scaled to the deployment."""
    shape = ks.RankShape(tp=setup.tp, moe=setup.moe, layers=ks.KIMI_K26_TEXT["num_hidden_layers"], scale=setup.scale)
    m = deployment_model(setup.tp, setup.moe, setup.scale)
    fmt = FORMATS[setup.fmt]
    target, draft = step_cost(mode, m, shape, fmt, batch, setup.context, setup.kv_bytes)
    t = seconds(target, device, fmt.compute, setup.tp, setup.latency_us)
    d = seconds(draft, device, "bf16", setup.tp, setup.latency_us)
    out = {
        "target_s": t["memory_s"] if t["memory_s"] > t["compute_s"] else t["compute_s"],
        "target_bound": "memory" if t["memory_s"] >= t["compute_s"] else "compute",
        "draft_s": max(d["memory_s"], d["compute_s"]),
        "comm_s": t["comm_s"] + d["comm_s"],
        "rest_s": setup.overhead_ms / 1e3,
        "target_bytes": target.bytes,
        "target_flops": target.flops,
        "distinct_experts": m.distinct_experts(batch * mode.window),
        "source": "roofline",
    }
    if measured is not None:
        row = measured["rows"].get((mode.name, batch))
        if row is None:
            return {}
        mfmt = FORMATS[measured["format"]]
        mtarget = target_forward(measured["model"], mfmt, batch, mode.window, setup.context, mfmt.linear_bytes)
        ratio = out["target_s"] / max(seconds(mtarget, device, mfmt.compute, 1)["total_s"], 1e-12)
        out.update(
            target_s=row["target_s"] * ratio,
            draft_s=row["draft_s"],
            rest_s=row["rest_s"],
            measured_step_s=row["step_s"],
            depth_ratio=ratio,
            source="measured",
        )
    out["step_s"] = out["target_s"] + out["draft_s"] + out["comm_s"] + out["rest_s"]
    return out


def project(
    devices: list[str],
    modes: list[Mode],
    concurrency: list[int],
    setup: Setup,
    curve_set: dict,
    measured: dict | None = None,
) -> list[dict]:
    rows = []
    for name in devices:
        device = DEVICES[name]
        for mode in modes:
            for batch in concurrency:
                t = step_time(mode, batch, device, setup, measured)
                if not t:
                    continue
                for curve in curve_set.values():
                    if mode.family == "eagle3" and not curve.name.endswith("eagle3"):
                        continue
                    if mode.family in ("chain", "tree") and curve.name.endswith("eagle3"):
                        continue
                    tokens = curve.tokens_per_step(mode)
                    if tokens is None:
                        continue
                    rows.append(
                        {
                            "device": name,
                            "mode": mode.name,
                            "concurrency": batch,
                            "curve": curve.name,
                            "tokens_per_step": tokens,
                            "tok_s_user": tokens / t["step_s"],
                            "tok_s_node": batch * tokens / t["step_s"],
                            **t,
                        }
                    )
    return rows


def best_per_concurrency(rows: list[dict]) -> dict:
    """device -> curve -> concurrency -> the mode with the most tokens/s per node."""
    best: dict = {}
    for r in rows:
        cell = best.setdefault(r["device"], {}).setdefault(r["curve"], {})
        current = cell.get(r["concurrency"])
        if current is None or r["tok_s_node"] > current["tok_s_node"]:
            cell[r["concurrency"]] = {"mode": r["mode"], "tok_s_node": r["tok_s_node"], "tok_s_user": r["tok_s_user"]}
    return best


# The seeds' published numbers: 8x MI300X, tokens/s of the node, Kimi-K2.6 INT4, their DFlash drafter trained for
# K2.5 (the seed curve); "st=2": --speculative-num-draft-tokens 2, a block of 2, one draft per step (chain-1).
SEEDS = [
    {"device": "MI300X", "mode": "ar", "concurrency": 8, "tok_s_node": 90.4},
    {"device": "MI300X", "mode": "chain-1", "concurrency": 8, "tok_s_node": 127.1},
    {"device": "MI300X", "mode": "chain-1", "concurrency": 32, "tok_s_node": 507.6},
]


def check_seeds(setup: Setup, curve: Curve) -> dict:
    """The projection against the seeds' numbers: the roofline alone, then with one per-step overhead fitted to the
    autoregressive number (the host and launch time the seeds' stack spent per step)."""
    seed_setup = replace(setup, tp=8, moe=ks.MOE_TP, fmt="int4", scale=1, overhead_ms=0.0)
    device = DEVICES["MI300X"]
    rows = []
    for s in SEEDS:
        mode = parse_mode(s["mode"])
        t = step_time(mode, s["concurrency"], device, seed_setup)
        tokens = curve.tokens_per_step(mode)
        rows.append(
            {
                **s,
                "tokens_per_step": tokens,
                "roofline_step_ms": 1e3 * t["step_s"],
                "roofline_tok_s_node": s["concurrency"] * tokens / t["step_s"],
                "measured_step_ms": 1e3 * s["concurrency"] * tokens / s["tok_s_node"],
            }
        )
    ar = rows[0]
    overhead_s = (ar["measured_step_ms"] - ar["roofline_step_ms"]) / 1e3
    for r in rows:
        fitted = r["roofline_step_ms"] / 1e3 + overhead_s
        r["fitted_tok_s_node"] = r["concurrency"] * r["tokens_per_step"] / fitted
        r["roofline_over_measured"] = r["roofline_tok_s_node"] / r["tok_s_node"]
        r["fitted_over_measured"] = r["fitted_tok_s_node"] / r["tok_s_node"]
    speedup = {
        "measured": rows[1]["tok_s_node"] / rows[0]["tok_s_node"],
        "roofline": rows[1]["roofline_tok_s_node"] / rows[0]["roofline_tok_s_node"],
        "fitted": rows[1]["fitted_tok_s_node"] / rows[0]["fitted_tok_s_node"],
    }
    return {"curve": curve.name, "fitted_overhead_ms": 1e3 * overhead_s, "rows": rows, "chain1_over_ar_at_8": speedup}


def step_costs_for(
    device: str,
    setup: Setup,
    modes: list[Mode],
    concurrency: list[int],
    measured: dict | None = None,
    device_name: str | None = None,
) -> StepCosts:
    """The projected ``t(B, w)`` of a deployment, in the adaptive policy's step-costs format, keyed by the device as
    a server names it (``cuda:`` + torch's device name; ``device_name`` when given)."""
    families = {"chain": "chain", "tree": "tree", "eagle3": "eagle3-chain"}
    table: dict[str, dict[int, dict[int, float]]] = {}
    for mode in modes:
        for batch in concurrency:
            t = step_time(mode, batch, DEVICES[device], setup, measured)
            if not t:
                continue
            for fam in families.values() if mode.family == "ar" else [families[mode.family]]:
                table.setdefault(fam, {}).setdefault(batch, {})[mode.width] = t["step_s"]
    table = {fam: rows for fam, rows in table.items() if any(w for row in rows.values() for w in row)}
    shape = dict(ks.rank_signature(ks.rank_target_config(ks.RankShape(setup.tp, setup.moe, 61, setup.scale))))
    shape["vocab_size"] //= setup.tp
    name = device_name or (measured or {}).get("device") or f"cuda:{DEVICES[device].torch_name}"
    how = "measured" if measured else "roofline"
    source = f"bench/project_kimi.py ({how}, {setup.fmt}, context {setup.context:.0f})"
    return StepCosts(name, setup.tp, shape, table, source=source)


# ---------------------------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------------------------


def print_bound(devices: list[str], setup: Setup, concurrency: list[int]) -> None:
    m = deployment_model(setup.tp, setup.moe, setup.scale)
    fmt = FORMATS[setup.fmt]
    print(
        f"\nLower bound on the autoregressive step, one rank of Kimi-K2.6 at TP {setup.tp} ({setup.moe} MoE, "
        f"{setup.fmt} weights, context {setup.context:.0f}, KV {setup.kv_bytes:.0f} B/value):"
    )
    print(
        f"{'device':<8} {'B':>4} {'experts':>8} {'GB read':>8} {'TFLOP':>7} {'memory ms':>9} {'compute ms':>10} "
        f"{'comm ms':>8} {'bound ms':>9}"
    )
    for name in devices:
        for batch in concurrency:
            cost = target_forward(m, fmt, batch, 1, setup.context, setup.kv_bytes)
            s = seconds(cost, DEVICES[name], fmt.compute, setup.tp, setup.latency_us)
            print(
                f"{name:<8} {batch:>4} {m.distinct_experts(batch):8.1f} {cost.bytes / 1e9:8.2f} "
                f"{cost.flops / 1e12:7.3f} {1e3 * s['memory_s']:9.2f} {1e3 * s['compute_s']:10.3f} "
                f"{1e3 * s['comm_s']:8.2f} {1e3 * s['total_s']:9.2f}"
            )


def print_projection(rows: list[dict], device: str, curve: str, concurrency: list[int]) -> None:
    mine = [r for r in rows if r["device"] == device and r["curve"] in (curve, "tiny-eagle3")]
    if not mine:
        return
    print(f"\n{device}, curve {curve} (EAGLE3 rows: tiny-eagle3): tokens/s per node (per user) by concurrency")
    print(f"{'mode':<10} {'E':>5} " + " ".join(f"{'B=' + str(c):>16}" for c in concurrency))
    for mode in dict.fromkeys(r["mode"] for r in mine):
        cells = {r["concurrency"]: r for r in mine if r["mode"] == mode}
        first = next(iter(cells.values()))
        line = f"{mode:<10} {first['tokens_per_step']:5.2f} "
        line += " ".join(
            f"{cells[c]['tok_s_node']:8.0f} ({cells[c]['tok_s_user']:5.1f})" if c in cells else f"{'—':>16}"
            for c in concurrency
        )
        print(line)


def print_best(best: dict, concurrency: list[int]) -> None:
    print("\nBest width per concurrency (most tokens/s per node):")
    for device, by_curve in best.items():
        for curve, cells in by_curve.items():
            line = " ".join(f"B={c}:{cells[c]['mode']}" for c in concurrency if c in cells)
            print(f"  {device:<8} {curve:<17} {line}")


def print_seeds(check: dict) -> None:
    print(
        f"\nCheck against the seeds (8x MI300X, INT4, curve {check['curve']}; fitted per-step overhead "
        f"{check['fitted_overhead_ms']:.1f} ms):"
    )
    print(f"{'mode':<8} {'B':>3} {'seeds tok/s':>11} {'roofline':>9} {'x':>6} {'fitted':>8} {'x':>6}")
    for r in check["rows"]:
        print(
            f"{r['mode']:<8} {r['concurrency']:>3} {r['tok_s_node']:11.1f} {r['roofline_tok_s_node']:9.0f} "
            f"{r['roofline_over_measured']:6.1f} {r['fitted_tok_s_node']:8.1f} {r['fitted_over_measured']:6.2f}"
        )
    s = check["chain1_over_ar_at_8"]
    print(
        f"chain-1 over autoregressive at 8 users: seeds {s['measured']:.2f}x, roofline {s['roofline']:.2f}x, "
        f"fitted {s['fitted']:.2f}x"
    )


ROW_FIELDS = ("device", "mode", "concurrency", "curve", "tokens_per_step", "tok_s_user", "tok_s_node", "step_s",
              "source", "depth_ratio")  # fmt: skip


def step_fields(row: dict) -> dict:
    """A projected row's step parts (the same for every curve)."""
    return {k: v for k, v in row.items() if k not in ("curve", "tokens_per_step", "tok_s_user", "tok_s_node")}


def rounded(value, digits: int = 5):
    """``value`` with every float to ``digits`` significant digits (a projection is not more precise)."""
    if isinstance(value, float):
        return float(f"{value:.{digits}g}")
    if isinstance(value, dict):
        return {k: rounded(v, digits) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [rounded(v, digits) for v in value]
    return value


def plot(rows: list[dict], path: Path, curve: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    devices = list(dict.fromkeys(r["device"] for r in rows))
    fig, axes = plt.subplots(1, len(devices), figsize=(5.5 * len(devices), 4.5), squeeze=False)
    for ax, device in zip(axes[0], devices):
        mine = [r for r in rows if r["device"] == device and r["curve"] == curve]
        for mode in dict.fromkeys(r["mode"] for r in mine):
            pts = sorted((r["concurrency"], r["tok_s_node"]) for r in mine if r["mode"] == mode)
            ax.plot(*zip(*pts), marker="o", label=mode, lw=2.5 if mode == "ar" else 1)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("concurrency (users)")
        ax.set_ylabel("tokens/s per node (TP 8 replica)")
        ax.set_title(f"{device}, {curve}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def measured_format(server: dict) -> str:
    """The weight format a bench server ran: its quantization, else its dtype."""
    if str(server.get("quantization") or "").startswith("fp8"):
        return "fp8"
    return "fp32" if "32" in str(server.get("dtype") or "") else "bf16"


def load_measured(path: Path, setup: Setup) -> dict:
    result = json.loads(Path(path).read_text())
    if "rows" not in result or "servers" not in result:
        raise ProjectionError(f"{path} is not a bench/bench_step_cost.py result (no rows / servers)")
    model, shape = measured_model(result)
    deployment = ks.rank_signature(ks.rank_target_config(ks.RankShape(setup.tp, setup.moe, 61, setup.scale)))
    check_measured_shape(shape, deployment, setup.tp, setup.moe, setup.scale)
    server = next(iter(result["servers"].values()))
    return {"model": model, "shape": shape, "rows": measured_rows(result), "device": result.get("device"),
            "format": measured_format(server)}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", default=",".join(DEVICES), help=f"comma-separated, of {list(DEVICES)}")
    parser.add_argument("--format", default="int4", choices=sorted(FORMATS), help="weights: int4 as served (default)")
    parser.add_argument("--tp", type=int, default=8)
    parser.add_argument("--moe", choices=ks.MOE_MODES, default=ks.MOE_TP)
    parser.add_argument("--scale", type=int, default=1, help="widths divided by this (a measured CPU twin's)")
    parser.add_argument("--context", type=float, default=2048.0, help="mean KV tokens per request")
    parser.add_argument("--kv-bytes", type=float, default=2.0, help="bytes per KV value (1: FP8 KV cache)")
    parser.add_argument("--overhead-ms", type=float, default=0.0, help="host time per step added (0: the bound)")
    parser.add_argument("--all-reduce-us", type=float, default=ALL_REDUCE_LATENCY_US, help="latency per all-reduce")
    parser.add_argument("--concurrency", default="1,2,4,8,16,32,64")
    parser.add_argument("--modes", default="ar,chain-1,chain-2,chain-3,chain-5,chain-7,tree-8,tree-16,tree-32,eagle3-3")
    parser.add_argument("--measured", type=Path, help="a bench/bench_step_cost.py JSON: its t(B, w) instead")
    parser.add_argument("--step-costs", type=Path, help="write the first device's t(B, w) for the adaptive policy")
    parser.add_argument("--device-name", help="the device the step costs are for, as the server names it (cuda:...)")
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    parser.add_argument("--name", default="project_kimi")
    opts = parser.parse_args(argv)
    try:
        devices = [d for d in opts.devices.split(",") if d]
        unknown = [d for d in devices if d not in DEVICES]
        if unknown:
            raise ProjectionError(f"unknown device(s) {unknown}: choose from {list(DEVICES)}")
        setup = Setup(
            tp=opts.tp,
            moe=opts.moe,
            fmt=opts.format,
            context=opts.context,
            kv_bytes=opts.kv_bytes,
            overhead_ms=opts.overhead_ms,
            latency_us=opts.all_reduce_us,
            scale=opts.scale,
        )
        ks.RankShape(tp=setup.tp, moe=setup.moe, scale=setup.scale)  # a TP that does not divide Kimi: refused
        modes = [parse_mode(m) for m in opts.modes.split(",") if m]
        concurrency = [int(c) for c in opts.concurrency.split(",") if c]
        measured = load_measured(opts.measured, setup) if opts.measured else None
        if measured and not all(d.lower() in str(measured["device"]).lower() for d in devices):
            print(f"note: the table was measured on {measured['device']}; projecting it for {devices} mixes machines")
        curve_set = curves()
        rows = project(devices, modes, concurrency, setup, curve_set, measured)
        check = check_seeds(setup, curve_set["seed-k25-on-k26"])
    except (ProjectionError, ks.RankShapeError) as e:
        parser.exit(2, f"project_kimi: {e}\n")
    print_bound(devices, setup, concurrency)
    for device in devices:
        for curve in ("seed-k25-on-k26", "tiny-matched"):
            print_projection(rows, device, curve, concurrency)
    best = best_per_concurrency([r for r in rows if not r["curve"].endswith("eagle3")])
    print_best(best, concurrency)
    print_seeds(check)
    out = {
        "setup": asdict(setup),
        "devices": {d: asdict(DEVICES[d]) for d in devices},
        "formats": {k: asdict(v) for k, v in FORMATS.items()},
        "curves": {k: asdict(v) for k, v in curve_set.items()},
        # a step's parts once per (device, mode, concurrency); the rows: tokens/s by curve
        "steps": list({(r["device"], r["mode"], r["concurrency"]): step_fields(r) for r in rows}.values()),
        "rows": [{k: r[k] for k in ROW_FIELDS if k in r} for r in rows],
        "best": best,
        "seeds": check,
        "measured": str(opts.measured) if opts.measured else None,
    }
    opts.out_dir.mkdir(parents=True, exist_ok=True)
    (opts.out_dir / f"{opts.name}.json").write_text(json.dumps(rounded(out), default=str) + "\n")
    plot(rows, opts.out_dir / f"{opts.name}.png", "seed-k25-on-k26")
    print(f"\njson: {opts.out_dir / f'{opts.name}.json'}\npng: {opts.out_dir / f'{opts.name}.png'}")
    if opts.step_costs:
        costs = step_costs_for(devices[0], setup, modes, concurrency, measured, opts.device_name)
        write_step_costs(opts.step_costs, costs)
        print(f"step costs: {opts.step_costs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
