"""Driving SGLang's own serving benchmark (``sglang.benchmark.serving``, what ``python -m sglang.bench_serving``
shims to) for one concurrency level.

Reused as is: the streaming request function of the ``sglang`` backend (``async_request_sglang_generate``:
TTFT and per-chunk ITL from ``/generate`` streaming), the ``benchmark()`` coroutine (warm-up, concurrency
semaphore, cache flush, progress bar, its printed result table, ``avg_spec_accept_length`` read from
``/server_info``), ``calculate_metrics`` (throughput, TTFT / TPOT / ITL / E2E mean, median, p90, p95, p99),
``get_tokenizer`` and the random-token dataset (``sample_random_requests``). ``benchmark()`` reads its options
from the module-level ``args`` namespace (``set_global_args``); :func:`bench_args` builds that namespace with
every field the ``sglang`` backend reads.

Importing it pulls in ``sglang.srt`` (``disaggregation.utils``), which imports ``sgl_kernel`` and
``torchvision``; on a machine without a GPU those come from the plugin's CPU import shims, the same ones its
launcher puts on a CPU server's path.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import sys

from sglang_kimi.evals.errors import EvalError


def _add_cpu_shims() -> None:
    from sglang_kimi.launcher.server import SHIMS_DIR, has_gpu, shims_needed

    if not has_gpu() and shims_needed() and str(SHIMS_DIR) not in sys.path:
        sys.path.insert(0, str(SHIMS_DIR))


def import_serving():
    """``sglang.benchmark.serving``, importable on this machine (CPU shims when needed)."""
    if "sglang.benchmark.serving" not in sys.modules:
        _add_cpu_shims()
    try:
        import sglang.benchmark.serving as serving
    except ImportError as exc:
        raise EvalError(
            f"cannot import SGLang's benchmark (sglang.benchmark.serving): {exc}: install SGLang "
            "(pip install 'sglang-kimi[sglang]') or the missing package"
        ) from None
    return serving


def bench_args(
    *, dataset: str, num_prompts: int, input_len: int, output_len: int, warmup_requests: int, output_file: str
) -> argparse.Namespace:
    """The ``args`` that ``benchmark()`` and ``async_request_sglang_generate`` read (backend ``sglang``)."""
    return argparse.Namespace(
        backend="sglang",
        dataset_name=dataset,
        num_prompts=num_prompts,
        random_input_len=input_len,
        random_output_len=output_len,
        random_range_ratio=1.0,
        sharegpt_output_len=None,
        warmup_requests=warmup_requests,
        output_file=output_file,  # SGLang appends one JSON line per level: its full result, server_info included
        output_details=False,
        plot_throughput=False,
        goodput=None,
        cache_report=False,
        mooncake_num_rounds=1,
        tag="sglang-kimi",
        # request function (sglang backend): greedy, fixed output length, streaming
        temperature=0.0,
        top_p=1.0,
        disable_ignore_eos=False,
        disable_stream=False,
        return_logprob=False,
        return_routed_experts=False,
        logprob_start_len=-1,
        top_logprobs_num=0,
        token_ids_logprob=None,
    )


def random_rows(serving, tokenizer, *, input_len: int, output_len: int, num_prompts: int):
    """SGLang's random-token prompts of exactly ``input_len`` ids (sent as ``input_ids``, no re-tokenization)."""
    from sglang.benchmark.datasets.random import sample_random_requests

    with contextlib.redirect_stdout(io.StringIO()):
        return sample_random_requests(
            input_len=input_len,
            output_len=output_len,
            num_prompts=num_prompts,
            range_ratio=1.0,
            tokenizer=tokenizer,
            dataset_path="",
            random_sample=False,  # integers, not ShareGPT (which needs the hub)
            return_text=False,
        )


def text_rows(serving, tokenizer, prompts: list[str], output_len: int):
    from sglang.benchmark.datasets.common import DatasetRow

    return [DatasetRow(prompt=p, prompt_len=len(tokenizer.encode(p)), output_len=output_len) for p in prompts]


def run_level(
    serving, *, base_url: str, model_id: str, tokenizer, rows, concurrency: int, args: argparse.Namespace
) -> dict:
    """One level of the sweep through SGLang's ``benchmark()``; its result dict (metrics, texts, errors)."""
    serving.set_global_args(args)
    return asyncio.run(
        serving.benchmark(
            backend="sglang",
            api_url=base_url + "/generate",
            base_url=base_url,
            model_id=model_id,
            tokenizer=tokenizer,
            input_requests=rows,
            request_rate=float("inf"),  # closed loop: --concurrency requests in flight
            max_concurrency=concurrency,
            disable_tqdm=False,
            lora_names=None,
            lora_request_distribution=None,
            lora_zipf_alpha=None,
            extra_request_body={},
            profile=False,
            flush_cache=True,  # after warm-up: no prefix-cache hits carried over from the previous level
            warmup_requests=args.warmup_requests,
        )
    )
