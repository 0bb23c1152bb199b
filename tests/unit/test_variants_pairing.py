"""Pairing warnings: a drafter declared for Kimi-K2.5 on a K2.6 target, or trained on another quantization, is
logged with the expected acceptance impact; a drafter with another vocab is still an error (validate_pair)."""

import copy
import json
import subprocess
import sys

import pytest

from sglang_kimi.launcher.server import sglang_env
from sglang_kimi.models.quant import formats
from sglang_kimi.models.tiny import kimi_config
from sglang_kimi.speculators import pairing as P
from sglang_kimi.speculators.pairing import DrafterMismatchError

# z-lab/Kimi-K2.5-DFlash's published config (intermediate_size from the checkpoint size)
ZLAB_K25_DFLASH = {
    "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": 7168, "num_hidden_layers": 6,
    "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 18432,
    "vocab_size": 163840, "num_target_layers": 61, "block_size": 8, "max_position_embeddings": 262144,
    "rope_theta": 50000.0, "rms_norm_eps": 1e-6,
    "rope_scaling": {"rope_type": "yarn", "factor": 64.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                     "original_max_position_embeddings": 4096, "beta_fast": 32.0, "beta_slow": 1.0},
    "dflash_config": {"target_layer_ids": [1, 12, 24, 35, 47, 58], "mask_token_id": 163838},
}  # fmt: skip


def kimi_target(quantization: str | None = None) -> dict:
    """A Kimi-K2.5/K2.6 config with the real text dims (the tiny model's wrapper, scaled up; no weights needed)."""
    cfg = kimi_config()
    cfg["text_config"].update(vocab_size=163840, hidden_size=7168, num_hidden_layers=61, first_k_dense_replace=1,
                              max_position_embeddings=262144)  # fmt: skip
    if quantization == "int4":
        cfg["text_config"]["quantization_config"] = formats.int4_quantization_config()
    elif quantization == "mxfp4":
        cfg["quantization_config"] = formats.mxfp4_quantization_config()
    return cfg


@pytest.mark.parametrize(
    "name, release",
    [("z-lab/Kimi-K2.5-DFlash", "K2.5"), ("lightseekorg/kimi-k2.6-eagle3", "K2.6"), ("moonshotai/Kimi-K2.6", "K2.6"),
     ("/models/kimi_k2_6-dflash", "K2.6"), ("moonshotai/Kimi-K2-Thinking", "K2"), ("Qwen/Qwen3-8B", None),
     (None, None)],
)  # fmt: skip
def test_kimi_release(name, release):
    assert P.kimi_release(name) == release


def test_declared_target_heuristic_order():
    explicit = dict(
        ZLAB_K25_DFLASH, dflash_config=dict(ZLAB_K25_DFLASH["dflash_config"], target_model="amd/Kimi-K2.5-MXFP4")
    )
    explicit["_name_or_path"] = "z-lab/Kimi-K2.6-DFlash"
    assert P.declared_target(explicit, "/ckpt/Kimi-K2.6-DFlash") == (
        "amd/Kimi-K2.5-MXFP4",
        "dflash_config.target_model",
    )
    named = dict(ZLAB_K25_DFLASH, _name_or_path="z-lab/Kimi-K2.5-DFlash")
    assert P.declared_target(named, "/ckpt/drafter") == ("z-lab/Kimi-K2.5-DFlash", "_name_or_path")
    assert P.declared_target(ZLAB_K25_DFLASH, "z-lab/Kimi-K2.5-DFlash") == (
        "z-lab/Kimi-K2.5-DFlash",
        "draft model path",
    )
    assert P.declared_target(ZLAB_K25_DFLASH, "/ckpt/my-drafter") == (None, "nothing")


def test_served_quantization_from_the_target_config():
    assert P.served_quantization(kimi_target("int4")) == "int4"
    assert P.served_quantization(kimi_target("mxfp4")) == "mxfp4"
    assert P.served_quantization(kimi_target()) is None
    w4a8 = kimi_target("mxfp4")
    w4a8["quantization_config"]["global_quant_config"]["input_tensors"]["dtype"] = "fp8_e4m3"
    assert P.served_quantization(w4a8) == "w4a8"
    assert (
        P.served_quantization({"quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4"}}) == "nvfp4"
    )


def test_k25_drafter_on_k26_target_warns_with_the_published_finding():
    warnings = P.pairing_warnings(
        kimi_target("int4"),
        ZLAB_K25_DFLASH,
        num_draft_tokens=8,
        target_path="moonshotai/Kimi-K2.6",
        draft_path="z-lab/Kimi-K2.5-DFlash",
    )
    assert len(warnings) == 1
    text = warnings[0]
    assert "Kimi-K2.5" in text and "Kimi-K2.6" in text and "16%" in text and "50%" in text
    assert "--speculative-num-draft-tokens 8" in text and "net slowdown" in text and "lower" in text


def test_matching_or_undeclared_pairs_do_not_warn():
    assert (
        P.pairing_warnings(
            kimi_target("int4"),
            ZLAB_K25_DFLASH,
            num_draft_tokens=8,
            target_path="moonshotai/Kimi-K2.5",
            draft_path="z-lab/Kimi-K2.5-DFlash",
        )
        == []
    )
    assert (
        P.pairing_warnings(
            kimi_target("int4"), ZLAB_K25_DFLASH, target_path="/models/target", draft_path="/models/drafter"
        )
        == []
    )
    # a K2.6 drafter on the K2.6 MXFP4 export it declares
    declared = copy.deepcopy(ZLAB_K25_DFLASH)
    declared["dflash_config"]["target_model_name_or_path"] = "community/Kimi-K2.6-MXFP4"
    assert P.pairing_warnings(kimi_target("mxfp4"), declared, target_path="/models/Kimi-K2.6-MXFP4") == []


def test_int4_vs_mxfp4_training_target_warns():
    declared = copy.deepcopy(ZLAB_K25_DFLASH)
    declared["dflash_config"]["target_model_name_or_path"] = "amd/Kimi-K2.5-MXFP4"
    warnings = P.pairing_warnings(kimi_target("int4"), declared, target_path="moonshotai/Kimi-K2.5")
    assert len(warnings) == 1 and "MXFP4" in warnings[0] and "INT4" in warnings[0] and "lossless" in warnings[0]
    # a drafter named after Moonshot's (INT4) release, served on an MXFP4 export of the same release
    warnings = P.pairing_warnings(
        kimi_target("mxfp4"), ZLAB_K25_DFLASH, target_path="amd/Kimi-K2.5-MXFP4", draft_path="z-lab/Kimi-K2.5-DFlash"
    )
    assert len(warnings) == 1 and "trained on the INT4 checkpoint" in warnings[0]


def test_incompatible_vocab_is_an_error():
    other_vocab = dict(ZLAB_K25_DFLASH, vocab_size=151936)  # a Qwen3 drafter's vocab
    with pytest.raises(DrafterMismatchError, match="vocab_size: drafter has 151936, target has 163840"):
        P.validate_pair(kimi_target("int4"), other_vocab, num_draft_tokens=8, expected_algorithm="DFLASH")
    P.validate_pair(kimi_target("int4"), ZLAB_K25_DFLASH, num_draft_tokens=8, expected_algorithm="DFLASH")
    found = P.pairing_warnings(
        kimi_target("int4"),
        ZLAB_K25_DFLASH,
        num_draft_tokens=8,
        target_path="moonshotai/Kimi-K2.6",
        draft_path="z-lab/Kimi-K2.5-DFlash",
    )
    assert len(found) == 1


# The start-up path itself (validation._resolve_speculative calls it with SGLang's resolved args), configs read by
# SGLang's own loader from folders named like the published checkpoints.
STARTUP = r"""
import logging, sys, types
from sglang_kimi.speculative import drafter_checks
from sglang_kimi.speculators.pairing import DrafterMismatchError
logging.basicConfig(level=logging.WARNING, stream=sys.stdout, format="%(message)s")
target, drafter, bad = sys.argv[1:4]
def cfg(draft):
    return types.SimpleNamespace(model_path=target, trust_remote_code=False, revision=None,
                                 speculative_draft_model_path=draft, speculative_draft_model_revision=None,
                                 speculative_num_draft_tokens=8, load_format="auto",
                                 speculative_draft_load_format="dummy")  # config-only folders: random weights
class Count(logging.Handler):
    seen = 0
    def emit(self, record):
        Count.seen += "the drafter was trained" in record.getMessage()
logging.getLogger("sglang_kimi").addHandler(Count())
drafter_checks.check_pair(cfg(drafter), "DFLASH")
print("WARNINGS", Count.seen)
try:
    drafter_checks.check_pair(cfg(bad), "DFLASH")
except DrafterMismatchError as exc:
    print("REFUSED", str(exc).replace(chr(10), " "))
"""


def test_startup_path_warns_and_refuses(tmp_path):
    dirs = {
        "target": tmp_path / "Kimi-K2.6",
        "drafter": tmp_path / "Kimi-K2.5-DFlash",
        "bad": tmp_path / "Qwen3-DFlash",
    }
    configs = {
        "target": kimi_target("int4"),
        "drafter": ZLAB_K25_DFLASH,
        "bad": dict(ZLAB_K25_DFLASH, vocab_size=151936),
    }
    for key, path in dirs.items():
        path.mkdir()
        (path / "config.json").write_text(json.dumps(configs[key]))
    env, _ = sglang_env(cpu=True)
    out = subprocess.run(
        [sys.executable, "-c", STARTUP, *map(str, dirs.values())], env=env, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "WARNINGS 1" in out.stdout and "sglang-kimi: the drafter was trained for Kimi-K2.5" in out.stdout
    assert "acceptance 16% at 8 draft tokens" in out.stdout
    assert "REFUSED" in out.stdout and "vocab_size: drafter has 151936, target has 163840" in out.stdout
