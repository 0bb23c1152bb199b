"""Request validation (``sglang_kimi/hardening/request_validation.py``): what would crash a scheduler is a ValueError
(HTTP
400) naming the problem; everything else passes through to SGLang's own checks."""

import json
import logging
from types import SimpleNamespace

import pytest

from sglang_kimi.assets import TINY_EAGLE3
from sglang_kimi.hardening.request_validation import (
    PER_PROMPT_FIELDS,
    check_completion_options,
    check_normalized_batch,
    validate_request,
)

MANAGER = SimpleNamespace(model_config=SimpleNamespace(vocab_size=100, hidden_size=4))


def request(**fields):
    base = {"input_embeds": None, "image_data": None, "video_data": None, "audio_data": None}
    return SimpleNamespace(**(base | fields))


@pytest.mark.parametrize(
    "input_ids, message",
    [
        ([1, 2, 100], "input_ids[2] is 100, outside the vocabulary: token ids must be in [0, 100)"),
        ([-1], "input_ids[0] is -1, outside the vocabulary"),
        ([1, 2.5], "input_ids[1] is 2.5: token ids must be integers"),
        ([True], "input_ids[0] is True: token ids must be integers"),
        ([], "the prompt has no tokens"),
        ("1 2 3", "input_ids must be a list of integer token ids"),
    ],
)
def test_bad_token_ids_are_refused(input_ids, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        validate_request(MANAGER, request(), input_ids)


def test_good_prompts_pass_through():
    assert validate_request(MANAGER, request(), [0, 5, 99]) is None
    assert validate_request(MANAGER, request(), None) is None  # a multimodal processor fills them in later
    assert validate_request(MANAGER, request(image_data=["img"]), []) is None  # the image expands the prompt


LABELLED = SimpleNamespace(
    model_config=MANAGER.model_config,
    server_args=SimpleNamespace(tokenizer_metrics_allowed_custom_labels=["tenant", "app"]),
)


@pytest.mark.parametrize(
    "manager, fields, message",
    [
        (MANAGER, {"positional_embed_overrides": [1, 2]}, "positional_embed_overrides carries tensors"),
        (MANAGER, {"positional_embed_overrides": {"embeds": [[0.0]], "positions": [0]}}, "Python Engine API"),
        (
            MANAGER,
            {"custom_labels": {"tenant": "a"}},
            r"'tenant', not a metrics label of this server \(allowed: none\)",
        ),
        (
            LABELLED,
            {"custom_labels": {"tenant": "a", "zone": "b"}},
            r"'zone'.*\(allowed: app, tenant\).*"
            "--tokenizer-metrics-allowed-custom-labels zone",
        ),
        (LABELLED, {"custom_labels": {"is_streaming": "x"}}, "'is_streaming', not a metrics label"),
        (LABELLED, {"custom_labels": {"tenant": {"a": 1}}}, r"custom_labels\['tenant'\] is .*label values are strings"),
        (LABELLED, {"custom_labels": ["tenant"]}, "custom_labels must be an object"),
    ],
)
def test_fields_only_the_python_api_can_fill_are_refused(manager, fields, message):
    with pytest.raises(ValueError, match=message):
        validate_request(manager, request(**fields), [1, 2])


def test_python_api_overrides_and_allowed_labels_pass():
    import torch
    from sglang.srt.managers.embed_types import PositionalEmbeds

    overrides = PositionalEmbeds(embeds=torch.zeros(1, 4), positions=[0])
    assert validate_request(MANAGER, request(positional_embed_overrides=overrides), [1, 2]) is None
    assert validate_request(LABELLED, request(custom_labels={"tenant": "a", "app": "b"}), [1, 2]) is None
    assert validate_request(MANAGER, request(custom_labels={}), [1, 2]) is None


def custom_processor_manager(enabled: bool = True, **flags):
    server_args = SimpleNamespace(enable_custom_logit_processor=enabled, tokenizer_metrics_allowed_custom_labels=None)
    return SimpleNamespace(
        model_config=MANAGER.model_config, server_args=SimpleNamespace(**(vars(server_args) | flags))
    )


def serialized(payload: object) -> str:
    import json

    import dill

    return json.dumps({"callable": dill.dumps(payload).hex()})


@pytest.mark.parametrize(
    "processor, message",
    [
        ("not json", "custom_logit_processor does not deserialize .*JSONDecodeError.*to_str"),
        ('{"callable": "zz"}', "custom_logit_processor does not deserialize .*ValueError"),
        ('{"other": 1}', "custom_logit_processor does not deserialize .*KeyError"),
        (serialized(dict), "custom_logit_processor deserializes to a dict"),
    ],
)
def test_custom_logit_processors_that_do_not_deserialize_are_refused(processor, message):
    with pytest.raises(ValueError, match=message):
        validate_request(custom_processor_manager(), request(custom_logit_processor=processor), [1, 2])


def test_custom_logit_processors_pass_or_are_left_to_sglang():
    from sglang.srt.sampling.custom_logit_processor import DisallowedTokensLogitsProcessor

    good = DisallowedTokensLogitsProcessor.to_str()
    assert validate_request(custom_processor_manager(), request(custom_logit_processor=good), [1, 2]) is None
    assert validate_request(custom_processor_manager(), request(custom_logit_processor=[good, None]), [1, 2]) is None
    # without the flag nothing is deserialized: SGLang refuses the field with its own message
    disabled = custom_processor_manager(enabled=False)
    assert validate_request(disabled, request(custom_logit_processor="not json"), [1, 2]) is None


@pytest.mark.parametrize("option", ["return_routed_experts", "return_indexer_topk"])
def test_capture_options_need_their_server_flag(option):
    flag = option.replace("return_", "enable_return_")
    with pytest.raises(ValueError, match=f"{option} needs a server started with --{flag.replace('_', '-')}"):
        validate_request(custom_processor_manager(), request(**{option: True}), [1, 2])
    assert validate_request(custom_processor_manager(**{flag: True}), request(**{option: True}), [1, 2]) is None
    assert validate_request(custom_processor_manager(), request(**{option: False}), [1, 2]) is None


def speculative_manager(algorithm, draft=None):
    return SimpleNamespace(
        model_config=MANAGER.model_config,
        server_args=SimpleNamespace(speculative_algorithm=algorithm, speculative_draft_model_path=draft),
    )


def eagle3_drafter(folder, use_aux):
    """A copy of the embedded EAGLE3 drafter's config with ``use_aux_hidden_state`` set (None: the key left out)."""
    config = json.loads((TINY_EAGLE3 / "config.json").read_text())
    if use_aux is None:
        del config["eagle_config"]["use_aux_hidden_state"]
    else:
        config["eagle_config"]["use_aux_hidden_state"] = use_aux
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


@pytest.mark.parametrize("mode", [True, "last"])
def test_hidden_states_of_speculative_servers_that_return_other_ones_are_refused(tmp_path, mode):
    dflash = speculative_manager("DFLASH", str(TINY_EAGLE3.parent / "tiny-kimi-k2.6-dflash"))
    with pytest.raises(ValueError, match="not served with DFLASH speculative decoding, which returns an empty list"):
        validate_request(dflash, request(return_hidden_states=mode), [1, 2])
    for name, use_aux in [("embedded", "as shipped"), ("default", None), ("aux", True)]:
        path = str(TINY_EAGLE3) if use_aux == "as shipped" else eagle3_drafter(tmp_path / name, use_aux)
        with pytest.raises(ValueError, match="EAGLE3 speculative decoding, which returns the drafter's auxiliary"):
            validate_request(speculative_manager("EAGLE3", path), request(return_hidden_states=mode), [1, 2])


def test_hidden_states_of_servers_that_return_the_models_pass(tmp_path):
    asked = request(return_hidden_states=True)
    assert validate_request(speculative_manager(None), asked, [1, 2]) is None
    assert validate_request(speculative_manager("NGRAM"), asked, [1, 2]) is None
    final_layer = eagle3_drafter(tmp_path / "final", False)  # a drafter that reads the final hidden state
    assert validate_request(speculative_manager("EAGLE3", final_layer), asked, [1, 2]) is None
    assert validate_request(speculative_manager("DFLASH"), request(return_hidden_states=False), [1, 2]) is None


def kimi_manager(language_model_only: bool):
    return SimpleNamespace(
        model_config=SimpleNamespace(
            vocab_size=100, hidden_size=4, hf_config=SimpleNamespace(architectures=["KimiK25ForConditionalGeneration"])
        ),
        server_args=SimpleNamespace(language_model_only=language_model_only),
    )


def test_input_embeds_need_the_text_only_kimi_class():
    embeds = [[0.0] * 4] * 2
    with pytest.raises(ValueError, match="multimodal Kimi-K2.5/K2.6 model.*--language-model-only"):
        validate_request(kimi_manager(False), request(input_embeds=embeds), None)
    assert validate_request(kimi_manager(True), request(input_embeds=embeds), None) is None


def test_input_embeds_must_have_the_hidden_width():
    assert validate_request(MANAGER, request(input_embeds=[[0.0] * 4, [1.0] * 4]), None) is None
    with pytest.raises(ValueError, match=r"input_embeds\[1\] has width 3: every row must have the model's hidden"):
        validate_request(MANAGER, request(input_embeds=[[0.0] * 4, [1.0] * 3]), None)
    with pytest.raises(ValueError, match="non-empty list of rows"):
        validate_request(MANAGER, request(input_embeds=[]), None)


def with_sampling(**params):
    return request(sampling_params=params)


def with_logprobs(**fields):
    return request(sampling_params={}, return_logprob=True, **fields)


@pytest.mark.parametrize(
    "obj, message",
    [
        (with_sampling(top_k=2**31), "top_k is 2147483648: give -1"),
        (with_sampling(top_k=10**12), "top_k is 1000000000000"),
        (with_sampling(sampling_seed=2**63), "sampling_seed is 9223372036854775808: give a 64-bit"),
        (with_sampling(sampling_seed=-(2**63) - 1), "sampling_seed is -9223372036854775809"),
        (
            with_logprobs(top_logprobs_num=101),
            "top_logprobs_num is 101: give a count from 0 to the vocabulary size 100",
        ),
        (with_logprobs(top_logprobs_num=-1), "top_logprobs_num is -1"),
        (with_logprobs(logprob_start_len=-2), "logprob_start_len is -2: give -1"),
    ],
)
def test_values_that_overflow_the_scheduler_are_refused(obj, message):
    with pytest.raises(ValueError, match=message):
        validate_request(MANAGER, obj, [1, 2])


@pytest.mark.parametrize(
    "obj",
    [
        with_sampling(top_k=-1),
        with_sampling(top_k=2**31 - 1),  # beyond the vocabulary: the whole vocabulary, as in SGLang
        with_sampling(sampling_seed=2**63 - 1),
        with_sampling(sampling_seed=-(2**63)),
        with_logprobs(top_logprobs_num=100, logprob_start_len=-1),
        with_logprobs(top_logprobs_num=0, logprob_start_len=0),
        # without return_logprob the scheduler ignores both
        request(sampling_params={}, return_logprob=False, top_logprobs_num=10**6, logprob_start_len=-7),
        with_sampling(top_k="x"),  # not an integer: left to SGLang's own parsing (its HTTP 400)
    ],
)
def test_values_the_scheduler_serves_pass_through(obj):
    assert validate_request(MANAGER, obj, [1, 2]) is None


def test_input_embeds_requests_get_the_sampling_checks_too():
    obj = request(input_embeds=[[0.0] * 4], sampling_params={"top_k": 2**40})
    with pytest.raises(ValueError, match="top_k is"):
        validate_request(MANAGER, obj, None)


@pytest.mark.parametrize("stop_regex", ["[", ["ok", "(unclosed"]])
def test_a_stop_regex_that_does_not_compile_is_refused(stop_regex):
    with pytest.raises(ValueError, match="stop_regex .* is not a regular expression"):
        validate_request(MANAGER, with_sampling(stop_regex=stop_regex), [1, 2])
    assert validate_request(MANAGER, with_sampling(stop_regex=["[0-9]+", "\\n"]), [1, 2]) is None


@pytest.mark.parametrize(
    "params, message",
    [
        ({"n": 0}, "n is 0: give the number of completions"),
        ({"n": -2}, "n is -2"),
        ({"stop": ""}, "stop holds an empty string"),
        ({"stop": ["=", ""]}, "stop holds an empty string"),
        ({"stop_token_ids": [5, 100]}, r"stop_token_ids holds 100, outside the vocabulary: give ids in \[0, 100\)"),
        ({"stop_token_ids": [-1]}, "stop_token_ids holds -1"),
    ],
)
def test_options_that_would_not_be_served_as_asked_are_refused(params, message):
    with pytest.raises(ValueError, match=message):
        validate_request(MANAGER, with_sampling(**params), [1, 2])


@pytest.mark.parametrize(
    "params",
    [
        {"n": 1},
        {"n": 4},
        {"stop": "="},
        {"stop": ["=", "\n"]},
        {"stop": []},
        {"stop_token_ids": [0, 99]},
        {"stop_token_ids": 5},  # not a list: left to SGLang's own parsing
        {},
    ],
)
def test_served_options_pass(params):
    assert validate_request(MANAGER, with_sampling(**params), [1, 2]) is None


def normalized(batch_size=2, n=1, **fields):
    """A GenerateReqInput after normalize_batch_and_arguments: batch_size=None for a single prompt."""
    base = {"rid": None} | {name: None for name in PER_PROMPT_FIELDS}
    return SimpleNamespace(is_single=batch_size is None, batch_size=batch_size or 1, parallel_sample_num=n,
                           **(base | fields))  # fmt: skip


@pytest.mark.parametrize(
    "obj, message",
    [
        (normalized(sampling_params=[{}]), "sampling_params has 1 entries for a batch of 2 prompts"),
        (normalized(top_logprobs_num=[1, 2, 3]), "top_logprobs_num has 3"),
        (normalized(n=2, sampling_params=[{}, {}]), "sampling_params has 2 entries for a batch of 2 prompts"),
        (normalized(batch_size=None, rid=["x", "y"]), "rid of a single prompt must be a string"),
        (normalized(batch_size=None, text="hi", input_ids=[1, 2]), "both text and input_ids"),
        (normalized(text=["a", "b"], input_ids=[[1], [2]]), "both text and input_ids"),
    ],
)
def test_per_prompt_lists_must_match_the_batch(obj, message):
    with pytest.raises(ValueError, match=message):
        check_normalized_batch(None, obj)


@pytest.mark.parametrize(
    "obj",
    [
        normalized(sampling_params=[{}, {"temperature": 0.5}], rid=["x", "y"], return_logprob=[True, False]),
        normalized(n=2, sampling_params=[{}] * 4, token_ids_logprob=[None] * 4),  # parallel sampling: 2 x 2
        normalized(batch_size=None, rid="x", sampling_params={}),
        normalized(batch_size=None),
    ],
)
def test_batches_sglang_serves_pass(obj):
    assert check_normalized_batch(None, obj) is None


def completion(**fields):
    return SimpleNamespace(**({"n": 1, "best_of": None, "suffix": None} | fields))


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"best_of": 3}, "best_of 3 with n 1: SGLang generates no extra completions"),
        ({"best_of": 2, "n": 4}, "best_of 2 with n 4"),
        ({"suffix": "end"}, "suffix is not served"),
    ],
)
def test_completion_options_sglang_ignores_are_refused(fields, message):
    assert message in check_completion_options(None, object(), completion(**fields))


@pytest.mark.parametrize("fields", [{}, {"best_of": 1}, {"best_of": 3, "n": 3}, {"suffix": ""}, {"n": 2}])
def test_completion_options_sglang_serves_pass(fields):
    assert check_completion_options(None, object(), completion(**fields)) is None


def test_sglangs_own_completion_refusal_is_kept():
    assert (
        check_completion_options("Prompt cannot be empty", object(), completion(best_of=3)) == "Prompt cannot be empty"
    )


def test_a_seed_the_server_ignores_is_served_and_logged_once(caplog):
    from sglang_kimi.hardening import request_validation

    request_validation._warn_seeds_ignored.cache_clear()
    plain = SimpleNamespace(model_config=MANAGER.model_config, server_args=SimpleNamespace())
    deterministic = SimpleNamespace(
        model_config=MANAGER.model_config, server_args=SimpleNamespace(enable_deterministic_inference=True)
    )
    seeded = request(sampling_params={"temperature": 1.0, "sampling_seed": 7})
    with caplog.at_level(logging.WARNING, logger="sglang_kimi"):
        assert validate_request(deterministic, seeded, [1, 2]) is None
        assert validate_request(plain, request(sampling_params={"temperature": 1.0}), [1, 2]) is None
        assert not caplog.records  # read by a deterministic server; no seed at all
        for _ in range(3):
            assert validate_request(plain, seeded, [1, 2]) is None
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "--enable-deterministic-inference" in warnings[0], warnings
