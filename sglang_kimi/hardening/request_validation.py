"""Requests that would crash a serving scheduler, refused with HTTP 400 before they reach it.

A BEFORE hook on SGLang's ``TokenizerManager._validate_one_request``, which every generate request passes through
(``/generate``, ``/v1/completions``, ``/v1/chat/completions``, single and batched) after tokenization and before the
scheduler sees it. SGLang 0.5.23 checks the prompt's length and ``token_ids_logprob`` there, but not:

- the prompt's token ids: an id outside ``[0, vocab_size)`` (or not an integer) reaches the embedding lookup, where it
  is an IndexError on CPU and a device-side assert on a GPU: the scheduler dies and every later request is refused;
- an empty prompt (no token at all): the MoE forward of a 0-token batch cannot reshape (``moe_forward_native``);
- ``input_embeds`` rows of the wrong width, which fail inside the model's first layer, and ``input_embeds`` at all for
  SGLang's multimodal Kimi class, whose ``forward`` takes token ids only (a ``TypeError`` in the scheduler; the
  plugin's ``--language-model-only`` class serves them);
- a ``top_k`` above 2^31 - 1: the scheduler packs every request's ``top_k`` into an int32 tensor when it builds a
  batch, and the overflow ends the scheduler (``-1`` and any value up to 2^31 - 1 mean the same as in SGLang);
- a ``sampling_seed`` outside int64, packed the same way into an int64 tensor;
- with ``return_logprob``, a ``top_logprobs_num`` above the vocabulary size (``topk`` over the vocabulary fails in
  the sampler) or below 0, and a ``logprob_start_len`` below -1 (the prompt's log-probability bookkeeping fails an
  assertion after the forward).

Three more would be served, but not as asked: ``n`` below 1 (SGLang samples one completion), an empty ``stop``
string (every completion ends at its first token) and ``stop_token_ids`` outside the vocabulary (never matched).
So would two ``/v1/completions`` options SGLang accepts and ignores (an AFTER hook on that route's
``_validate_request``, whose message SGLang answers with 400): ``best_of`` other than ``n``, and a ``suffix``.

Two fields a JSON body can carry but only the Python API can fill in end the server too:
``positional_embed_overrides`` (SGLang's scheduler calls ``reconstruct`` on it, a method of its tensor-carrying
``PositionalEmbeds``; a JSON list or object has none and the scheduler dies) and ``custom_labels`` with a key that is
not one of ``--tokenizer-metrics-allowed-custom-labels`` (with ``--enable-metrics`` the tokenizer manager labels its
histograms with it, prometheus refuses the unknown label name, and the tokenizer manager dies). Both are refused, the
labels naming the flag; so are label values that are not strings.

On a server started with ``--enable-custom-logit-processor`` a ``custom_logit_processor`` that does not deserialize
to a ``CustomLogitProcessor`` (not JSON, not a dill payload, another object) ends the scheduler where it builds the
batch; it is deserialized here first, with the trust the flag already grants its clients (never without the flag:
SGLang then refuses the field). ``return_routed_experts`` and ``return_indexer_topk`` on a server started without
``--enable-return-routed-experts`` / ``--enable-return-indexer-topk`` would be answered without them, and are refused
naming the flag.

Two more checks turn what SGLang answers with HTTP 500 (an unhandled exception in the HTTP server) into a 400: a
``stop_regex`` that does not compile, and, after ``GenerateReqInput.normalize_batch_and_arguments``, per-prompt
lists whose length is not the batch's (``sampling_params``, ``rid`` and the log-probability options) and a list
``rid`` on a single prompt. A request with both ``text`` and ``input_ids``, which SGLang serves from the ids alone
(the text silently dropped), is refused there too.

A ``sampling_seed`` (``seed`` on the OpenAI routes) is read by SGLang only under ``--enable-deterministic-inference``;
any other server samples without it. It is served as SGLang serves it (lm-eval sends a seed with every request,
greedy ones too), and the server logs once that seeds have no effect there.

``return_hidden_states`` on a DFLASH or EAGLE3 server would not return the model's hidden states (SGLang refuses it
only for DFLASH with its overlap scheduler): a DFLASH server without the overlap scheduler answers an empty list, and
an EAGLE3 server whose drafter reads auxiliary target layers (``eagle_config.use_aux_hidden_state``, the default)
answers those layers concatenated, three times the hidden size wide, in place of the final hidden state. Both are
refused, naming the server that serves them.

Each is a ``ValueError`` naming the problem, which SGLang's HTTP server answers with status 400 (an error event on a
streaming request), and the server goes on serving.
"""

from __future__ import annotations

import functools
import logging
import re

from sglang_kimi.hooks import hook
from sglang_kimi.models.install import KIMI_ARCH

logger = logging.getLogger("sglang_kimi")


def _check_token_ids(input_ids, vocab_size: int) -> None:
    for position, token in enumerate(input_ids):
        if isinstance(token, bool) or not isinstance(token, int):
            raise ValueError(f"input_ids[{position}] is {token!r}: token ids must be integers in [0, {vocab_size})")
        if not 0 <= token < vocab_size:
            raise ValueError(
                f"input_ids[{position}] is {token}, outside the vocabulary: token ids must be in [0, {vocab_size})"
            )


def _check_embeds_are_served(model_config, server_args) -> None:
    """SGLang's multimodal Kimi class takes token ids only (the plugin's text-only class takes embeddings too)."""
    architectures = getattr(getattr(model_config, "hf_config", None), "architectures", None) or ()
    if KIMI_ARCH in architectures and not getattr(server_args, "language_model_only", False):
        raise ValueError(
            "input_embeds is not served by SGLang's multimodal Kimi-K2.5/K2.6 model, which takes token ids only: "
            "start the server with --language-model-only to serve embeddings, or send input_ids or text"
        )


def _check_input_embeds(input_embeds, hidden_size: int) -> None:
    rows = input_embeds.tolist() if hasattr(input_embeds, "tolist") else input_embeds
    if not isinstance(rows, list) or not rows:
        raise ValueError("input_embeds must be a non-empty list of rows (one per prompt position)")
    for position, row in enumerate(rows):
        if not isinstance(row, list) or len(row) != hidden_size:
            width = len(row) if isinstance(row, list) else type(row).__name__
            raise ValueError(
                f"input_embeds[{position}] has width {width}: every row must have the model's hidden size {hidden_size}"
            )


INT32_MAX = 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_sampling_params(params, vocab_size: int) -> None:
    if not isinstance(params, dict):
        return  # SGLang's own parsing refuses it
    n = params.get("n")
    if _is_int(n) and n < 1:
        raise ValueError(f"n is {n}: give the number of completions to sample for the prompt, at least 1")
    stop = params.get("stop")
    if stop == "" or (isinstance(stop, list) and "" in stop):
        raise ValueError("stop holds an empty string, which would end every completion at its first token")
    stop_token_ids = params.get("stop_token_ids")
    for token in stop_token_ids if isinstance(stop_token_ids, list) else ():
        if _is_int(token) and not 0 <= token < vocab_size:
            raise ValueError(f"stop_token_ids holds {token}, outside the vocabulary: give ids in [0, {vocab_size})")
    top_k = params.get("top_k")
    if _is_int(top_k) and top_k > INT32_MAX:
        raise ValueError(f"top_k is {top_k}: give -1 (the whole vocabulary) or a value from 1 to {INT32_MAX}")
    seed = params.get("sampling_seed")
    if _is_int(seed) and not INT64_MIN <= seed <= INT64_MAX:
        raise ValueError(f"sampling_seed is {seed}: give a 64-bit signed integer")
    stop_regex = params.get("stop_regex")
    for pattern in [stop_regex] if isinstance(stop_regex, str) else stop_regex or ():
        try:
            re.compile(pattern)
        except (re.error, TypeError) as exc:
            raise ValueError(f"stop_regex {pattern!r} is not a regular expression ({exc})") from None


@functools.cache
def _warn_seeds_ignored() -> None:
    logger.warning(
        "a request carries a seed (sampling_seed, or seed on the OpenAI routes), which this server ignores: SGLang "
        "samples with per-request seeds only under --enable-deterministic-inference (greedy requests are unaffected)"
    )


def _note_ignored_seed(params, server_args) -> None:
    if server_args is None or getattr(server_args, "enable_deterministic_inference", False):
        return
    if isinstance(params, dict) and params.get("sampling_seed") is not None:
        _warn_seeds_ignored()


def _check_logprob_options(obj, vocab_size: int) -> None:
    if not getattr(obj, "return_logprob", False):
        return  # the scheduler ignores both options then
    top_n = getattr(obj, "top_logprobs_num", None)
    if _is_int(top_n) and not 0 <= top_n <= vocab_size:
        raise ValueError(f"top_logprobs_num is {top_n}: give a count from 0 to the vocabulary size {vocab_size}")
    start = getattr(obj, "logprob_start_len", None)
    if _is_int(start) and start < -1:
        raise ValueError(
            f"logprob_start_len is {start}: give -1 (log-probabilities of the output only) or a prompt position >= 0"
        )


def _check_python_only_fields(obj, server_args) -> None:
    overrides = getattr(obj, "positional_embed_overrides", None)
    if overrides is not None:
        try:
            from sglang.srt.managers.embed_types import PositionalEmbeds
        except ImportError:  # a release without them: whatever a body carries is JSON
            PositionalEmbeds = ()
        if not isinstance(overrides, PositionalEmbeds):
            raise ValueError(
                "positional_embed_overrides carries tensors and is set through SGLang's Python Engine API only; "
                "send the request without it"
            )
    labels = getattr(obj, "custom_labels", None)
    if not labels:
        return
    if not isinstance(labels, dict):
        raise ValueError("custom_labels must be an object of metric label names to string values")
    allowed = set(getattr(server_args, "tokenizer_metrics_allowed_custom_labels", None) or ())
    for name, value in labels.items():
        if name not in allowed:
            known = ", ".join(sorted(allowed)) or "none"
            raise ValueError(
                f"custom_labels has {name!r}, not a metrics label of this server (allowed: {known}); start the "
                f"server with --tokenizer-metrics-allowed-custom-labels {name} to label requests with it"
            )
        if not isinstance(value, str):
            raise ValueError(f"custom_labels[{name!r}] is {value!r}: label values are strings")


def _check_custom_logit_processor(obj, server_args) -> None:
    given = getattr(obj, "custom_logit_processor", None)
    if given is None or not getattr(server_args, "enable_custom_logit_processor", False):
        return  # without the flag SGLang refuses the field itself, and nothing is deserialized
    from sglang.srt.sampling.custom_logit_processor import CustomLogitProcessor

    fix = "serialize a CustomLogitProcessor subclass with its to_str()"
    for serialized in [given] if not isinstance(given, list) else given:
        if serialized is None:
            continue
        try:
            processor = CustomLogitProcessor.from_str(serialized)
        except Exception as exc:  # whatever json / dill raise on a malformed payload
            reason = f"{type(exc).__name__}: {exc}"
            raise ValueError(f"custom_logit_processor does not deserialize ({reason}): {fix}") from None
        if not isinstance(processor, CustomLogitProcessor):
            raise ValueError(f"custom_logit_processor deserializes to a {type(processor).__name__}: {fix}")


# request options whose output the server computes only when started with the flag
CAPTURE_FLAGS = {
    "return_routed_experts": "enable_return_routed_experts",
    "return_indexer_topk": "enable_return_indexer_topk",
}


def _check_capture_options(obj, server_args) -> None:
    for option, flag in CAPTURE_FLAGS.items():
        if getattr(obj, option, False) and server_args is not None and not getattr(server_args, flag, False):
            raise ValueError(
                f"{option} needs a server started with --{flag.replace('_', '-')}; without it the answer would "
                f"carry no {option.removeprefix('return_').replace('_', ' ')}"
            )


@functools.lru_cache(maxsize=None)
def _eagle3_reads_aux_layers(draft_model_path: str | None) -> bool:
    """Whether an EAGLE3 drafter reads auxiliary target layers, as SGLang decides it (``use_aux_hidden_state`` of the
    drafter's ``eagle_config``, true when absent or unreadable)."""
    from transformers import PretrainedConfig

    try:
        config, _ = PretrainedConfig.get_config_dict(draft_model_path)
    except Exception:  # whatever a missing or unparsable config raises: SGLang's default then
        return True
    return bool((config.get("eagle_config") or {}).get("use_aux_hidden_state", True))


def _check_hidden_states(obj, server_args) -> None:
    if not getattr(obj, "return_hidden_states", False) or server_args is None:
        return
    algorithm = str(getattr(server_args, "speculative_algorithm", None) or "").upper()
    if algorithm == "DFLASH":
        returned = "an empty list"
    elif algorithm == "EAGLE3" and _eagle3_reads_aux_layers(getattr(server_args, "speculative_draft_model_path", None)):
        returned = "the drafter's auxiliary target layers, concatenated, instead of the final hidden state"
    else:
        return
    raise ValueError(
        f"return_hidden_states is not served with {algorithm} speculative decoding, which returns {returned}: ask a "
        "server started without --speculative-algorithm (and with --return-hidden-states-mode) for hidden states"
    )


def _has_multimodal_input(obj) -> bool:
    return any(getattr(obj, name, None) is not None for name in ("image_data", "video_data", "audio_data"))


def validate_request(tokenizer_manager, obj, input_ids, *args, **kwargs):
    """BEFORE ``_validate_one_request(self, obj, input_ids)``: raises ``ValueError`` for a request the scheduler
    cannot serve; returns None (SGLang's own checks then run unchanged)."""
    config = tokenizer_manager.model_config
    server_args = getattr(tokenizer_manager, "server_args", None)
    _check_python_only_fields(obj, server_args)
    _check_custom_logit_processor(obj, server_args)
    _check_capture_options(obj, server_args)
    _check_hidden_states(obj, server_args)
    _check_sampling_params(getattr(obj, "sampling_params", None), int(config.vocab_size))
    _note_ignored_seed(getattr(obj, "sampling_params", None), server_args)
    _check_logprob_options(obj, int(config.vocab_size))
    input_embeds = getattr(obj, "input_embeds", None)
    if input_embeds is not None:
        _check_embeds_are_served(config, server_args)
        _check_input_embeds(input_embeds, int(config.hidden_size))
        return None
    if input_ids is None:
        return None  # a multimodal processor fills them in later; SGLang validates that path
    if not isinstance(input_ids, list):
        raise ValueError("input_ids must be a list of integer token ids")
    if not input_ids and not _has_multimodal_input(obj):
        raise ValueError("the prompt has no tokens: send a non-empty text or input_ids")
    _check_token_ids(input_ids, int(config.vocab_size))
    return None


# Per-prompt fields of a batched GenerateReqInput that SGLang indexes by prompt once normalized (obj[i]).
PER_PROMPT_FIELDS = (
    "sampling_params",
    "return_logprob",
    "logprob_start_len",
    "top_logprobs_num",
    "token_ids_logprob",
    "return_sampling_mask",
    "sampling_logprobs_mode",
)


def check_normalized_batch(result, obj, *args, **kwargs):
    """AFTER ``GenerateReqInput.normalize_batch_and_arguments``: a per-prompt list of another length than the batch,
    or a list ``rid`` on a single prompt, is a ValueError (SGLang indexes past its end: HTTP 500); so is a request
    with both ``text`` and ``input_ids`` (SGLang would serve the ids and drop the text)."""
    if getattr(obj, "text", None) is not None and getattr(obj, "input_ids", None) is not None:
        raise ValueError("the request has both text and input_ids: send the prompt as one of them")
    if obj.is_single:
        if not isinstance(obj.rid, (str, type(None))):
            raise ValueError("rid of a single prompt must be a string (a list of rids goes with a list of prompts)")
        return None
    prompts = obj.batch_size * obj.parallel_sample_num
    for name in PER_PROMPT_FIELDS:
        value = getattr(obj, name, None)
        if isinstance(value, list) and len(value) != prompts:
            raise ValueError(
                f"{name} has {len(value)} entries for a batch of {obj.batch_size} prompts: give one per prompt"
            )
    return None


def check_completion_options(result, serving, request, *args, **kwargs):
    """AFTER ``OpenAIServingCompletion._validate_request(self, request)`` (its message is an HTTP 400): SGLang's
    ``/v1/completions`` accepts ``best_of`` and ``suffix`` and uses neither, so a request for the best of several
    samples, or for text to insert before a suffix, would get one plain completion."""
    if result is not None:
        return result
    best_of, n = getattr(request, "best_of", None), getattr(request, "n", 1) or 1
    if best_of is not None and best_of != n:
        return (
            f"best_of {best_of} with n {n}: SGLang generates no extra completions to pick from; ask for n={best_of} "
            "completions with logprobs and pick among them"
        )
    if getattr(request, "suffix", None):
        return "suffix is not served: SGLang completes the prompt only (no text inserted before a suffix)"
    return None


def install_request_validation(validate_one_request: str, completion_validate: str, normalize_batch: str):
    hook(validate_one_request, validate_request, "BEFORE")
    hook(completion_validate, check_completion_options, "AFTER")
    hook(normalize_batch, check_normalized_batch, "AFTER")
