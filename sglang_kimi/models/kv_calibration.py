"""``sglang-kimi calibrate-kv``: FP8 KV cache scales from a running server's real KV data.

    SGLANG_KIMI_KV_SCALES=observe sglang-kimi serve --model-path moonshotai/Kimi-K2.6 ...   # any --kv-cache-dtype
    sglang-kimi calibrate-kv --base-url http://127.0.0.1:30000 --out kv_scales.json
    SGLANG_KIMI_KV_SCALES=kv_scales.json sglang-kimi serve ... --kv-cache-dtype fp8_e4m3 --attention-backend triton

The server records, per attention layer, the running max of everything written to its KV cache (the target's MLA
latent rows and, when a drafter is served, the drafter's K and V). This command sends calibration prompts (GSM8K
train questions by default), reads the maxima back from ``/server_info`` and writes per-layer ``k_scale`` /
``v_scale`` (``sglang_kimi.models.kv_scales.ScaleRule``) for the target's and the drafter's layers. With tensor
parallelism the maxima are rank 0's (the MLA latent is replicated across ranks; a drafter's KV heads are split).
"""

from __future__ import annotations

import json
import math
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import requests
from tqdm import tqdm

from sglang_kimi.launcher.api_key import HELP as API_KEY_HELP
from sglang_kimi.launcher.api_key import auth_headers, use_api_key
from sglang_kimi.models.kv_scales import DRAFT, ENV, FORMAT, TARGET, LayerScale, ScaleRule, scales_document


class CalibrationError(RuntimeError):
    """Calibration cannot run; the message names the problem and the fix."""


def calibration_prompts(data_dir: str | Path | None, limit: int) -> list[str]:
    """``limit`` GSM8K train questions as few-shot-style prompts: from ``data_dir/train.jsonl``, else the hub's
    ``openai/gsm8k`` (needs the ``datasets`` package and network access)."""
    if data_dir is not None:
        path = Path(data_dir).expanduser() / "train.jsonl"
        if not path.is_file():
            raise CalibrationError(f"--data-dir {data_dir} has no train.jsonl: point it at GSM8K's folder")
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    else:
        from sglang_kimi.evals.hub_data import load_gsm8k, why_not_loaded

        try:
            rows = list(load_gsm8k("train"))
        except Exception as exc:  # offline, or no datasets package
            raise CalibrationError(
                f"could not load openai/gsm8k from the hub ({why_not_loaded(exc)}): pass --data-dir with "
                "GSM8K's train.jsonl"
            ) from None
    return [f"Question: {row['question']}\nAnswer:" for row in rows[:limit]]


def server_kv_state(base_url: str) -> dict:
    """The plugin's KV scale state from the server's ``/server_info``, over all its data-parallel ranks."""
    from sglang_kimi.launcher.client import get_json
    from sglang_kimi.launcher.dp_reports import merged_report

    info = get_json(base_url, "/server_info", 30, fix="start one or fix --base-url", error=CalibrationError)
    state = merged_report(info)
    kv = state.get("kv_scales")
    if kv is None:
        raise CalibrationError(
            f"the server at {base_url} does not run the sglang-kimi plugin: `pip install sglang-kimi`"
        )
    return kv


def require_observing(base_url: str) -> dict:
    """The server's KV scale state, refused unless it records its KV data (``observe`` mode)."""
    state = server_kv_state(base_url)
    if state.get("mode") != "observe" or not _layers(state):
        raise CalibrationError(
            f"the server at {base_url} does not record its KV data (mode {state.get('mode')!r}): restart it with "
            f"{ENV}=observe (any --kv-cache-dtype), then rerun calibrate-kv"
        )
    return state


def check_output_path(out: Path) -> None:
    """Refuse an ``--out`` that cannot be written before any prompt is sent (creating its folder if needed)."""
    if out.is_dir():
        raise CalibrationError(f"--out {out} is a folder: give the path of the JSON file to write")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CalibrationError(f"--out {out}: cannot create its folder ({exc.strerror or exc}): give a writable path")
    if not os.access(out.parent, os.W_OK) or (out.exists() and not os.access(out, os.W_OK)):
        raise CalibrationError(f"--out {out}: not writable: give a writable path")


def _layers(kv: dict) -> dict[str, dict[int, LayerScale]]:
    out: dict[str, dict[int, LayerScale]] = {}
    for role in (TARGET, DRAFT):
        for layer, e in ((kv.get(role) or {}).get("layers") or {}).items():
            out.setdefault(role, {})[int(layer)] = LayerScale(
                mla=bool(e["mla"]), k_amax=float(e["k_amax"]), v_amax=float(e["v_amax"]), tokens=int(e["tokens"])
            )
    return out


def calibrate(
    base_url: str,
    prompts: list[str],
    *,
    max_new_tokens: int = 64,
    concurrency: int = 4,
    rule: ScaleRule = ScaleRule(),
    before: dict | None = None,
) -> tuple[dict, list[list[int]]]:
    """Run ``prompts`` (greedy) and return (the scale document, every request's prompt + output token ids).
    ``before``: the server's KV state from :func:`require_observing` when the caller already read it."""
    before = require_observing(base_url) if before is None else before

    def run(prompt: str) -> list[int]:
        body = {
            "text": prompt,
            "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0.0},
            "return_logprob": True,
            "logprob_start_len": 0,
        }
        try:
            response = requests.post(base_url + "/generate", json=body, timeout=600, headers=auth_headers())
        except requests.RequestException as exc:
            raise CalibrationError(f"a calibration request to {base_url} failed ({exc}): is the server still up?")
        if response.status_code != 200:
            raise CalibrationError(
                f"the server at {base_url} refused a calibration request (HTTP {response.status_code}: "
                f"{response.text.strip()[:200]}); check its log"
            )
        out = response.json()
        prompt_ids = [tok for _, tok, _ in out["meta_info"]["input_token_logprobs"]]
        return prompt_ids + list(out["output_ids"])

    with ThreadPoolExecutor(max(1, concurrency)) as pool:
        done = tqdm(pool.map(run, prompts), total=len(prompts), desc="calibration prompts", unit="prompt")
        sequences = list(done)
    layers = _layers(server_kv_state(base_url))
    for per_role in layers.values():
        for state in per_role.values():
            state.k_scale, state.v_scale = rule.scale(state.k_amax), rule.scale(state.v_amax)
            if state.mla:  # one latent row serves K and V
                state.k_scale = state.v_scale = max(state.k_scale, state.v_scale)
            state.frozen = True
    models = {role: (before.get(role) or {}).get("model") for role in layers}
    return scales_document(layers, rule, models), sequences


def check_calibration_args(args) -> None:
    """Refuse values that would calibrate nothing, fail midway, or write scales that clip (before any request)."""
    for flag, value in (
        ("--num-prompts", args.num_prompts),
        ("--max-new-tokens", args.max_new_tokens),
        ("--concurrency", args.concurrency),
    ):
        if value < 1:
            raise CalibrationError(f"{flag} {value}: give 1 or more")
    if not (math.isfinite(args.headroom) and args.headroom >= 1.0):
        raise CalibrationError(
            f"--headroom {args.headroom}: give 1 or more (below 1 the scales clip the largest KV values calibrated)"
        )


def run_calibrate_kv(args) -> int:
    check_calibration_args(args)
    use_api_key(args.api_key)
    rule = replace(ScaleRule(), headroom=args.headroom)
    out = Path(args.out).expanduser()
    check_output_path(out)
    # local problems first, then the server, then the hub download (slow, and pointless without a usable server)
    prompts = calibration_prompts(args.data_dir, args.num_prompts) if args.data_dir else None
    from sglang_kimi.evals.servers import normalize_url

    base_url = normalize_url(args.base_url)  # as eval and bench read a URL: http:// added, a trailing /v1 dropped
    before = require_observing(base_url)
    if prompts is None:
        prompts = calibration_prompts(None, args.num_prompts)
    doc, sequences = calibrate(
        base_url,
        prompts,
        max_new_tokens=args.max_new_tokens,
        concurrency=args.concurrency,
        rule=rule,
        before=before,
    )
    out.write_text(json.dumps(doc, indent=2) + "\n")
    tokens = sum(len(s) for s in sequences)
    print(f"calibrated on {len(sequences)} prompts ({tokens} tokens); wrote {out} ({FORMAT})")
    for role in (TARGET, DRAFT):
        layers = (doc.get(role) or {}).get("layers") or {}
        if layers:
            worst = max(layers.items(), key=lambda kv: kv[1]["k_amax"])
            print(
                f"  {role}: {len(layers)} layers; largest |KV| {worst[1]['k_amax']:.4g} (layer {worst[0]}), "
                f"scale {worst[1]['k_scale']:g}"
            )
    print(f"serve with {ENV}={out}, --kv-cache-dtype fp8_e4m3 and --attention-backend triton (MLA targets)")
    return 0


def add_calibrate_kv_parser(sub) -> None:
    parser = sub.add_parser(
        "calibrate-kv",
        help="FP8 KV cache scales from a running server's KV data (target and drafter layers) into a JSON file",
        description="Sends calibration prompts (GSM8K train questions) to a server started with "
        f"{ENV}=observe, reads back the per-layer maxima of everything written to its KV cache and writes "
        f"per-layer k_scale / v_scale. Serve with {ENV}=<file> --kv-cache-dtype fp8_e4m3 --attention-backend triton "
        "(the backend that applies scales to an MLA target's latent cache).",
    )
    parser.add_argument("--base-url", required=True, help="the server, e.g. http://127.0.0.1:30000")
    parser.add_argument("--out", required=True, help="the JSON file to write")
    parser.add_argument("--api-key", default=None, help=API_KEY_HELP)
    parser.add_argument("--data-dir", default=None, help="folder with GSM8K's train.jsonl (default: hub openai/gsm8k)")
    parser.add_argument("--num-prompts", type=int, default=64, help="calibration prompts (default 64)")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="tokens generated per prompt (default 64)")
    parser.add_argument("--concurrency", type=int, default=4, help="requests in flight (default 4)")
    parser.add_argument(
        "--headroom",
        type=float,
        default=ScaleRule().headroom,
        help="room above the observed maxima (default %(default)s)",
    )
