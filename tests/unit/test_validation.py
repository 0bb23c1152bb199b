"""Start-up checks of ``sglang_kimi.speculative.validation`` that need no SGLang process (the launcher's refusals as a
user sees
them are in ``tests/e2e/test_speculative_config.py``)."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
from support.hub_cache import cache_snapshot

from sglang_kimi.errors import SpeculativeConfigError
from sglang_kimi.platform import capabilities
from sglang_kimi.settings import STATIC_TREE_BACKENDS, TREE_MASK_BACKENDS
from sglang_kimi.speculative import drafter_checks, validation


def eagle_shape(steps, topk, tokens):
    return SimpleNamespace(
        speculative_num_steps=steps, speculative_eagle_topk=topk, speculative_num_draft_tokens=tokens
    )


@pytest.mark.parametrize("steps, topk", [(1, 2), (3, 4), (4, 3), (8, 8)])
def test_an_eagle_tree_verifies_at_most_its_candidates_and_the_verified_token(steps, topk):
    """SGLang's tree keeps the best num_draft_tokens - 1 of the topk + (steps - 1) x topk^2 scored candidates; one
    more draft token than that failed the first request (torch.topk out of range) and ended the scheduler."""
    candidates = topk + (steps - 1) * topk * topk
    for tokens in (steps + 1, candidates, candidates + 1):
        validation._check_eagle_shape(eagle_shape(steps, topk, tokens), "EAGLE3")
    with pytest.raises(SpeculativeConfigError) as refused:
        validation._check_eagle_shape(eagle_shape(steps, topk, candidates + 2), "EAGLE3")
    message = str(refused.value)
    assert f"drafts at most {candidates} tokens" in message
    assert f"--speculative-num-draft-tokens is {candidates + 2}: use at most {candidates + 1}" in message


@pytest.mark.parametrize(
    "steps, topk, named",
    [(None, 4, ["--speculative-eagle-topk 4 does not"]), (5, 1, ["--speculative-num-steps 5 does not"]),
     (3, 2, ["--speculative-num-steps 3 and --speculative-eagle-topk 2 do not", "drop them"])],
)  # fmt: skip
def test_eagle_tree_flags_with_dflash_name_the_tree_budget(steps, topk, named):
    """SGLang set them to 1 with a warning and served a DFLASH chain; 1 (or nothing) is what SGLang serves."""
    for served in ((None, None), (1, 1), (1, None)):
        validation._check_dflash_eagle_flags(eagle_shape(*served, None))
    with pytest.raises(SpeculativeConfigError) as refused:
        validation._check_dflash_eagle_flags(eagle_shape(steps, topk, None))
    message = str(refused.value)
    assert all(words in message for words in named) and "--speculative-dflash-tree-budget N" in message, message


def test_an_eagle_chain_is_left_to_sglang():
    """With top-k 1 SGLang sets the draft tokens to steps + 1 itself, whatever was given."""
    validation._check_eagle_shape(eagle_shape(3, 1, 100), "EAGLE3")


@pytest.mark.parametrize("steps, tokens", [(3, 1), (3, 3), (6, 4)])
def test_an_eagle_tree_window_holds_its_longest_accepted_path(steps, tokens):
    """SGLang moves the accepted path (up to steps + 1 tokens) to the front of the num_draft_tokens verify rows: a
    window shorter than that failed the first verify (a RuntimeError in _compact_accept_to_front)."""
    with pytest.raises(SpeculativeConfigError, match=f"is {tokens}: use at least {steps + 1}, or fewer steps"):
        validation._check_eagle_shape(eagle_shape(steps, 4, tokens), "EAGLE3")


@pytest.mark.parametrize(
    "steps, topk, message",
    [
        (-1, 1, "--speculative-num-steps -1: the drafter's steps per round are a count: use 1 or more"),
        (3, 0, "--speculative-eagle-topk 0: use 1 (a chain) or more"),
        (3, -2, "--speculative-eagle-topk -2: use 1 (a chain) or more"),
        (0, 4, "with --speculative-num-steps 0: a tree is drafted in 1 or more steps"),
    ],
)
def test_eagle_counts_below_their_range(steps, topk, message):
    """A negative step count ended SGLang's draft worker at start-up with a bare torch error."""
    with pytest.raises(SpeculativeConfigError, match=re.escape(message)):
        validation._check_eagle_shape(eagle_shape(steps, topk, 4), "EAGLE3")


def thresholds(single, acc, device="cuda"):
    return SimpleNamespace(
        speculative_accept_threshold_single=single, speculative_accept_threshold_acc=acc, device=device
    )


PLAIN = SimpleNamespace(dflash_tree_budget=None, adaptive=False)


def test_relaxed_acceptance_is_refused_where_it_would_not_be_applied(caplog, monkeypatch):
    """SGLang's accept thresholds act only in its CUDA tree-sampling kernel: the plugin's DFLASH tree verify has the
    lossless rule only, and on CPU and ROCm sampled requests with thresholds were verified greedily."""
    import sglang.srt.utils

    monkeypatch.setattr(sglang.srt.utils, "is_hip", lambda: False)
    validation._check_accept_thresholds(thresholds(1.0, 1.0, "cpu"), "DFLASH", PLAIN)  # the default: lossless
    tree = SimpleNamespace(dflash_tree_budget=32, adaptive=False)
    adaptive = SimpleNamespace(dflash_tree_budget=None, adaptive=True)
    for args in (tree, adaptive):
        with pytest.raises(SpeculativeConfigError, match="verify sampled requests with the lossless rule only"):
            validation._check_accept_thresholds(thresholds(0.5, 1.0), "DFLASH", args)
    with pytest.raises(SpeculativeConfigError, match="acc 0.3: .*on CPU sampled requests would be verified greedily"):
        validation._check_accept_thresholds(thresholds(1.0, 0.3, "cpu"), "EAGLE3", PLAIN)
    for other in ("xpu", "npu"):  # no CUDA sampling kernel, and no FlashInfer to name
        with pytest.raises(SpeculativeConfigError, match=f"which --device {other} does not have: drop both"):
            validation._check_accept_thresholds(thresholds(0.5, 1.0, other), "EAGLE3", PLAIN)
    monkeypatch.setattr(capabilities, "flashinfer_installed", lambda: True)
    with caplog.at_level("WARNING", logger="sglang_kimi"):  # CUDA: SGLang's kernel applies them, not lossless
        validation._check_accept_thresholds(thresholds(0.5, 0.5), "EAGLE3", PLAIN)
        validation._check_accept_thresholds(thresholds(0.5, 0.5), "DFLASH", PLAIN)
    assert sum("do not follow the target's distribution" in r.getMessage() for r in caplog.records) == 2
    # CUDA without FlashInfer: SGLang cannot build that kernel, the plugin verifies
    monkeypatch.setattr(capabilities, "flashinfer_installed", lambda: False)
    with pytest.raises(SpeculativeConfigError, match="FlashInfer is not installed.*install FlashInfer"):
        validation._check_accept_thresholds(thresholds(0.5, 1.0), "EAGLE3", PLAIN)
    monkeypatch.setattr(sglang.srt.utils, "is_hip", lambda: True)
    with pytest.raises(SpeculativeConfigError, match="on ROCm sampled requests would be verified greedily"):
        validation._check_accept_thresholds(thresholds(0.5, 0.5), "EAGLE3", PLAIN)


def tree_settings(**fields):
    return SimpleNamespace(
        **{
            "attention_backend": "triton",
            "decode_attention_backend": None,
            "prefill_attention_backend": None,
            "page_size": 1,
            "speculative_draft_window_size": None,
            "enable_dp_attention": False,
            **fields,
        }
    )


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"speculative_draft_window_size": 16}, "--speculative-draft-window-size 16 asks for SGLang's compact"),
        ({"enable_dp_attention": True, "dp_size": 4}, r"with DP attention \(here over 4 groups.*--enable-dp-lm-head"),
        ({"page_size": 16}, r"needs --page-size 1 \(got 16\)"),
        ({"decode_attention_backend": "flashinfer"}, "--decode-attention-backend is flashinfer"),
    ],
)
def test_what_the_tree_worker_cannot_serve_is_refused_before_the_weights_load(fields, message):
    """The DFLASH tree worker (draft trees and adaptive DFLASH) refused a sliding-window draft cache and DP attention
    in its constructor, after the target's weights had loaded; DP attention is served by trees with the LM head split
    over the attention group (``--enable-dp-lm-head``; test_speculative_config.py resolves the launches through
    SGLang's pipeline)."""
    flag, backends = "--speculative-dflash-tree-budget", STATIC_TREE_BACKENDS
    validation._check_tree_verify(tree_settings(), flag, "drop the flag", backends)
    with pytest.raises(SpeculativeConfigError, match=message):
        validation._check_tree_verify(tree_settings(**fields), flag, "drop the flag", backends)


def test_fa3_serves_static_trees_and_adaptive_widths_need_a_mask_at_any_width():
    """FlashAttention 3 verifies a tree of the width it was built with (SGLang's EAGLE-tree path); adaptive widths
    change it each step. On --device cpu the CPU backend check refuses fa3 first, so this is a GPU server's case."""
    fa3 = tree_settings(attention_backend="fa3")
    validation._check_tree_verify(fa3, "--speculative-dflash-tree-budget", "drop the flag", STATIC_TREE_BACKENDS)
    with pytest.raises(SpeculativeConfigError) as refused:
        validation._check_tree_verify(fa3, "--speculative-kimi-adaptive", "drop the flag", TREE_MASK_BACKENDS)
    message = str(refused.value)
    assert "--attention-backend is fa3: FlashAttention 3 keeps one verify width" in message
    assert message.endswith("Use --attention-backend triton or kimi_cpu")
    with pytest.raises(SpeculativeConfigError, match="flashmla verifies MLA chains only") as refused:
        validation._check_tree_verify(
            tree_settings(attention_backend="flashmla"), "--speculative-dflash-tree-budget", "x", STATIC_TREE_BACKENDS
        )
    assert str(refused.value).endswith("Use --attention-backend triton or kimi_cpu or fa3")


def _drafter_settings(path, load_format=None):
    return SimpleNamespace(
        speculative_draft_model_path=str(path),
        speculative_draft_model_revision="main",
        speculative_draft_load_format=load_format,
        load_format="auto",
    )


def test_drafter_tensors_are_checked_in_a_folder_and_in_the_hub_cache(tmp_path, monkeypatch, caplog):
    """The checkpoint check reads a local folder, a hub id's cache once all its safetensors are there, and else the
    hub's safetensors headers; when none can say (offline, unreachable) it is left to SGLang's download, saying so."""
    import huggingface_hub.constants
    from safetensors.torch import load_file, save_file

    from sglang_kimi.assets import TINY_DFLASH
    from sglang_kimi.speculators.configs import parse_drafter_config

    drafter = parse_drafter_config(TINY_DFLASH)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text((TINY_DFLASH / "config.json").read_text())
    save_file({k: v for k, v in load_file(TINY_DFLASH / "model.safetensors").items() if k != "norm.weight"},
              broken / "model.safetensors")  # fmt: skip
    drafter_checks.check_drafter_tensors(_drafter_settings(TINY_DFLASH), drafter)
    with pytest.raises(SpeculativeConfigError, match=r"--speculative-draft-model-path .*broken: .*: norm\.weight\."):
        drafter_checks.check_drafter_tensors(_drafter_settings(broken), drafter)
    drafter_checks.check_drafter_tensors(_drafter_settings(broken, load_format="dummy"), drafter)  # random weights

    cache = tmp_path / "hub"
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    cache_snapshot(cache, "org/broken", [broken / "config.json", broken / "model.safetensors"])
    with pytest.raises(SpeculativeConfigError, match=r"--speculative-draft-model-path org/broken: .*norm\.weight"):
        drafter_checks.check_drafter_tensors(_drafter_settings("org/broken"), drafter)
    cache_snapshot(cache, "org/config-only", [broken / "config.json"])
    # not (wholly) cached: the hub's safetensors headers are asked for, before SGLang downloads anything
    import huggingface_hub

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    hub = {"org/not-cached": sorted(load_file(broken / "model.safetensors"))}
    asked = []

    def get_safetensors_metadata(repo_id, revision=None):
        asked.append((repo_id, revision))
        if repo_id not in hub:
            raise ConnectionError("the hub cannot be reached")
        tensors = {name: None for name in hub[repo_id]}
        return SimpleNamespace(files_metadata={"model.safetensors": SimpleNamespace(tensors=tensors)})

    monkeypatch.setattr(huggingface_hub, "get_safetensors_metadata", get_safetensors_metadata)
    with pytest.raises(SpeculativeConfigError, match=r"org/not-cached: its safetensors lack 1 .*: norm\.weight\."):
        drafter_checks.check_drafter_tensors(_drafter_settings("org/not-cached"), drafter)
    hub["org/not-cached"].append("norm.weight")
    drafter_checks.check_drafter_tensors(_drafter_settings("org/not-cached"), drafter)
    with caplog.at_level("INFO", logger="sglang_kimi"):
        drafter_checks.check_drafter_tensors(_drafter_settings("org/config-only"), drafter)  # the hub cannot say
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
        drafter_checks.check_drafter_tensors(_drafter_settings("org/not-cached"), drafter)  # offline: not asked
    assert caplog.text.count("is not downloaded yet: its tensor names are not checked") == 2
    assert asked == [("org/not-cached", "main")] * 2 + [("org/config-only", "main")]
