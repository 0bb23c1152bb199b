"""Speculative settings SGLang cannot serve are refused at start-up, each with one clear error, before weights load.

Every case runs through SGLang's own argument resolution with the plugin loaded (one subprocess for all of them).
A drafter that does not fit and unusable plugin variables also go through real server starts (side by side) to show
the server exits with the message before it loads the target's weights.
"""

import json
from concurrent.futures import ThreadPoolExecutor

import pytest
from support import scale_out
from support.drafter_checkpoints import write_dflash, write_eagle3
from support.resolution import resolve_all

from sglang_kimi.assets import TINY_DFLASH2, TINY_MODEL
from sglang_kimi.launcher.server import ANY_PORT, LaunchError, ServerProcess, launch_command

pytestmark = pytest.mark.e2e


def _edit_config(path, **fields):
    config = json.loads((path / "config.json").read_text())
    for key, value in fields.items():
        if key == "target_layer_ids":
            config["dflash_config"]["target_layer_ids"] = value
        else:
            config[key] = value
    (path / "config.json").write_text(json.dumps(config))
    return path


@pytest.fixture(scope="module")
def drafters(tmp_path_factory):
    root = tmp_path_factory.mktemp("drafters")
    return {
        "dflash": write_dflash(root / "dflash", block_size=8),
        "eagle3": write_eagle3(root / "eagle3"),
        "dflash_vocab": _edit_config(write_dflash(root / "dflash_vocab", block_size=8), vocab_size=5000),
        "dflash_hidden": _edit_config(write_dflash(root / "dflash_hidden", block_size=8), hidden_size=128),
        "dflash_layers": _edit_config(write_dflash(root / "dflash_layers", block_size=8), target_layer_ids=[1, 9]),
        # checkpoints SGLang's drafter loaders would serve with parameters left uninitialized, or fail on late
        "dflash_missing": _edit_tensors(write_dflash(root / "dflash_missing", block_size=8), drop="layers.1.mlp."),
        "eagle3_head_in_model": _edit_tensors(
            write_eagle3(root / "eagle3_head"), rename=("lm_head.", "model.lm_head.")
        ),
        "dflash_no_weights": _edit_tensors(write_dflash(root / "dflash_no_weights", block_size=8), drop=""),
        "dflash_truncated": _truncate(write_dflash(root / "dflash_truncated", block_size=8)),
        "dflash_no_mask": _drop_mask_token(write_dflash(root / "dflash_no_mask", block_size=8)),
        "dflash_bad_json": _write_in(write_dflash(root / "dflash_bad_json", block_size=8), "config.json", "{oops"),
        # read as published: model. prefixes, layers.0. for EAGLE3's midlayer, an extra tensor (warned)
        "dflash_prefixed": _edit_tensors(write_dflash(root / "dflash_prefixed", block_size=8), rename=("", "model.")),
        "eagle3_layers0": _edit_tensors(write_eagle3(root / "eagle3_layers0"), rename=("midlayer.", "model.layers.0.")),
        # a small model of another vocabulary, as a STANDALONE drafter (its config is all resolution reads)
        "standalone_vocab": _other_vocab(root / "standalone_vocab"),
        "standalone": _linked_copy(TINY_MODEL, root / "standalone"),  # another checkpoint of the same vocabulary
        # targets with one MTP layer: in Kimi's wrapper (SGLang has no MTP drafter model for it) and as DeepSeek-V3
        "mtp_wrapper": _mtp_target(root / "mtp_wrapper", flat=False),
        "mtp_deepseek": _mtp_target(root / "mtp_deepseek", flat=True),
        "adaptive": _write(root / "adaptive.json", json.dumps({"widths": [0, 1, 3], "explore_every": 10})),
        "adaptive_bad_json": _write(root / "adaptive_bad.json", '{"widths": [0, 1,'),
        "adaptive_unknown": _write(root / "adaptive_unknown.json", json.dumps({"width": [0, 1]})),
        "adaptive_wide": _write(root / "adaptive_wide.json", json.dumps({"widths": [0, 3, 9]})),
        "adaptive_explore": _write(root / "adaptive_explore.json", json.dumps({"explore_every": 1})),
        "adaptive_type": _write(root / "adaptive_type.json", json.dumps({"hysteresis": "5%"})),
        "adaptive_zero": _write(root / "adaptive_zero.json", json.dumps({"widths": [0]})),
    }


def _other_vocab(folder):
    config = json.loads((TINY_MODEL / "config.json").read_text())
    config["text_config"]["vocab_size"] = 5000
    folder.mkdir()
    return _write_in(folder, "config.json", json.dumps(config))


def _linked_copy(model, folder):
    folder.mkdir()
    for file in model.iterdir():
        (folder / file.name).symlink_to(file)
    return folder


def _mtp_target(folder, flat):
    config = json.loads((TINY_MODEL / "config.json").read_text())
    config["text_config"]["num_nextn_predict_layers"] = 1
    folder.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"):
        (folder / name).symlink_to(TINY_MODEL / name)
    return _write_in(folder, "config.json", json.dumps(config["text_config"] if flat else config))


def _write(path, text):
    path.write_text(text)
    return path


def _write_in(folder, name, text):
    (folder / name).write_text(text)
    return folder


def _edit_tensors(folder, *, drop=None, rename=None):
    """Drop the tensors whose names start with ``drop`` (all of them with "": the file goes), or rename a prefix."""
    from safetensors.torch import load_file, save_file

    path = folder / "model.safetensors"
    tensors = load_file(path)
    if drop is not None:
        tensors = {k: v for k, v in tensors.items() if not k.startswith(drop)}
    if rename is not None:
        old, new = rename
        tensors = {(new + k[len(old) :] if k.startswith(old) else k): v for k, v in tensors.items()}
    path.unlink()
    if tensors:
        save_file(tensors, path)
    return folder


def _drop_mask_token(folder):
    config = json.loads((folder / "config.json").read_text())
    del config["dflash_config"]["mask_token_id"]
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def _truncate(folder):
    path = folder / "model.safetensors"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    return folder


PROFILE_FLAG = "--speculative-kimi-adaptive-profile"


def adaptive(config=None, *extra):
    return [
        "--speculative-kimi-adaptive",
        *(["--speculative-kimi-adaptive-config", str(config)] if config else []),
        *extra,
    ]


def dflash(path, *extra, backend="kimi_cpu"):
    return [
        "--speculative-algorithm",
        "DFLASH",
        "--speculative-draft-model-path",
        str(path),
        "--attention-backend",
        backend,
        *extra,
    ]


def eagle3(path, *extra, backend="kimi_cpu"):
    return [
        "--speculative-algorithm",
        "EAGLE3",
        "--speculative-draft-model-path",
        str(path),
        "--attention-backend",
        backend,
        *extra,
    ]


EAGLE3_CHAIN = ("--speculative-num-steps", "3", "--speculative-eagle-topk", "1")
EAGLE3_TREE = ("--speculative-num-steps", "3", "--speculative-eagle-topk", "2", "--speculative-num-draft-tokens", "6")
EP_DEEPEP = ("--tp", "2", "--moe-a2a-backend", "deepep")
TREE_8 = ("--speculative-dflash-tree-budget", "8")
DP_ATTENTION = ("--tp", "2", "--dp-size", "2", "--enable-dp-attention")  # SGLang rewrites it to --attn-dp-size 2


def other(algorithm, path=None, *extra):
    """SGLang's algorithms that draft with something other than a DFLASH or EAGLE3 drafter."""
    drafter = ["--speculative-draft-model-path", str(path)] if path else []
    return ["--speculative-algorithm", algorithm, *drafter, "--attention-backend", "kimi_cpu", *extra]


def other_drafter_cases(d):
    """Before these refusals: EAGLE served an EAGLE3 drafter at tau 1.0, STANDALONE with one ended the scheduler at
    the first request, and the rest died at start-up with a bare TypeError, AttributeError or AssertionError (or,
    on a GPU, loaded the target a second time as its own drafter)."""
    return [
        (other("NEXTN"), ["NEXTN without --speculative-draft-model-path", "num_nextn_predict_layers 0", "EAGLE3"]),
        (
            ["--model-path", str(d["mtp_wrapper"]), *other("NEXTN")],
            ["is a KimiK25ForConditionalGeneration, which SGLang has no MTP drafter model for"],
        ),
        (other("EAGLE", None, *EAGLE3_CHAIN), ["EAGLE without --speculative-draft-model-path", "MTP"]),
        (other("EAGLE", d["eagle3"], *EAGLE3_CHAIN), ["is an EAGLE3 drafter", "pass --speculative-algorithm EAGLE3"]),
        (other("NEXTN", d["dflash"]), ["is a DFLASH drafter", "pass --speculative-algorithm DFLASH"]),
        (other("STANDALONE"), ["STANDALONE without --speculative-draft-model-path", "separate, smaller model"]),
        (
            other("STANDALONE", TINY_MODEL, *EAGLE3_CHAIN),
            ["STANDALONE with the target itself as --speculative-draft-model-path", "a second time"],
        ),
        (
            other("EAGLE", TINY_MODEL, *EAGLE3_CHAIN),
            ["EAGLE with the target itself as --speculative-draft-model-path", "num_nextn_predict_layers 0"],
        ),
        (other("STANDALONE", d["eagle3"], *EAGLE3_CHAIN), ["is an EAGLE3 drafter", "--speculative-algorithm EAGLE3"]),
        (other("STANDALONE", d["standalone_vocab"]), ["vocabulary of 5000 tokens", "one of 4096"]),
        (
            other("STANDALONE", d["standalone"], "--speculative-num-steps", "3"),
            ["STANDALONE with --speculative-num-steps 3 but no --speculative-eagle-topk"],
        ),
        (other("FROZEN_KV_MTP"), ["FROZEN_KV_MTP without", "Gemma 4 assistant", "DFLASH"]),
        # SGLang's own refusals, raised as the plugin's error type so that the launcher prints them alone
        (other("DSPARK"), ["SpeculativeConfigError: SGLang refused the speculative settings", "DSpark"]),
        (other("UNO"), ["SpeculativeConfigError: SGLang refused the speculative settings", "UNO only supports CUDA"]),
    ]


def cases(d):
    """(argv, the words the one error must contain)."""
    return [
        (dflash(d["dflash_vocab"]), ["vocab_size", "5000", "4096"]),
        (dflash(d["dflash_hidden"]), ["hidden_size", "128", "256"]),
        (dflash(d["dflash_layers"]), ["target_layer_ids", "9"]),
        (dflash(d["dflash"], "--speculative-num-draft-tokens", "12"), ["block_size", "8", "12"]),
        # a DFlash2 selector scores each draft given the one before it: no DDTree over it
        (
            dflash(TINY_DFLASH2, "--speculative-dflash-tree-budget", "8"),
            ["DFlash2DraftModel", "is not served as a DDTree", "--speculative-kimi-adaptive"],
        ),
        (dflash(TINY_DFLASH2, "--speculative-dflash-tree-budget", "8", *adaptive()), ["is not served as a DDTree"]),
        # SGLang's alias for the block, turned into --speculative-num-draft-tokens after the plugin's checks
        (dflash(d["dflash"], "--speculative-dflash-block-size", "12"), ["--speculative-dflash-block-size 8 or less"]),
        (
            dflash(d["dflash"], "--speculative-dflash-block-size", "16", "--speculative-dflash-tree-budget", "16"),
            ["--speculative-dflash-block-size 8 or less"],
        ),
        (dflash(d["dflash"], "--speculative-dflash-tree-budget", "0"), ["--speculative-dflash-tree-budget 0", "1..63"]),
        (
            dflash(d["dflash"], "--speculative-dflash-tree-budget", "64"),
            ["--speculative-dflash-tree-budget 64", "1..63"],
        ),
        (dflash(d["eagle3"]), ["pass --speculative-algorithm EAGLE3"]),
        (
            eagle3(
                d["dflash"],
                "--speculative-num-steps",
                "3",
                "--speculative-eagle-topk",
                "1",
                "--speculative-num-draft-tokens",
                "4",
            ),
            ["pass --speculative-algorithm DFLASH"],
        ),
        (dflash("/nonexistent/drafter"), ["/nonexistent/drafter", "does not exist"]),
        (dflash(d["dflash_missing"]), ["lack 3 of the 25 tensors", "layers.1.mlp.down_proj.weight", "uninitialized"]),
        (
            eagle3(d["eagle3_head_in_model"], "--speculative-num-steps", "3", "--speculative-eagle-topk", "1"),
            ["lack 1 of the 15", "calls for: lm_head.weight (it has model.lm_head.weight, names"],
        ),
        (dflash(d["dflash_no_weights"]), ["holds no weights", "*.safetensors"]),
        (dflash(d["dflash_truncated"]), ["model.safetensors is not a readable safetensors file"]),
        (dflash(d["dflash_bad_json"]), ["--speculative-draft-model-path", "config.json cannot be read"]),
        # the target given as its own drafter; a drafter given to NGRAM, which loads none
        (dflash(TINY_MODEL), ["is the target model itself, not a drafter", "z-lab/Kimi-K2.5-DFlash"]),
        (dflash(d["dflash_no_mask"]), ["has a config.json this plugin cannot serve", "mask_token_id is missing"]),
        (
            [
                "--speculative-algorithm",
                "NGRAM",
                "--speculative-draft-model-path",
                str(d["dflash"]),
                "--attention-backend",
                "kimi_cpu",
            ],  # fmt: skip
            ["NGRAM drafts from n-grams", "drop it"],
        ),
        (
            ["--speculative-algorithm", "EAGLE3", "--attention-backend", "kimi_cpu"],
            ["EAGLE3 needs --speculative-draft-model-path"],
        ),
        # flags SGLang served without reading: rejection sampling outside EAGLE chains, speculative flags (a
        # drafter) without an algorithm (served autoregressively)
        (
            dflash(d["dflash"], "--speculative-use-rejection-sampling"),
            ["--speculative-use-rejection-sampling with --speculative-algorithm DFLASH", "losslessly", "drop the flag"],
        ),
        (
            [
                "--speculative-algorithm",
                "NGRAM",
                "--speculative-use-rejection-sampling",
                "--attention-backend",
                "kimi_cpu",
            ],
            ["--speculative-algorithm NGRAM", "NGRAM does not read it"],
        ),
        (
            ["--speculative-draft-model-path", str(d["dflash"])],
            ["--speculative-draft-model-path given without --speculative-algorithm", "add --speculative-algorithm"],
        ),
        (
            ["--speculative-num-steps", "3", "--speculative-use-rejection-sampling"],
            ["--speculative-num-steps, --speculative-use-rejection-sampling given without", "drop them"],
        ),
        (
            dflash(d["dflash"], "--speculative-token-map", "hot.pt"),
            ["--speculative-token-map (EAGLE's) given with --speculative-algorithm DFLASH", "drop it"],
        ),
        (
            eagle3(d["eagle3"], *EAGLE3_CHAIN, "--speculative-ngram-max-bfs-breadth", "4"),
            ["--speculative-ngram-max-bfs-breadth (NGRAM's) given with --speculative-algorithm EAGLE3"],
        ),
        (
            dflash(d["dflash"], "--speculative-dflash-tree-budget", "8", backend="torch_native"),
            ["torch_native", "triton", "kimi_cpu"],
        ),
        # on --device cpu every speculative mode needs a backend with TARGET_VERIFY: torch_native has none
        (dflash(d["dflash"], backend="torch_native"), ["--attention-backend is torch_native", "kimi_cpu", "triton"]),
        (
            eagle3(
                d["eagle3"],
                "--speculative-num-steps",
                "3",
                "--speculative-eagle-topk",
                "1",
                "--speculative-num-draft-tokens",
                "4",
                backend="torch_native",
            ),
            ["--attention-backend is torch_native", "kimi_cpu", "triton"],
        ),
        (
            eagle3(
                d["eagle3"],
                *EAGLE3_TREE,
                backend="torch_native",
            ),
            ["--attention-backend is torch_native", "kimi_cpu", "triton"],
        ),
        (
            dflash(d["dflash"], "--decode-attention-backend", "torch_native"),
            ["--decode-attention-backend is torch_native", "kimi_cpu"],
        ),
        # the draft worker's own backend: SGLang's EAGLE draft-backend factory has no torch_native (a ValueError
        # after the target's weights loaded); a DFLASH drafter on flashinfer ended start-up on CPU
        (
            eagle3(d["eagle3"], *EAGLE3_CHAIN, "--speculative-draft-attention-backend", "torch_native"),
            ["--speculative-draft-attention-backend is torch_native", "kimi_cpu"],
        ),
        (
            dflash(d["dflash"], "--speculative-draft-attention-backend", "flashinfer"),
            ["--speculative-draft-attention-backend is flashinfer", "kimi_cpu"],
        ),
        # triton on CPU without Triton's interpreter: "0 active drivers" at start-up, or, for a DFLASH drafter, at
        # the first request of a serving server
        (
            dflash(d["dflash"], "--speculative-draft-attention-backend", "triton"),
            ["--speculative-draft-attention-backend triton on --device cpu", "TRITON_INTERPRET=1"],
        ),
        (["--attention-backend", "triton"], ["--attention-backend triton on --device cpu", "TRITON_INTERPRET=1"]),
        (dflash(d["dflash"], "--speculative-dflash-tree-budget", "8", "--page-size", "16"), ["--page-size 1"]),
        # the tree worker refused these only after the target's weights had loaded
        (
            dflash(d["dflash"], "--speculative-dflash-tree-budget", "8", "--speculative-draft-window-size", "16"),
            ["--speculative-draft-window-size 16", "drop --speculative-draft-window-size"],
        ),
        (
            dflash(d["dflash"], *adaptive(), "--speculative-draft-window-size", "16"),
            ["--speculative-kimi-adaptive drafts over the drafter's whole KV cache"],
        ),
        (eagle3(d["eagle3"], "--speculative-dflash-tree-budget", "8"), ["is for DFLASH draft trees"]),
        # DP attention in both spellings, which SGLang resolves into --attn-dp-size before these checks (the plugin's
        # refusal never fired, and SGLang's own came instead, on a GPU only after the weights loaded): trees rank
        # with the head split over the attention group; adaptive widths would differ between the groups
        (
            dflash(d["dflash"], *TREE_8, *DP_ATTENTION),
            ["--speculative-dflash-tree-budget with DP attention (here over 2 groups", "add --enable-dp-lm-head"],
        ),
        (
            dflash(d["dflash"], *adaptive(), "--tp", "2", "--attn-dp-size", "2", "--enable-dp-lm-head"),
            ["--speculative-kimi-adaptive is not served with DP attention", "--speculative-dflash-tree-budget N"],
        ),
        (
            dflash(d["dflash"], *TREE_8, *adaptive(), *DP_ATTENTION, "--enable-dp-lm-head"),
            ["--speculative-kimi-adaptive is not served with DP attention (here over 2 groups"],
        ),
        # SGLang's own DFLASH chain with DP attention: on CPU SGLang refuses it (its refusal, passed on)
        (
            dflash(d["dflash"], "--tp", "2", "--attn-dp-size", "2", "--enable-dp-lm-head"),
            ["DFLASH with dp attention requires CUDA or NPU"],
        ),
        # the verify against the expert-parallel all-to-all's dispatch buffer (no check of SGLang's for these
        # backends; the first batch past it ended a serving scheduler): 16 requests x 9 tokens > 128
        (
            dflash(d["dflash"], "--speculative-dflash-tree-budget", "8", *EP_DEEPEP, "--max-running-requests", "16"),
            [
                "SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK",
                "up to 144 on one rank",
                "16 requests",
                "--max-running-requests to 14",
                "SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK=144",
            ],
        ),
        # with DP attention a rank holds its share of the running requests: 64 / 2 x 6 = 192 > 128
        (
            eagle3(
                d["eagle3"],
                *EAGLE3_TREE,
                "--tp",
                "2",
                "--attn-dp-size",
                "2",
                "--moe-a2a-backend",
                "mooncake",
                "--max-running-requests",
                "64",
            ),
            [
                "SGLANG_MOONCAKE_EP_NUM_MAX_DISPATCH_TOKENS_PER_RANK",
                "up to 192 on one rank",
                "32 requests",
                "x 6 tokens each (--speculative-num-draft-tokens 6)",
            ],
        ),
        # EAGLE draft shapes SGLang dies on with a bare TypeError / AssertionError
        (
            eagle3(d["eagle3"], "--speculative-num-steps", "5"),
            ["--speculative-num-steps 5 but no --speculative-eagle-topk"],
        ),
        (eagle3(d["eagle3"], "--speculative-eagle-topk", "4"), ["topk 4 but no --speculative-num-steps"]),
        (["--speculative-algorithm", "DFLASHX"], ["DFLASHX is not an algorithm SGLang knows", "DFLASH, ", "EAGLE3"]),
        (
            eagle3(d["eagle3"], "--speculative-num-steps", "3", "--speculative-eagle-topk", "4"),
            ["tree (--speculative-eagle-topk 4) without --speculative-num-draft-tokens"],
        ),
        (  # 4 + 2 x 16 candidates: SGLang's first request failed (torch.topk out of range), ending the scheduler
            eagle3(
                d["eagle3"],
                "--speculative-num-steps",
                "3",
                "--speculative-eagle-topk",
                "4",
                "--speculative-num-draft-tokens",
                "60",
            ),
            ["drafts at most 36 tokens", "--speculative-num-draft-tokens is 60: use at most 37"],
        ),
        # relaxed acceptance where it would not be applied: the tree verify is lossless only; on CPU SGLang's
        # sampled verify fell back to greedy
        (
            dflash(
                d["dflash"], "--speculative-dflash-tree-budget", "8", "--speculative-accept-threshold-single", "0.5"
            ),
            ["threshold-single 0.5", "lossless rule only"],
        ),
        (dflash(d["dflash"], "--speculative-accept-threshold-acc", "0.5"), ["on CPU sampled requests", "greedily"]),
        # adaptive speculation: what it cannot drive, and settings files it cannot use
        (
            eagle3(
                d["eagle3"],
                *EAGLE3_TREE,
                *adaptive(),
            ),
            ["--speculative-eagle-topk is 2", "--speculative-eagle-topk 1"],
        ),
        (
            eagle3(d["eagle3"], "--speculative-num-steps", "3", "--speculative-num-draft-tokens", "6", *adaptive()),
            ["--speculative-num-steps 3", "--speculative-num-draft-tokens 6", "set it to 4"],
        ),
        (
            eagle3(d["eagle3"], *adaptive(), "--speculative-adaptive-config", str(d["adaptive"])),
            ["drop --speculative-adaptive-config", "'widths'"],
        ),
        (eagle3(d["eagle3"], "--speculative-num-steps", "5", *adaptive(d["adaptive_wide"])), ["[9]", "(5)"]),
        (eagle3(d["eagle3"], *adaptive(d["adaptive_zero"])), ["never speculate"]),
        (dflash(d["dflash"], *adaptive(), "--speculative-adaptive"), ["drop --speculative-adaptive"]),
        (dflash(d["dflash"], "--speculative-kimi-adaptive-config", str(d["adaptive"])), ["only applies with"]),
        (dflash(d["dflash"], *adaptive("/nonexistent/policy.json")), ["/nonexistent/policy.json", "cannot read"]),
        (dflash(d["dflash"], *adaptive(d["adaptive_bad_json"])), ["adaptive_bad.json", "not valid JSON"]),
        (dflash(d["dflash"], *adaptive(d["adaptive_unknown"])), ["unknown setting(s) width", "widths"]),
        (dflash(d["dflash"], *adaptive(d["adaptive_wide"])), ["[9]", "(7)"]),
        (
            dflash(d["dflash"], "--speculative-dflash-tree-budget", "4", *adaptive(d["adaptive_wide"])),
            ["[9]", "tree budget", "(4)"],
        ),
        (dflash(d["dflash"], *adaptive(d["adaptive_explore"])), ["'explore_every' must be >= 2"]),
        (dflash(d["dflash"], *adaptive(d["adaptive_type"])), ["'hysteresis' must be a number", "5%"]),
        (  # EAGLE's tree flags: SGLang overrode them to 1 with a warning and served a chain
            dflash(d["dflash"], "--speculative-eagle-topk", "4"),
            ["--speculative-eagle-topk 4 does not apply to --speculative-algorithm DFLASH", "tree-budget N"],
        ),
        (
            dflash(d["dflash"], "--speculative-num-steps", "3", "--speculative-eagle-topk", "2"),
            ["--speculative-num-steps 3 and --speculative-eagle-topk 2 do not apply", "drop them"],
        ),
        (  # a cost-profile file that cannot be written: profiled at every start, kept nowhere
            dflash(d["dflash"], *adaptive(None, PROFILE_FLAG, str(d["adaptive"] / "profile.json"))),
            [PROFILE_FLAG, "adaptive.json is a file, not a folder", "drop the flag"],
        ),
        (eagle3(d["eagle3"], *adaptive(None, PROFILE_FLAG, str(d["adaptive"].parent))), ["is a folder: name a file"]),
        (dflash(d["dflash"], "--page-size", "16", *adaptive()), ["--page-size 1"]),
        (
            eagle3(
                d["eagle3"],
                *EAGLE3_TREE,
                "--page-size",
                "16",
            ),
            ["page"],
        ),
    ]


def good_settings(drafters) -> list[list[str]]:
    return [
        dflash(drafters["dflash"]),
        dflash(drafters["dflash"], "--speculative-dflash-tree-budget", "8"),
        # DFLASH trees under DP attention, both spellings (served on CPU too: test_parallel.py)
        dflash(drafters["dflash"], *TREE_8, *DP_ATTENTION, "--enable-dp-lm-head"),
        dflash(drafters["dflash"], *TREE_8, "--tp", "2", "--attn-dp-size", "2", "--enable-dp-lm-head"),
        dflash(drafters["dflash"], "--speculative-draft-attention-backend", "kimi_cpu"),
        ["--attention-backend", "torch_native"],  # no speculative step: SGLang's CPU backend serves it
        dflash(drafters["dflash_prefixed"]),
        eagle3(drafters["eagle3_layers0"]),
        dflash(drafters["dflash_missing"], "--speculative-draft-load-format", "dummy"),  # random weights: no check
        eagle3(drafters["eagle3"], "--speculative-num-steps", "3", "--speculative-eagle-topk", "2",
               "--speculative-num-draft-tokens", "6"),
        eagle3(drafters["eagle3"]),  # SGLang picks the draft shape
        eagle3(drafters["eagle3"], "--speculative-num-steps", "3", "--speculative-eagle-topk", "1"),
        eagle3(drafters["eagle3"], *EAGLE3_CHAIN, "--speculative-use-rejection-sampling"),  # SGLang's chain sampler
        ["--speculative-algorithm", "NGRAM", "--speculative-ngram-max-bfs-breadth", "4", "--attention-backend",
         "kimi_cpu"],
        dflash(drafters["dflash"], *adaptive(drafters["adaptive"])),
        dflash(drafters["dflash"], "--speculative-dflash-tree-budget", "8", *adaptive()),
        dflash(TINY_DFLASH2),  # DFlash2: SGLang's chains, and the plugin's adaptive widths over them
        dflash(TINY_DFLASH2, *adaptive()),
        dflash(drafters["dflash"], "--speculative-num-steps", "1", "--speculative-eagle-topk", "1"),  # what SGLang sets
        dflash(drafters["dflash"], *adaptive(None, PROFILE_FLAG, str(drafters["adaptive"].parent / "new" / "p.json"))),
        eagle3(drafters["eagle3"], *adaptive(drafters["adaptive"])),
        eagle3(drafters["eagle3"], "--speculative-num-steps", "3", "--speculative-num-draft-tokens", "4",
               "--speculative-adaptive", *adaptive()),
        other("STANDALONE", drafters["standalone"], *EAGLE3_CHAIN),  # another model with the target's vocabulary
        # the dispatch buffer holds the largest verify: 14 requests x 9 tokens <= 128; the buffer raised; normal
        # dispatch has no per-rank cap
        dflash(drafters["dflash"], "--speculative-dflash-tree-budget", "8", *EP_DEEPEP, "--max-running-requests", "14"),
        dflash(drafters["dflash"], "--speculative-dflash-tree-budget", "8", *EP_DEEPEP, "--deepep-mode", "normal",
               "--max-running-requests", "16"),
        ["--model-path", str(drafters["mtp_deepseek"]), *other("NEXTN")],  # SGLang's own DeepSeek-V3 MTP drafter
        # the same, with the target named as the drafter (SGLang warns that MTP needs no path)
        ["--model-path", str(drafters["mtp_deepseek"]), *other("EAGLE", drafters["mtp_deepseek"])],
    ]  # fmt: skip


@pytest.fixture(scope="module")
def outcomes(drafters):
    """{"bad": [(argv, words, outcome)], "good": [(argv, outcome)]}: both tables resolved in one subprocess."""
    bad, good = cases(drafters) + other_drafter_cases(drafters), good_settings(drafters)
    resolved = resolve_all([argv for argv, _ in bad] + good)
    return {
        "bad": [(argv, words, out) for (argv, words), out in zip(bad, resolved[: len(bad)])],
        "good": list(zip(good, resolved[len(bad) :])),
    }


def test_the_dispatch_buffer_read_from_its_variable(drafters):
    """The buffer as SGLang's dispatcher sizes it: raised to the verify's 144 tokens it holds 16 requests of a
    budget-8 tree; above DeepEP's bound of 1024 it is refused at resolution, not when the dispatcher is built."""
    argv = dflash(drafters["dflash"], "--speculative-dflash-tree-budget", "8", *EP_DEEPEP, "--max-running-requests",
                  "16")  # fmt: skip
    variable = "SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK"
    raised, beyond = resolve_all([argv], {variable: "144"}) + resolve_all([argv], {variable: "2048"})
    assert raised is None, raised
    assert beyond is not None and f"{variable}=2048" in beyond and "at most 1024" in beyond, beyond


def test_the_scale_out_tables_refusals():
    """Every cell of docs/scale-out.md's table that says "refused" is refused by SGLang's argument pipeline with the
    plugin loaded, in the words the cell stands on."""
    refused = [(row, column, cell) for row, column, cell in scale_out.cells() if isinstance(cell, scale_out.Refused)]
    assert refused
    outcomes = resolve_all([list(cell.argv) for _, _, cell in refused])
    for (row, column, cell), outcome in zip(refused, outcomes):
        assert outcome is not None, f"{row} / {column}: the table says refused, but it resolves"
        assert all(w in outcome for w in cell.words), f"{row} / {column}: {outcome}"


def test_each_bad_setting_is_one_clear_error(outcomes):
    for argv, words, outcome in outcomes["bad"]:
        assert outcome is not None, f"accepted: {argv}"
        assert all(w in outcome for w in words), f"{argv}\n-> {outcome}"


def test_good_settings_resolve(outcomes):
    refused = [(argv, outcome) for argv, outcome in outcomes["good"] if outcome is not None]
    assert not refused, refused


FAILED_START_TIMEOUT = 300.0


def calibrated_scales(path):
    from sglang_kimi.models import kv_scales

    layers = {kv_scales.TARGET: {0: kv_scales.LayerScale(mla=True, k_scale=2.0, v_scale=2.0, frozen=True)}}
    doc = kv_scales.scales_document(layers, kv_scales.RULE, {kv_scales.TARGET: "KimiK25ForConditionalGeneration"})
    path.write_text(json.dumps(doc))
    return path


@pytest.fixture(scope="module")
def failed_starts(drafters, tmp_path_factory):
    """Real server starts that must end before the target's weights load: {name: (plugin variables, error, log
    text)}, the error None where the server started.

    Started side by side (each is one SGLang launcher importing SGLang, then exiting), as the variables they set
    are each one server's own environment."""
    root = tmp_path_factory.mktemp("failed_starts")
    calibrated = calibrated_scales(root / "calibrated.json")
    starts = {  # name -> (SGLang arguments, plugin variables)
        "drafter vocab": (dflash(drafters["dflash_vocab"]), {}),
        "scales missing.json": ([], {"SGLANG_KIMI_KV_SCALES": str(root / "missing.json")}),
        "scales dynamc": ([], {"SGLANG_KIMI_KV_SCALES": "dynamc"}),
        "scales calibrated.json": ([], {"SGLANG_KIMI_KV_SCALES": str(calibrated)}),
        "misspelt variable": ([], {"SGLANG_KIMI_KV_SCALE": "kv_scales.json"}),
    }

    def start(name):
        args, variables = starts[name]
        spec = launch_command(args, port=ANY_PORT)
        spec.env.update(variables)
        log = root / f"{name.replace(' ', '-')}.log"
        server = ServerProcess(spec, log)
        error = None
        try:
            server.wait_ready(FAILED_START_TIMEOUT)
        except LaunchError as exc:
            error = exc
        finally:
            server.stop()
        return variables, error, log.read_text()

    with ThreadPoolExecutor(len(starts)) as pool:
        return dict(zip(starts, pool.map(start, starts)))


def test_server_exits_with_the_error_before_loading_weights(failed_starts):
    _, error, text = failed_starts["drafter vocab"]
    assert error is not None, "the server started"
    assert "vocab_size: drafter has 5000, target has 4096" in str(error)
    assert "Load weight" not in text and "sglang::scheduler" not in text
    # the message alone, not under a traceback
    assert "sglang-kimi: error: DFLASH drafter does not fit the target model" in text and "Traceback" not in text


@pytest.mark.parametrize("value", ["missing.json", "dynamc", "calibrated.json"])
def test_unusable_kv_scales_end_start_up_before_loading_weights(failed_starts, value):
    """SGLANG_KIMI_KV_SCALES naming no usable file: SGLang's processes logged the failed registration and served an
    FP8 KV cache with scale 1.0; the launch now ends with the error, naming the modes and calibrate-kv. A usable
    file with no FP8 KV cache to scale (the CPU server's default dtype) was silently left unused: refused too."""
    variables, error, text = failed_starts[f"scales {value}"]
    setting = variables["SGLANG_KIMI_KV_SCALES"]
    assert error is not None, "the server started"
    assert f"sglang-kimi: error: SGLANG_KIMI_KV_SCALES={setting}" in text, text[-2000:]
    if value == "calibrated.json":
        assert "builds no FP8 KV cache" in text and "--kv-cache-dtype fp8_e4m3" in text
    else:
        assert "no such file" in text and "dynamic, observe, off" in text and "calibrate-kv --out" in text
    assert "Load weight" not in text and "Traceback" not in text


def test_a_misspelt_plugin_variable_ends_start_up_before_loading_weights(failed_starts):
    """SGLANG_KIMI_KV_SCALE (for SGLANG_KIMI_KV_SCALES) was read as unset: the FP8 cache served with other scales."""
    _, error, text = failed_starts["misspelt variable"]
    assert error is not None, "the server started"
    assert "sglang-kimi: error: SGLANG_KIMI_KV_SCALE is not a variable" in text, text[-2000:]
    assert "did you mean SGLANG_KIMI_KV_SCALES" in text
    assert "Load weight" not in text and "Traceback" not in text


def test_kv_scales_the_mla_backend_would_ignore_are_refused_at_resolution(monkeypatch):
    """Through SGLang's own resolution (the attention backends resolved before the plugin's check, the target's MLA
    read from its config): an explicit scale setting with an FP8 cache on a backend that ignores layer.k_scale."""
    monkeypatch.setenv("SGLANG_KIMI_KV_SCALES", "dynamic")
    outcomes = resolve_all(
        [["--attention-backend", "kimi_cpu", "--kv-cache-dtype", "fp8_e4m3"], ["--attention-backend", "kimi_cpu"]]
    )
    assert outcomes[0] is not None and "the target's MLA layers would keep scale 1.0" in outcomes[0], outcomes
    assert "backend(s) kimi_cpu ignore layer.k_scale" in outcomes[0]
    assert outcomes[1] is not None and "builds no FP8 KV cache" in outcomes[1], outcomes  # check_kv_dtype's case
