"""The drafter checked against its target before any weight loads: the draft path, both configs through SGLang's
own loader, the pairing (``speculators.pairing.validate_pair``: algorithm, vocab, hidden size, layer ids, mask
token, block size; a drafter trained for another Kimi release or quantization is logged, not refused) and the
checkpoint's tensor names (a local folder, the Hugging Face cache, or the hub's safetensors headers). Each problem
is one :class:`~sglang_kimi.errors.SpeculativeConfigError` naming the values and the fix."""

from __future__ import annotations

import logging
from pathlib import Path

from sglang_kimi.errors import SpeculativeConfigError

logger = logging.getLogger("sglang_kimi")


def check_draft_path(path: str | None, algorithm: str) -> None:
    if path is None:
        raise SpeculativeConfigError(
            f"--speculative-algorithm {algorithm} needs --speculative-draft-model-path: the checkpoint folder or hub "
            f"id of its {algorithm} drafter"
        )
    local = Path(path).expanduser()
    if local.exists():
        if not (local / "config.json").exists():
            raise SpeculativeConfigError(
                f"--speculative-draft-model-path {path} has no config.json: point it at a drafter checkpoint folder"
            )
        return
    if path.startswith(("/", ".", "~")) or path.count("/") != 1:
        raise SpeculativeConfigError(
            f"--speculative-draft-model-path {path} does not exist: pass an existing drafter folder or a hub id"
        )


def load_config(path: str, trust_remote_code: bool, revision: str | None, flag: str = "--model-path"):
    """A checkpoint's HF config through SGLang's own loader (local folder or hub id; Kimi's wrapper config). A
    config.json that does not parse is refused naming the flag (transformers raises OSError or ValueError)."""
    from sglang.srt.utils.hf_transformers_utils import get_config

    local = Path(path).expanduser() / "config.json"
    try:
        return get_config(path, trust_remote_code=trust_remote_code, revision=revision)
    except (OSError, ValueError) as e:
        if not local.is_file():  # a hub id: the download's own error says more than a rewording would
            raise
        raise SpeculativeConfigError(f"{flag} {path}: its config.json cannot be read ({e}): fix or replace it") from e


# Load formats whose drafter tensors are read from safetensors files the check below can read the headers of.
SAFETENSORS_LOAD_FORMATS = ("auto", "safetensors")


def _cached_snapshot(repo_id: str, revision: str | None) -> Path | None:
    """A hub id's snapshot folder in the Hugging Face cache; None when nothing of it is cached."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    try:
        return Path(snapshot_download(repo_id, revision=revision, local_files_only=True))
    except (LocalEntryNotFoundError, HFValidationError):
        return None


def _hub_tensor_names(repo_id: str, revision: str | None) -> list[str] | None:
    """A hub checkpoint's tensor names from its safetensors headers, fetched alone (HTTP range requests, no tensor
    data); None when the hub cannot say (offline, unreachable, private, no safetensors)."""
    from sglang_kimi.launcher.checks import hub_offline, modelscope

    if hub_offline() or modelscope():
        return None
    try:
        from huggingface_hub import get_safetensors_metadata

        metadata = get_safetensors_metadata(repo_id, revision=revision)
        return [name for file in metadata.files_metadata.values() for name in file.tensors]
    except Exception as e:  # any failure only means the names are not known before SGLang downloads them
        logger.info("sglang-kimi: the hub did not give the tensor names of %s (%s: %s)", repo_id, type(e).__name__, e)
        return None


def _local_checkpoint(path: str, revision: str | None) -> Path | None:
    """The drafter's files on this machine: its folder, or a hub id's snapshot in the Hugging Face cache once every
    safetensors file of it is there (SGLang downloads the rest later, so a partial snapshot is not judged)."""
    from sglang_kimi.speculators.drafter_tensors import DrafterCheckpointError, safetensors_files

    folder = Path(path).expanduser()
    if folder.is_dir():
        return folder
    snapshot = _cached_snapshot(path, revision)
    try:
        return snapshot if snapshot is not None and safetensors_files(snapshot) else None
    except DrafterCheckpointError:  # shards listed in the index are still to come
        return None


def check_drafter_tensors(cfg, drafter) -> None:
    """Refuse a drafter checkpoint that lacks a tensor its config calls for (SGLang's loaders would serve the
    parameter uninitialized), before any weight loads. Reads a local folder's safetensors headers, a hub id's from
    the Hugging Face cache when all its files are there, and otherwise the hub's (headers alone, before SGLang
    downloads the weights, which it does only after loading the target)."""
    from sglang_kimi.speculators.drafter_tensors import DrafterCheckpointError, check_checkpoint, check_names

    path, revision = cfg.speculative_draft_model_path, cfg.speculative_draft_model_revision
    load_format = cfg.speculative_draft_load_format or cfg.load_format or "auto"
    if str(load_format) not in SAFETENSORS_LOAD_FORMATS:
        return  # random weights (dummy), .bin files, remote or sharded formats: no safetensors headers to read
    try:
        folder = _local_checkpoint(path, revision)
        if folder is not None:
            warnings = check_checkpoint(folder, drafter)
        elif (names := _hub_tensor_names(path, revision)) is not None:
            warnings = check_names(drafter, names, f"{path} on the hub")
        else:
            logger.info("sglang-kimi: drafter %s is not downloaded yet: its tensor names are not checked", path)
            return
    except DrafterCheckpointError as e:
        raise SpeculativeConfigError(f"--speculative-draft-model-path {path}: {e}") from e
    for message in warnings:
        logger.warning("sglang-kimi: %s", message)


def _architectures(config) -> list[str]:
    return list(getattr(config, "architectures", None) or [])


def _same_checkpoint(a: str, b: str) -> bool:
    try:
        return a == b or Path(a).expanduser().resolve() == Path(b).expanduser().resolve()
    except OSError:
        return False


def check_pair(cfg, algorithm: str):
    """The drafter against the target (raises on what cannot work; logs what only loses acceptance). Returns the
    parsed drafter config."""
    from sglang_kimi.speculators.configs import DrafterConfigError
    from sglang_kimi.speculators.pairing import DRAFTER_EXAMPLES, pairing_warnings, validate_pair

    target = load_config(cfg.model_path, cfg.trust_remote_code, cfg.revision)
    draft = load_config(
        cfg.speculative_draft_model_path,
        cfg.trust_remote_code,
        cfg.speculative_draft_model_revision,
        flag="--speculative-draft-model-path",
    )
    tokens, flag = cfg.speculative_num_draft_tokens, "--speculative-num-draft-tokens"
    block_size = getattr(cfg, "speculative_dflash_block_size", None)
    if tokens is None and algorithm == "DFLASH" and block_size is not None:
        # SGLang's alias for the DFLASH block: it becomes --speculative-num-draft-tokens after these checks
        tokens, flag = int(block_size), "--speculative-dflash-block-size"
    try:
        drafter = validate_pair(
            target, draft, num_draft_tokens=tokens, expected_algorithm=algorithm, draft_tokens_flag=flag
        )
    except DrafterConfigError as e:  # not a drafter config, or a field it cannot hold
        path = cfg.speculative_draft_model_path
        archs = _architectures(draft)
        same = _same_checkpoint(path, cfg.model_path) or (bool(archs) and archs == _architectures(target))
        problem = "is the target model itself, not a drafter" if same else "has a config.json this plugin cannot serve"
        problem += f" ({e})"
        raise SpeculativeConfigError(
            f"--speculative-draft-model-path {path} {problem}: point it at {algorithm} drafter weights (for Kimi: "
            f"{DRAFTER_EXAMPLES[algorithm]})"
        ) from e
    for message in pairing_warnings(
        target,
        draft,
        num_draft_tokens=tokens,
        target_path=cfg.model_path,
        draft_path=cfg.speculative_draft_model_path,
    ):
        logger.warning("sglang-kimi: %s", message)
    check_drafter_tensors(cfg, drafter)
    return drafter


# SGLang's algorithms that draft with something other than a DFLASH or EAGLE3 drafter checkpoint: the target's own
# MTP layers (EAGLE, and NEXTN, its alias, without a drafter), an EAGLE-1/2 head, a separate small model
# (STANDALONE), a Gemma 4 assistant (FROZEN_KV_MTP), a DSpark drafter
OTHER_DRAFTING_ALGORITHMS = ("EAGLE", "NEXTN", "STANDALONE", "FROZEN_KV_MTP", "DSPARK")


def _kimi_drafters() -> str:
    from sglang_kimi.speculators.pairing import DRAFTER_EXAMPLES

    return " or ".join(
        f"--speculative-algorithm {name} --speculative-draft-model-path {example}"
        for name, example in DRAFTER_EXAMPLES.items()
    )


def _text_config(config):
    return getattr(config, "text_config", None) or config


# targets SGLang has no MTP (NextN) drafter model for: EAGLE without a drafter would run the whole target as one
NO_MTP_DRAFTER_ARCHITECTURES = ("KimiK25ForConditionalGeneration",)


def _check_missing_drafter(cfg, algorithm: str) -> None:
    """An algorithm given no drafter, or the target as its drafter: where SGLang would build the drafter from the
    target checkpoint itself."""
    given = (
        "without --speculative-draft-model-path"
        if cfg.speculative_draft_model_path is None
        else "with the target itself as --speculative-draft-model-path"
    )
    if algorithm in ("EAGLE", "NEXTN"):
        target = load_config(cfg.model_path, cfg.trust_remote_code, cfg.revision)
        layers = getattr(_text_config(target), "num_nextn_predict_layers", None) or 0
        wrapper = [a for a in _architectures(target) if a in NO_MTP_DRAFTER_ARCHITECTURES]
        if layers == 0 or wrapper:
            why = (
                "has none (num_nextn_predict_layers 0)"
                if layers == 0
                else f"is a {wrapper[0]}, which SGLang has no MTP drafter model for"
            )
            raise SpeculativeConfigError(
                f"--speculative-algorithm {algorithm} {given} drafts with the target's own MTP (NextN) layers: "
                f"{cfg.model_path} {why}, so SGLang would build the drafter from the whole target checkpoint. Pass "
                f"a drafter: {_kimi_drafters()}"
            )
    elif algorithm == "STANDALONE":
        raise SpeculativeConfigError(
            f"--speculative-algorithm STANDALONE {given}: STANDALONE drafts with a separate, smaller model that "
            "shares the target's tokenizer, and SGLang would load the target a second time as its own drafter, which "
            f"cannot be faster than no speculation. Pass that model, or {_kimi_drafters()}"
        )
    elif algorithm == "FROZEN_KV_MTP":
        raise SpeculativeConfigError(
            f"--speculative-algorithm FROZEN_KV_MTP {given}: it drafts with a Gemma 4 assistant checkpoint (SGLang "
            f"picks this algorithm itself when EAGLE or NEXTN is given such a drafter). For Kimi: {_kimi_drafters()}"
        )


def check_other_drafter(cfg, algorithm: str) -> None:
    """The drafter of an algorithm in :data:`OTHER_DRAFTING_ALGORITHMS`. Refused: no drafter (or the target given as
    one) where SGLang would take the target itself; a DFLASH or EAGLE3 drafter, which only its own algorithm runs the
    way it was trained (EAGLE serves an EAGLE3 drafter with nearly every draft rejected; EAGLE with a DFLASH drafter
    and STANDALONE with an EAGLE3 one fail at start-up or at the first request); a STANDALONE drafter whose
    vocabulary differs from the target's."""
    from sglang_kimi.speculators.configs import DrafterConfigError, drafter_algorithm
    from sglang_kimi.speculators.pairing import indefinite_article

    path = cfg.speculative_draft_model_path
    if path is None or _same_checkpoint(path, cfg.model_path):
        _check_missing_drafter(cfg, algorithm)
        return
    check_draft_path(path, algorithm)
    draft = load_config(
        path, cfg.trust_remote_code, cfg.speculative_draft_model_revision, flag="--speculative-draft-model-path"
    )
    try:
        kind = drafter_algorithm(draft)
    except DrafterConfigError:
        kind = None  # not a DFLASH or EAGLE3 drafter: the algorithm's own kind of checkpoint
    if kind is not None:
        what = f"{indefinite_article(kind)} {kind} drafter (architectures {_architectures(draft)})"
        raise SpeculativeConfigError(
            f"--speculative-draft-model-path {path} is {what}, "
            f"which --speculative-algorithm {algorithm} does not run the way it was trained (SGLang serves it with "
            f"nearly every draft rejected, or fails at start-up or at the first request): pass "
            f"--speculative-algorithm {kind}"
        )
    if algorithm == "STANDALONE":
        target = load_config(cfg.model_path, cfg.trust_remote_code, cfg.revision)
        ours = getattr(_text_config(target), "vocab_size", None)
        theirs = getattr(_text_config(draft), "vocab_size", None)
        if ours is not None and theirs is not None and ours != theirs:
            raise SpeculativeConfigError(
                f"--speculative-draft-model-path {path} has a vocabulary of {theirs} tokens and the target "
                f"{cfg.model_path} one of {ours}: a STANDALONE drafter proposes the target's token ids, so it must "
                "share the target's tokenizer: pass such a model"
            )
