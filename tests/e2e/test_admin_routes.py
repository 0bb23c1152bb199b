"""SGLang's admin routes on a DFLASH draft-tree server (the plugin's own worker), with requests in flight: what they
do to the served tokens.

- ``/pause_generation`` ``in_place`` and ``retract``, then ``/continue_generation``: the paused requests finish with
  the tokens of the autoregressive server (retracted ones are prefilled again and go on drafting from there);
  ``abort`` ends them with ``finish_reason`` ``abort`` and the server serves on.
- ``/update_weights_from_disk`` to another checkpoint: the server then gives the tokens of a server started on that
  checkpoint (the target's weights and everything derived from them at load change; the drafter keeps its own), and
  back on the original checkpoint its first tokens again. A path that is not a checkpoint is refused and changes
  nothing; so is a checkpoint whose load fails partway (the drafter's), which ended SGLang's scheduler: the plugin
  loads the served checkpoint again (``weight-update-rollback``).
- An update sent while a request decodes is not refused: the tokenizer sent it as the request finished, while the
  scheduler still held the finished batch, and SGLang refused the flush after loading
  (``weight-update-waits-for-idle``).
"""

from __future__ import annotations

import os
import shutil
import threading
import time

import pytest
import requests
import torch
from safetensors.torch import load_file, save_file
from support.servers import launch, server_config
from support.spec_e2e import KIMI_CPU, TINY, generate, generate_all, gsm8k_prompts, spec_metrics

from sglang_kimi.assets import TINY_DFLASH
from sglang_kimi.models import tiny

pytestmark = pytest.mark.e2e

TREE = KIMI_CPU + [
    "--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", str(TINY_DFLASH),
    "--speculative-dflash-tree-budget", "16",
]  # fmt: skip
IN_FLIGHT = 6
LONG = 160  # tokens of the requests in flight: several seconds of decoding on two cores
SHORT = 48
RACE_ROUNDS = 30  # an update sent while a request decodes: SGLang alone refused 4 in 10 of them


ADMIN_TREE = server_config("admin-tree", TREE)
SERVERS = [ADMIN_TREE, TINY]


@pytest.fixture(scope="module")
def tree_server(request, server_pool):
    yield server_pool.get(ADMIN_TREE, request)
    server_pool.stop(ADMIN_TREE)


@pytest.fixture(scope="module")
def other_checkpoint(tmp_path_factory):
    """The tiny model with every weight matrix moved by 30% of its spread (norms kept): another model, same shapes."""
    folder = tmp_path_factory.mktemp("other") / "tiny-kimi-k2.6-other"
    shutil.copytree(tiny.TINY_MODEL, folder)
    weights = folder / "model.safetensors"
    gen = torch.Generator().manual_seed(0)
    moved = {}
    for name, value in load_file(weights).items():
        if value.is_floating_point() and "norm" not in name:
            value = value + 0.3 * value.float().std() * torch.randn(value.shape, generator=gen).to(value.dtype)
        moved[name] = value.contiguous()
    save_file(moved, weights, metadata={"format": "pt"})
    return folder


@pytest.fixture(scope="module")
def prompts():
    return gsm8k_prompts(IN_FLIGHT)


def outputs(url: str, prompts, max_new_tokens: int = SHORT) -> list[list[int]]:
    """The greedy tokens of every prompt, all in flight at once (greedy tokens do not depend on the batch)."""
    answers = generate_all(url, prompts, len(prompts), max_new_tokens=max_new_tokens, ignore_eos=True)
    return [o["output_ids"] for o in answers]


@pytest.fixture(scope="module")
def long_reference(tiny_server, prompts) -> list[list[int]]:
    """The autoregressive server's ``LONG`` greedy tokens of every prompt."""
    return outputs(tiny_server.base_url, prompts, LONG)


def admin(url: str, path: str, payload: dict) -> requests.Response:
    return requests.post(url + path, json=payload, timeout=600)


def while_in_flight(url: str, prompts, action) -> list[dict]:
    """``action()`` once the requests (``LONG`` tokens each) are decoding; their answers when all are done."""
    answers: list[dict | None] = [None] * len(prompts)

    def run(i: int) -> None:
        answers[i] = generate(url, prompts[i], LONG, ignore_eos=True)

    steps = spec_metrics(url)["steps"]
    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 120
    while spec_metrics(url)["steps"] < steps + 3 and time.monotonic() < deadline:  # until a few steps decoded
        time.sleep(0.1)
    assert all(t.is_alive() for t in threads), "the requests ended before the action: make them longer"
    action()
    for thread in threads:
        thread.join(600)
    assert all(a is not None for a in answers), "a request in flight got no answer"
    return answers


@pytest.mark.parametrize("mode", ["in_place", "retract"])
def test_paused_requests_finish_with_the_autoregressive_tokens(tree_server, long_reference, prompts, mode):
    url = tree_server.base_url

    def pause_then_continue():
        assert admin(url, "/pause_generation", {"mode": mode}).status_code == 200
        time.sleep(1.0)
        assert admin(url, "/continue_generation", {}).status_code == 200

    answers = while_in_flight(url, prompts, pause_then_continue)
    assert [a["meta_info"]["finish_reason"]["type"] for a in answers] == ["length"] * len(prompts)
    assert [a["output_ids"] for a in answers] == long_reference


def test_aborted_requests_end_and_the_server_serves_on(tree_server, tiny_server, prompts):
    url = tree_server.base_url

    def pause_aborting():
        assert admin(url, "/pause_generation", {"mode": "abort"}).status_code == 200
        assert admin(url, "/continue_generation", {}).status_code == 200

    answers = while_in_flight(url, prompts, pause_aborting)
    reasons = [a["meta_info"]["finish_reason"]["type"] for a in answers]
    assert "abort" in reasons and all(len(a["output_ids"]) <= LONG for a in answers), reasons
    assert outputs(url, prompts[:3]) == outputs(tiny_server.base_url, prompts[:3])


def test_updated_weights_serve_the_new_model(tree_server, tiny_server, other_checkpoint, tmp_path_factory, prompts):
    url = tree_server.base_url
    original = outputs(tiny_server.base_url, prompts)
    other_server = launch(
        tmp_path_factory, "other-ar", ["--model-path", str(other_checkpoint), "--disable-overlap-schedule"]
    )
    try:
        other = outputs(other_server.base_url, prompts)
    finally:
        other_server.stop()
    assert other != original, "the other checkpoint gives the same tokens: the test could not tell them apart"

    refused = admin(url, "/update_weights_from_disk", {"model_path": str(other_checkpoint / "missing")})
    assert refused.status_code == 400 and not refused.json()["success"]
    assert "is not a folder on the server" in refused.json()["message"], refused.text
    assert outputs(url, prompts) == original
    # a checkpoint that fails partway (the drafter's: names the target lacks) ended the scheduler in SGLang
    refused = admin(url, "/update_weights_from_disk", {"model_path": str(TINY_DFLASH)})
    assert refused.status_code == 400 and str(TINY_DFLASH) in refused.json()["message"], refused.text
    assert "loaded again" in refused.json()["message"]
    assert outputs(url, prompts) == original

    updated = admin(url, "/update_weights_from_disk", {"model_path": str(other_checkpoint)})
    assert updated.status_code == 200 and updated.json()["success"], updated.text
    assert outputs(url, prompts) == other

    # a relative path means what it means to the caller: the server runs in the directory it was started from
    restored = admin(url, "/update_weights_from_disk", {"model_path": os.path.relpath(tiny.TINY_MODEL)})
    assert restored.status_code == 200 and restored.json()["success"], restored.text
    assert outputs(url, prompts) == original


def test_an_update_sent_while_a_request_decodes_is_not_refused(tree_server, tiny_server, prompts):
    """The tokenizer sends the update as the request's last answer arrives (its lock waits for it), while the
    scheduler still holds the finished batch: without the wait, some 4 updates in 10 here came back 400 'the cache
    was not flushed', the new weights loaded. Afterwards the server gives the autoregressive server's tokens."""
    url = tree_server.base_url
    refused, answered = [], []
    for i in range(RACE_ROUNDS):
        prompt = prompts[i % len(prompts)]
        request = threading.Thread(target=lambda: answered.append(generate(url, prompt, 32, ignore_eos=True)))
        request.start()
        time.sleep(0.1)
        answer = admin(url, "/update_weights_from_disk", {"model_path": str(tiny.TINY_MODEL)})
        request.join(600)
        if answer.status_code != 200:
            refused.append((i, answer.text))
    assert not refused, refused
    assert len(answered) == RACE_ROUNDS, "a request beside an update got no answer"
    assert outputs(url, prompts) == outputs(tiny_server.base_url, prompts)
