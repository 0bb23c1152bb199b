"""SGLang's own NGRAM speculation served on CPU: its verify builds the tree's metadata with an ``sgl_kernel`` op that
the CPU shim implements in torch (``reconstruct_indices_from_tree_mask``; without it the first decode ended the
scheduler). Greedy output, penalised and grammar-constrained included, equals the non-speculative server's."""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from support.servers import server_config
from support.spec_e2e import TINY, gsm8k_prompts

PENALISED = {"frequency_penalty": 0.5, "repetition_penalty": 1.3, "min_new_tokens": 4}
CONSTRAINED = {"json_schema": json.dumps({"type": "object", "properties": {"a": {"type": "integer"}}})}


# SGLang sizes the n-gram cache for 10M entries by default (2.7 GB resident); these requests need a few thousand
NGRAM = server_config("ngram", ["--speculative-algorithm", "NGRAM", "--speculative-ngram-capacity", "100000"])
SERVERS = [NGRAM, TINY]


@pytest.fixture(scope="module")
def ngram_server(request, server_pool):
    yield server_pool.get(NGRAM, request)
    server_pool.stop(NGRAM)


def generate(url: str, prompt: str, **sampling) -> list[int]:
    payload = {"text": prompt, "sampling_params": {"max_new_tokens": 48, "temperature": 0.0, **sampling}}
    response = requests.post(url + "/generate", json=payload, timeout=600)
    assert response.status_code == 200, response.text[:300]
    return response.json()["output_ids"]


@pytest.mark.parametrize("options", [{}, PENALISED, CONSTRAINED], ids=["plain", "penalised", "json-schema"])
def test_ngram_greedy_equals_non_speculative(ngram_server, tiny_server, options):
    prompts = gsm8k_prompts(4)
    with ThreadPoolExecutor(len(prompts)) as pool:  # greedy tokens do not depend on the batch
        expected = list(pool.map(lambda prompt: generate(tiny_server.base_url, prompt, **options), prompts))
    # one request at a time: the second round finds the first one's outputs in the n-gram corpus, so drafts get
    # accepted
    for _ in range(2):
        for prompt, reference in zip(prompts, expected):
            assert generate(ngram_server.base_url, prompt, **options) == reference
    accepted = [float(x) for x in re.findall(r"accept len: ([0-9.]+)", ngram_server.log_path.read_text())]
    assert accepted and max(accepted) > 1.5, "NGRAM accepted no drafts: the parity above compared no speculation"
