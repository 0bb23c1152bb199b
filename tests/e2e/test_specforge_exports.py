"""Drafters written by SpecForge's own export code (``support.specforge``) from the draft configs ``sglang-kimi
drafter config`` writes: a DFlash ``export --to hf`` and an EAGLE3 ``export --to sglang`` directory load unchanged
(SGLang's argument pipeline with the plugin: the pairing, the tensor names, the tree and adaptive modes), and the
DFlash one serves with the autoregressive greedy output. SpecForge exports the plugin cannot serve are refused before
the weights load, naming the fix: a DFlash draft config without the mask token (SpecForge resolves it at training
time and writes the file back without it), one with a sliding-window layer, and EAGLE3 exports that set
``norm_output`` (SpecForge's trainer reads it as "norm before the LM head", SGLang as "the next step reads the normed
output") unless the config says ``norm_output_meaning: "sglang"``.

The checkpoints hold SpecForge's own initial weights of the draft models (``training_state.pt`` as its trainer
saves it): what is checked here is the format, not the drafting (``test_drafter_compare.py`` measures drafters)."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest
from support import specforge
from support.resolution import resolve_all
from support.servers import launch
from support.spec_e2e import KIMI_CPU, TINY, generate, gsm8k_prompts

from sglang_kimi.assets import TINY_MODEL
from sglang_kimi.cli import main as cli

pytestmark = pytest.mark.e2e
SERVERS = [TINY]


def draft_config(root, algorithm: str, edit=None):
    path = root / f"{algorithm}.json"
    assert (
        cli.main(["drafter", "config", "--algorithm", algorithm, "--target", str(TINY_MODEL), "--output", str(path)])
        == 0
    )
    if edit is not None:
        config = json.loads(path.read_text())
        edit(config)
        path = root / f"{algorithm}-{edit.__name__}.json"
        path.write_text(json.dumps(config))
    return path


def without_mask(config):
    del config["dflash_config"]["mask_token_id"]


def with_a_sliding_layer(config):
    config["layer_types"][0] = "sliding_attention"
    config["use_sliding_window"], config["sliding_window"] = True, 64


def norm_output_true(config):
    config["norm_output"] = True


def norm_output_false(config):
    config["norm_output"] = False


def norm_output_in_sglangs_meaning(config):
    config["norm_output"], config["norm_output_meaning"] = True, "sglang"


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    root = tmp_path_factory.mktemp("specforge")
    dflash = draft_config(root, "dflash")
    checkpoint = specforge.initial_checkpoint(dflash, root / "dflash.pt", "dflash")
    out = {"dflash": specforge.export("hf", checkpoint, dflash, root / "dflash-hf")}
    for edit in (without_mask, with_a_sliding_layer):  # the same weights, exported with the edited config
        out[edit.__name__] = specforge.export(
            "hf", checkpoint, draft_config(root, "dflash", edit), root / edit.__name__
        )
    eagle3 = draft_config(root, "eagle3")
    checkpoint = specforge.initial_checkpoint(eagle3, root / "eagle3.pt", "eagle3")
    out["eagle3"] = specforge.export("sglang", checkpoint, eagle3, root / "eagle3-sglang")
    for edit in (norm_output_true, norm_output_false, norm_output_in_sglangs_meaning):
        out[edit.__name__] = specforge.export(
            "sglang", checkpoint, draft_config(root, "eagle3", edit), root / edit.__name__
        )
    return out


def dflash(path, *extra):
    return ["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", str(path), *KIMI_CPU, *extra]


def eagle_tree(path):
    return ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", str(path), "--speculative-num-steps",
            "3", "--speculative-eagle-topk", "4", "--speculative-num-draft-tokens", "8", *KIMI_CPU]  # fmt: skip


def test_specforge_exports_load_unchanged_and_the_others_are_refused(exports):
    served = [dflash(exports["dflash"]), dflash(exports["dflash"], "--speculative-dflash-tree-budget", "8"),
              dflash(exports["dflash"], "--speculative-kimi-adaptive"), eagle_tree(exports["eagle3"]),
              eagle_tree(exports["norm_output_in_sglangs_meaning"])]  # fmt: skip
    refused = [dflash(exports["without_mask"], "--speculative-dflash-tree-budget", "8"),
               dflash(exports["with_a_sliding_layer"]), eagle_tree(exports["norm_output_true"]),
               eagle_tree(exports["norm_output_false"])]  # fmt: skip
    outcomes = resolve_all(served + refused)
    assert outcomes[: len(served)] == [None] * len(served), outcomes
    no_mask, sliding, norm_true, norm_false = outcomes[len(served) :]
    assert no_mask is not None and "mask_token_id is missing: add the token id" in no_mask, no_mask
    assert "sglang-kimi drafter config" in no_mask
    assert sliding is not None and "train the drafter with full-attention layers" in sliding, sliding
    # SpecForge's meaning of norm_output ("norm before the LM head") is not SGLang's ("feed the normed output back")
    for refusal in (norm_true, norm_false):
        assert refusal is not None and "norm_output is ambiguous" in refusal, refusal
        assert '"norm_output_meaning": "sglang"' in refusal
    assert "remove norm_output from config.json" in norm_true
    assert "train it again without norm_output" in norm_false


def test_a_specforge_dflash_export_serves_the_autoregressive_greedy_output(exports, tiny_server, tmp_path_factory):
    prompts = gsm8k_prompts(3)
    server = launch(tmp_path_factory, "specforge-dflash", dflash(exports["dflash"], "--speculative-dflash-tree-budget",
                                                                 "8"))  # fmt: skip
    try:
        with ThreadPoolExecutor(3) as pool:
            got = list(pool.map(lambda p: generate(server.base_url, p, 24)["output_ids"], prompts))
            want = list(pool.map(lambda p: generate(tiny_server.base_url, p, 24)["output_ids"], prompts))
    finally:
        server.stop()
    assert got == want
