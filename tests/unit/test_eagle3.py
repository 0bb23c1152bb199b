"""EAGLE3 drafter: the SpecForge / lightseek config formats (GQA and MLA, eagle3.1 flags, SGLang's capture rule),
the published tensor names and what SGLang's loaders consume, d2t/t2d, SGLang's draft semantics (extend pairs
each feature with the NEXT token, the next step reads the drafter's own pre-norm output), losslessness in the
reference loop, and the trained tiny drafter."""

from __future__ import annotations

import math
import re

import pytest
import torch
from support.drafter_models import (
    ASSET_BUDGET_BYTES,
    EAGLE3_GQA,
    EAGLE3_MLA,
    EAGLE31_MLA,
    NVIDIA_EAGLE3,
    fixture,
    gsm8k_test_prompts,
    randomize,
    scaled_eagle3,
    tiny_compact,
)
from support.spec_helpers import single_thread  # noqa: F401 (an autouse fixture)
from support.targets import TinyTarget

from sglang_kimi.assets import TINY_EAGLE3
from sglang_kimi.speculators.configs import DrafterConfigError, Eagle3Config
from sglang_kimi.speculators.drafter_tensors import published_weight_names
from sglang_kimi.speculators.reference.eagle3 import Eagle3Drafter, build_vocab_map
from sglang_kimi.speculators.reference.layers import rope_for
from sglang_kimi.speculators.reference.loop import DraftContext, EagleProposer, generate

# ----------------------------------------------------------------------------------------------------------------
# config
# ----------------------------------------------------------------------------------------------------------------


def test_published_configs():
    gqa = Eagle3Config.from_dict(fixture(EAGLE3_GQA))
    assert (gqa.architecture, gqa.attention, gqa.hidden_size, gqa.intermediate_size) == (
        "LlamaForCausalLMEagle3", "gqa", 7168, 12288)  # fmt: skip
    assert (gqa.num_attention_heads, gqa.num_key_value_heads, gqa.head_dim) == (64, 64, 128)
    assert gqa.draft_vocab_size == gqa.vocab_size == 163840 and not gqa.lm_head_from_target
    assert gqa.rope_theta == 1e6 and gqa.rope_scaling is None and gqa.rms_norm_eps == 1e-6
    assert gqa.aux_layer_ids is None and gqa.num_aux_hidden_states == 3
    assert gqa.capture_points(61) == [2, 30, 58] and gqa.resolve_target_layer_ids(61) == [1, 29, 57]

    mla = Eagle3Config.from_dict(fixture(EAGLE3_MLA))
    assert (mla.architecture, mla.attention) == ("Eagle3DeepseekV2ForCausalLM", "mla")
    assert (mla.q_lora_rank, mla.kv_lora_rank, mla.qk_nope_head_dim, mla.qk_rope_head_dim, mla.v_head_dim) == (
        1536, 512, 128, 64, 128)  # fmt: skip
    assert mla.aux_layer_ids == (1, 29, 57) and mla.capture_points(61) == [2, 30, 58]
    assert not mla.fc_norm and not mla.norm_output

    v31 = Eagle3Config.from_dict(fixture(EAGLE31_MLA))
    assert v31.fc_norm and v31.norm_output
    assert Eagle3Config.from_dict(fixture(NVIDIA_EAGLE3)).intermediate_size == 18432
    for name in (EAGLE3_GQA, EAGLE3_MLA, EAGLE31_MLA):
        cfg = Eagle3Config.from_dict(fixture(name))
        assert Eagle3Config.from_dict(cfg.to_dict()) == cfg


@pytest.mark.parametrize("value", [True, False])
def test_norm_output_on_a_gqa_drafter_must_say_its_meaning(value):
    """SpecForge's EAGLE3 trainer reads norm_output as "norm before the LM head" (feeding the pre-norm output back),
    SGLang as "the next step reads the normed output": a LlamaForCausalLMEagle3 config that sets it without
    norm_output_meaning is refused, with the fix for each trainer; the MLA drafter (which SpecForge does not export)
    is not."""
    d = fixture(EAGLE3_GQA)
    d["norm_output"] = value
    with pytest.raises(DrafterConfigError, match="norm_output is ambiguous") as refused:
        Eagle3Config.from_dict(d)
    message = str(refused.value)
    assert ("remove norm_output from config.json" in message) == value
    assert ("train it again without norm_output" in message) == (not value)
    assert '"norm_output_meaning": "sglang"' in message
    cfg = Eagle3Config.from_dict({**d, "norm_output_meaning": "sglang"})
    assert cfg.norm_output == value and Eagle3Config.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(DrafterConfigError, match="'specforge' is not understood"):
        Eagle3Config.from_dict({**d, "norm_output_meaning": "specforge"})
    mla = fixture(EAGLE3_MLA)
    assert Eagle3Config.from_dict({**mla, "norm_output": value}).norm_output == value


def test_capture_rule():
    """SGLang: ids starting with 1 are layer outputs (captured at l+1); any other list is raw capture points."""
    d = fixture(EAGLE3_MLA)
    d["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [2, 30, 58]
    cfg = Eagle3Config.from_dict(d)
    assert cfg.capture_points(61) == [2, 30, 58] and cfg.resolve_target_layer_ids(61) == [1, 29, 57]
    d["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [0, 3]
    cfg = Eagle3Config.from_dict(d)
    assert cfg.num_aux_hidden_states == 2 and cfg.resolve_target_layer_ids(6) == [-1, 2]  # -1: the embeddings


def test_config_errors():
    cases = [
        (lambda d: d.update(num_hidden_layers=2), "EAGLE3 drafters have one decoder layer"),
        (lambda d: d.update(tie_word_embeddings=True), "tie_word_embeddings is not supported"),
        (lambda d: d.update(eagle_config={"use_aux_hidden_state": False}), "use_aux_hidden_state false"),
        (lambda d: d.update(eagle_config={"eagle_aux_hidden_state_layer_ids": "1,2"}), "non-empty int list"),
        (lambda d: d.update(num_key_value_heads=5), "not a multiple of num_key_value_heads 5"),
        (lambda d: d.update(architectures=["LlamaForCausalLM"]), "not an EAGLE3 drafter config"),
    ]
    for edit, message in cases:
        d = fixture(EAGLE3_GQA)
        edit(d)
        with pytest.raises(DrafterConfigError, match=re.escape(message)):
            Eagle3Config.from_dict(d)
    d = fixture(EAGLE3_MLA)
    d.pop("q_lora_rank")
    with pytest.raises(DrafterConfigError, match="config has no 'q_lora_rank'"):
        Eagle3Config.from_dict(d)


def test_mla_rope_and_scale():
    """MLA drafts use SGLang's deepseek_yarn: interleaved pairs, cos/sin * get_mscale(f, mscale) /
    get_mscale(f, mscale_all_dim), softmax scale * get_mscale(f, mscale_all_dim)^2."""
    from sglang_kimi.speculators.reference.eagle3 import Eagle3MLAAttention

    cfg = Eagle3Config.from_dict(fixture(EAGLE3_MLA))
    rope = rope_for(cfg)
    assert not rope.neox and rope.deepseek and rope.attention_factor() == 1.0
    small = Eagle3Config.from_dict(scaled_eagle3(EAGLE3_MLA))
    attn = Eagle3MLAAttention(small)
    m = 0.1 * math.log(4.0) + 1.0
    assert attn.scale == pytest.approx((8 + 4) ** -0.5 * m * m)


# ----------------------------------------------------------------------------------------------------------------
# tensor names
# ----------------------------------------------------------------------------------------------------------------


def sglang_llama_eagle3_consumed(name: str) -> str | None:
    """LlamaForCausalLMEagle3.load_weights: midlayer -> layers.0, fused qkv / gate_up, "model." prefix;
    d2t becomes hot_token_id, t2d is skipped."""
    if name in ("d2t", "t2d"):
        return None
    name = name.replace("midlayer", "layers.0")
    for fused, part in ((".qkv_proj", ".q_proj"), (".qkv_proj", ".k_proj"), (".qkv_proj", ".v_proj"),
                        (".gate_up_proj", ".gate_proj"), (".gate_up_proj", ".up_proj")):  # fmt: skip
        if part in name:
            name = name.replace(part, fused)
            break
    return name if name.startswith("lm_head") else f"model.{name}"


SGLANG_LLAMA_EAGLE3_PARAMETERS = {
    "model.embed_tokens.weight",
    "model.fc.weight",
    "model.layers.0.self_attn.qkv_proj.weight",
    "model.layers.0.self_attn.o_proj.weight",
    "model.layers.0.mlp.gate_up_proj.weight",
    "model.layers.0.mlp.down_proj.weight",
    "model.layers.0.input_layernorm.weight",
    "model.layers.0.post_attention_layernorm.weight",
    "model.layers.0.hidden_norm.weight",
    "model.norm.weight",
    "lm_head.weight",
}  # fmt: skip  (LlamaForCausalLMEagle3.named_parameters(); the embedding comes from the target)


def sglang_mla_eagle3_consumed(name: str) -> str | None:
    """Eagle3DeepseekV2ForCausalLM.load_weights: layers.0 -> midlayer, "model." prefix, q_a_proj and
    kv_a_proj_with_mqa fused into fused_qkv_a_proj_with_mqa, gate/up fused."""
    if name in ("d2t", "t2d"):
        return None
    name = re.sub(r"^layers\.0\.", "midlayer.", name)
    name = name if name.startswith("lm_head.") else f"model.{name}"
    for part in ("q_a_proj", "kv_a_proj_with_mqa"):
        if f".{part}." in name:
            return name.replace(part, "fused_qkv_a_proj_with_mqa")
    for part in ("gate_proj", "up_proj"):
        if f".{part}." in name:
            return name.replace(part, "gate_up_proj")
    return name


def test_weight_names_gqa():
    cfg = Eagle3Config.from_dict(scaled_eagle3(EAGLE3_GQA))
    model = Eagle3Drafter(cfg)
    assert model.checkpoint_names() == published_weight_names(cfg)
    assert sorted(n for n in model.checkpoint_names() if not n.startswith("midlayer.")) == [
        "d2t", "fc.weight", "lm_head.weight", "norm.weight", "t2d"]  # fmt: skip
    consumed = {sglang_llama_eagle3_consumed(n) for n in model.checkpoint_names()} - {None}
    assert consumed == SGLANG_LLAMA_EAGLE3_PARAMETERS - {"model.embed_tokens.weight"}
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert shapes["midlayer.self_attn.q_proj.weight"] == (4 * 8, 2 * 16)  # qkv take cat(embed, h): 2H
    assert shapes["fc.weight"] == (16, 3 * 16) and shapes["lm_head.weight"] == (24, 16)
    assert shapes["d2t"] == (24,) and shapes["t2d"] == (32,)


@pytest.mark.parametrize("name", [EAGLE3_MLA, EAGLE31_MLA])
def test_weight_names_mla(name):
    cfg = Eagle3Config.from_dict(scaled_eagle3(name))
    model = Eagle3Drafter(cfg)
    names = model.checkpoint_names()
    assert names == published_weight_names(cfg)
    attn = {n.split(".")[2] for n in names if n.startswith("midlayer.self_attn.")}
    assert attn == {"q_a_proj", "q_a_layernorm", "q_b_proj", "kv_a_proj_with_mqa", "kv_a_layernorm", "kv_b_proj",
                    "o_proj"}  # fmt: skip
    assert ("fc_norm.0.weight" in names) == cfg.fc_norm
    expected = {"model.fc.weight", "model.norm.weight", "lm_head.weight"} | {
        f"model.midlayer.{n}.weight" for n in ("input_layernorm", "hidden_norm", "post_attention_layernorm",
        "self_attn.fused_qkv_a_proj_with_mqa", "self_attn.q_a_layernorm", "self_attn.q_b_proj",
        "self_attn.kv_a_layernorm", "self_attn.kv_b_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")
    }  # fmt: skip
    if cfg.fc_norm:
        expected |= {f"model.fc_norm.{i}.weight" for i in range(3)}
    assert {sglang_mla_eagle3_consumed(n) for n in names} - {None} == expected
    assert model.state_dict()["midlayer.self_attn.kv_a_proj_with_mqa.weight"].shape == (8 + 4, 2 * 16)


def test_load_accepts_both_layer_spellings(tmp_path):
    from safetensors.torch import load_file, save_file

    model = randomize(Eagle3Drafter(Eagle3Config.from_dict(scaled_eagle3(EAGLE3_MLA))))
    model.set_vocab_map(torch.arange(0, 32)[torch.arange(32) % 4 != 1])
    model.save_pretrained(tmp_path, dtype=torch.float32)
    sd = load_file(tmp_path / "model.safetensors")
    save_file({k.replace("midlayer.", "layers.0."): v for k, v in sd.items()}, tmp_path / "model.safetensors")
    loaded = Eagle3Drafter.from_pretrained(tmp_path)
    for k, v in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v), k


# ----------------------------------------------------------------------------------------------------------------
# d2t / t2d
# ----------------------------------------------------------------------------------------------------------------


def test_vocab_map():
    model = Eagle3Drafter(Eagle3Config.from_dict(scaled_eagle3(EAGLE3_GQA)))
    counts = torch.zeros(32, dtype=torch.long)
    counts[[3, 7, 9, 30]] = torch.tensor([5, 9, 5, 1])
    counts[10:30] = 2
    ids = build_vocab_map(counts, 24)  # 7, then 3 and 9 (ties to the lower id), 10..29, 30, then 0.. by id
    assert ids.tolist() == sorted([7, 3, 9, *range(10, 30), 30])
    model.set_vocab_map(ids)
    assert torch.equal(model.token_map, ids)  # target_id = draft_id + d2t[draft_id]
    assert torch.equal(model.d2t, ids - torch.arange(24))
    assert model.t2d.sum() == 24 and bool(model.t2d[ids].all()) and not bool(model.t2d[[0, 1, 2, 31]].any())
    with pytest.raises(ValueError, match="strictly increasing"):
        model.set_vocab_map(ids.flip(0))


def test_step_drafter_probabilities_live_on_the_draft_vocab():
    model, ctx = drafter_and_context(EAGLE3_GQA)
    probs = model.step_drafter()(ctx, ctx.tokens[-1:][None])
    assert probs.shape == (1, 32) and torch.allclose(probs.sum(), torch.tensor(1.0))
    assert bool((probs[0, ~model.t2d] == 0).all()) and bool((probs[0, model.t2d] > 0).all())


# ----------------------------------------------------------------------------------------------------------------
# SGLang's semantics
# ----------------------------------------------------------------------------------------------------------------


def drafter_and_context(name: str, seed: int = 0, **overrides):
    model = randomize(Eagle3Drafter(Eagle3Config.from_dict(scaled_eagle3(name, **overrides))), seed)
    model.set_vocab_map(torch.arange(0, 32)[torch.arange(32) % 4 != 1])  # 24 ids
    gen = torch.Generator().manual_seed(seed + 1)
    model.attach_target(torch.randn(32, 16, generator=gen))
    tokens = torch.randint(0, 32, (9,), generator=gen)
    return model, DraftContext(tokens, torch.randn(8, 48, generator=gen))


def sequential_logits(model: Eagle3Drafter, ctx: DraftContext, path: list[int]) -> torch.Tensor:
    """Draft-vocab logits after path [root, x1..xs] the slow way: the committed rows (h_i, t_{i+1}) at positions
    i = 0..T-2, then x_d paired with the previous row's next-step state at position T-2+d, all causal."""
    tokens = ctx.tokens.tolist()
    n = len(tokens) - 1
    h = model.project(ctx.hidden_states)  # [T-1, H]
    embeds = [model.embed(torch.tensor(t)) for t in tokens[1:]]
    states = list(h)
    nexth = None
    with torch.no_grad():
        for d, token in enumerate([None] + path[1:]):
            if token is not None:  # the new row: embed(x_d) with the previous row's next-step h
                embeds.append(model.embed(torch.tensor(token)))
                states.append(nexth)
            rows = len(embeds)
            mask = torch.ones(rows, rows, dtype=torch.bool).tril()[None]
            normed, hidden, _ = model(torch.stack(embeds)[None], torch.stack(states)[None],
                                      torch.arange(rows)[None], None, mask)  # fmt: skip
            nexth = hidden[0, -1]
    assert rows == n + len(path) - 1
    return model.logits(normed[0, -1])


@pytest.mark.parametrize("name", [EAGLE3_GQA, EAGLE3_MLA, EAGLE31_MLA])
def test_step_drafter_matches_sequential_recompute(name):
    model, ctx = drafter_and_context(name)
    step = model.step_drafter()
    root = int(ctx.tokens[-1])
    p0 = step(ctx, torch.tensor([[root]]))
    kids = p0[0].topk(3).indices.tolist()
    p1 = step(ctx, torch.tensor([[root, k] for k in kids]))
    grand = [int(p1[1].argmax()), int(p1[0].argmax())]
    p2 = step(ctx, torch.tensor([[root, kids[1], grand[0]], [root, kids[0], grand[1]]]))
    for path, probs in [([root], p0[0]), ([root, kids[2]], p1[2]), ([root, kids[0], grand[1]], p2[1])]:
        expect = torch.zeros(32)
        expect[model.token_map] = torch.softmax(sequential_logits(model, ctx, path), -1)
        assert torch.allclose(probs, expect, atol=1e-5), path


def test_extend_pairs_features_with_the_next_token():
    """Changing t_{i+1} changes row i (it is paired with h_i); the last committed token is read by the last row."""
    model, ctx = drafter_and_context(EAGLE3_GQA)
    with torch.no_grad():
        base, _, _ = model.extend(ctx.hidden_states, ctx.tokens[1:])
        tokens = ctx.tokens.clone()
        tokens[-1] = (tokens[-1] + 1) % 32  # the root: paired with the last feature row
        other, _, _ = model.extend(ctx.hidden_states, tokens[1:])
        tokens0 = ctx.tokens.clone()
        tokens0[0] = (tokens0[0] + 1) % 32  # t_0 has no row: no feature precedes it
        same, _, _ = model.extend(ctx.hidden_states, tokens0[1:])
    assert not torch.allclose(base, other) and torch.equal(base, same)


def test_norm_output_flag():
    """The next step reads the pre-norm output, or with eagle3.1 norm_output the normed one."""
    for flag in (False, True):
        model, ctx = drafter_and_context(EAGLE3_MLA, norm_output=flag)
        emb = model.embed(ctx.tokens[1:])[None]
        with torch.no_grad():
            normed, hidden, _ = model(emb, ctx.hidden_states[None], torch.arange(8)[None], None,
                                      torch.ones(8, 8, dtype=torch.bool).tril()[None])  # fmt: skip
        assert torch.equal(hidden, normed) == flag
        if not flag:
            assert torch.allclose(model.norm(hidden), normed)


@pytest.mark.parametrize("name,steps,topk,tokens", [(EAGLE3_GQA, 3, 1, 4), (EAGLE31_MLA, 4, 3, 8)])
def test_lossless_in_the_reference_loop(name, steps, topk, tokens):
    target = TinyTarget(vocab_size=32, hidden_size=16, num_layers=3, capture_layer_ids=(0, 1, 2), seed=5)
    model = randomize(Eagle3Drafter(Eagle3Config.from_dict(scaled_eagle3(name))), 2)
    model.set_vocab_map(torch.arange(0, 32)[torch.arange(32) % 4 != 1])
    model.attach_target(target.embed.data)
    prompt = torch.randint(0, 30, (10,), generator=torch.Generator().manual_seed(1))
    ar = generate(target, prompt, 14)
    proposer = EagleProposer(drafter=model.step_drafter(), num_steps=steps, topk=topk, num_draft_tokens=tokens)
    assert generate(target, prompt, 14, proposer=proposer).tokens == ar.tokens


# ----------------------------------------------------------------------------------------------------------------
# the trained tiny drafter
# ----------------------------------------------------------------------------------------------------------------


def trained():
    return Eagle3Drafter.from_pretrained(TINY_EAGLE3, dtype=torch.float64)


def test_trained_asset_format_and_size():
    from safetensors import safe_open

    model = trained()
    size = (TINY_EAGLE3 / "model.safetensors").stat().st_size
    assert size < ASSET_BUDGET_BYTES, size
    with safe_open(TINY_EAGLE3 / "model.safetensors", "pt") as f:
        assert sorted(f.keys()) == published_weight_names(model.config)
        assert f.get_tensor("d2t").dtype == torch.int64 and f.get_tensor("t2d").dtype == torch.bool
        assert f.get_tensor("lm_head.weight").dtype == torch.bfloat16
    cfg = model.config
    assert cfg.architecture == "LlamaForCausalLMEagle3" and cfg.draft_vocab_size < cfg.vocab_size == 4096
    assert cfg.resolve_target_layer_ids(6) == [1, 2, 4]
    assert int(model.t2d.sum()) == cfg.draft_vocab_size and bool(model.t2d[model.token_map].all())


def test_trained_drafter_accepts_tokens_losslessly():
    import _drafter_common as common

    model = trained()
    target_model = tiny_compact()
    model.attach_target(target_model.embed_tokens.weight)
    layers = model.config.resolve_target_layer_ids(6)
    taus = []
    for prompt in gsm8k_test_prompts(2):
        ar = generate(common.CachedTarget(target_model), prompt, 40)
        proposer = EagleProposer(drafter=model.step_drafter(), num_steps=3, topk=1, num_draft_tokens=4)
        spec = generate(common.CachedTarget(target_model, layers), prompt, 40, proposer=proposer)
        assert spec.tokens == ar.tokens
        taus.append(spec.tau)
    assert sum(taus) / len(taus) > 1.5, taus


def test_step_drafter_reuses_committed_rows_exactly():
    """Across proposes the adapter computes only newly committed rows (SGLang keeps the draft KV of the others);
    its probabilities match a fresh adapter's (a full draft extend) at every call of a whole generation."""
    target = TinyTarget(vocab_size=32, hidden_size=16, num_layers=3, capture_layer_ids=(0, 1, 2), seed=5)
    model = randomize(Eagle3Drafter(Eagle3Config.from_dict(scaled_eagle3(EAGLE3_GQA))), 2)
    model.set_vocab_map(torch.arange(0, 32)[torch.arange(32) % 4 != 1])
    model.attach_target(target.embed.data)
    incremental = model.step_drafter()
    fresh = {"context": None, "adapter": None}

    def both(context, paths):
        if fresh["context"] is not context:
            fresh.update(context=context, adapter=model.step_drafter())
        a, b = incremental(context, paths), fresh["adapter"](context, paths)
        assert torch.allclose(a, b, atol=1e-6)
        return a

    prompt = torch.randint(0, 30, (10,), generator=torch.Generator().manual_seed(1))
    out = generate(target, prompt, 12, proposer=EagleProposer(drafter=both, num_steps=3, topk=2, num_draft_tokens=5))
    assert out.tokens == generate(target, prompt, 12).tokens
