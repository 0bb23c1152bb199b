"""PD disaggregation with the plugin's DFLASH tree on the decode server: SGLang's prefill server and decode server of
the tiny target (a text-only copy: SGLang refuses the multimodal wrapper's ``--language-model-only`` there), both
with the DFLASH drafter (the prefill server fills the drafter's KV, which travels with the target's), KV moved by
Mooncake over TCP (``--disaggregation-transfer-backend mooncake_tcp``, the registry's CPU build of Mooncake with
Debian's RDMA libraries: ``scripts/fetch_rdma_libs.py``), requests through ``sglang-router --pd-disaggregation``.

Every greedy output equals the non-speculative server's, four requests in flight, prompts served again from the
prefill server's radix cache among them, and the decode server's tree worker drafted them (its acceptance counters
and tree budget in ``/server_info``). Two CPU fixes of SGLang's prefill side make this run (``platform/
registrations.py``: ``cpu-pd-prefill-host-indices``, ``cpu-pd-prefill-no-early-send``).
"""

from __future__ import annotations

import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from support.paths import scripts_importable
from support.router import pd_router
from support.servers import launch
from support.spec_e2e import KIMI_CPU, TINY, generate, gsm8k_prompts
from support.text_only_target import write_text_only_target

from sglang_kimi.assets import TINY_DFLASH
from sglang_kimi.launcher.checks import free_port
from sglang_kimi.launcher.server import fetch_plugin_state

pytestmark = pytest.mark.e2e
SERVERS = [TINY]
PROMPTS, TOKENS, CONCURRENCY, BUDGET = 8, 32, 4, 8
RDMA_LIBS = Path(sys.prefix) / "rdma-libs"  # where `make install` puts them


@pytest.fixture(scope="module")
def pd_servers(tmp_path_factory):
    scripts_importable()
    import fetch_rdma_libs

    libs = fetch_rdma_libs.fetch(RDMA_LIBS) if not fetch_rdma_libs.system_has_library() else None
    env = {"LD_LIBRARY_PATH": os.pathsep.join(p for p in (str(libs or ""), os.environ.get("LD_LIBRARY_PATH")) if p)}
    target = write_text_only_target(tmp_path_factory.mktemp("text-only") / "tiny-kimi-k2.6-text")
    tree = ["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", str(TINY_DFLASH),
            "--speculative-dflash-tree-budget", str(BUDGET)]  # fmt: skip
    common = [*KIMI_CPU, "--model-path", str(target), "--disaggregation-transfer-backend", "mooncake_tcp", *tree,
              "--max-total-tokens", "8192"]  # fmt: skip
    bootstrap = free_port()
    prefill_args = [*common, "--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port", str(bootstrap)]
    prefill = launch(tmp_path_factory, "pd-prefill", prefill_args, env)
    try:
        decode = launch(tmp_path_factory, "pd-decode", [*common, "--disaggregation-mode", "decode"], env)
    except BaseException:
        prefill.stop()
        raise
    try:
        log = tmp_path_factory.mktemp("pd-router") / "router.log"
        with pd_router(prefill.base_url, bootstrap, decode.base_url, log) as url:
            yield url, prefill, decode
    finally:
        decode.stop()
        prefill.stop()


def test_greedy_through_prefill_and_decode_servers_equals_autoregressive(pd_servers, tiny_server):
    url, _, decode = pd_servers
    prompts = gsm8k_prompts(PROMPTS)
    prompts += prompts[:2]  # again: prefilled from the radix cache (an early send of the cached prefix on a GPU)
    with ThreadPoolExecutor(CONCURRENCY) as pool:
        expected = list(pool.map(lambda p: generate(tiny_server.base_url, p, TOKENS)["output_ids"], prompts))
        outputs = list(pool.map(lambda p: generate(url, p, TOKENS)["output_ids"], prompts))
    for i, (got, want) in enumerate(zip(outputs, expected)):
        assert got == want, f"prompt {i}: the PD pair's greedy output differs from the autoregressive server's"
    state = fetch_plugin_state(decode.base_url)
    assert state["failed"] == [], state
    assert state["args"]["dflash_tree_budget"] == BUDGET
    metrics = state["spec_metrics"]
    print(f"DFLASH tree on the decode server: {metrics['steps']} steps, tau {metrics['tau']:.2f}")
    assert metrics["steps"] > 0 and metrics["tau"] > 1.5, metrics
