"""FP8 KV cache scales for Kimi: per-layer scales from the real KV data (dynamic, then frozen) or from a file.

An FP8 e4m3 cache holds |x| <= 448. SGLang stores ``x / k_scale`` and multiplies by ``k_scale`` when reading, but
Kimi's checkpoints carry no KV scales: ``k_scale`` stays 1.0 and every KV value above 448 is clipped (and values
below 2^-9 flush to zero), so attention over large latent values degenerates. Drafters are worse off: their
attention layers never receive scales at all (vLLM #49262).

What one scale covers:

- **MLA** (the Kimi target; EAGLE3-MLA drafters): one cache row per token per layer, ``[normed latent (kv_lora_rank)
  | roped key (qk_rope_head_dim)]`` = 576 values for Kimi. K reads the whole row and V its first 512 values, so a
  layer has a single scale: ``k_scale == v_scale``.
- **MHA** (the DFlash drafter's GQA attention): K and V rows ``[kv_heads, head_dim]`` with a scale each.

The scale rule (:class:`ScaleRule`), per layer and tensor::

    amax  = running max of |x| over every KV row written so far (every write the Python side sees: with CUDA
            graphs, extend/prefill batches only)
    scale = 2 ** ceil(log2(amax * headroom / 448))      # a power of two: re-encoding stored FP8 rows is exact

    frozen once `freeze_tokens` tokens were observed, or once at least `min_tokens` were observed and the running
    max grew by at most `growth_tol` (relative) over the last `patience` observed batches. A frozen scale never
    changes again. Before it freezes, a layer whose scale grows has its stored rows re-encoded (x * old / new).

Modes (``SGLANG_KIMI_KV_SCALES``, read in every SGLang process):

- a path: the JSON written by ``sglang-kimi calibrate-kv``; scales are applied at model load, before any CUDA graph
  is captured, to the target's and the drafter's attention layers, and never change. The production setting. Each
  model follows its own pool's dtype (the drafter's is ``--speculative-draft-kv-cache-dtype`` when given); a launch
  with no FP8 cache at all is refused, as is an explicit ``dynamic`` there (:func:`check_kv_dtype`).
- ``dynamic`` (the default with ``--kv-cache-dtype fp8_e4m3``): the rule above on the live traffic. CUDA graphs bake
  the kernels' scale at capture, so dynamic scales need CUDA graphs off in every phase (``--cuda-graph-backend-decode
  disabled --cuda-graph-backend-prefill disabled``, or the older ``--disable-cuda-graph``); with a graph in any
  phase the plugin keeps SGLang's 1.0 and says how to calibrate instead.
- ``observe``: record the running max without touching anything (any KV dtype): what ``calibrate-kv`` reads back
  from ``/server_info``.
- ``off``: SGLang's behaviour.

SGLang applies ``layer.k_scale`` to MLA rows only in its triton attention backend (``k / k_scale`` before the write,
``k_descale`` in the kernels); FlashInfer-MLA ignores it and trtllm-mla only scales its BMM1. Scales are therefore
set on MLA layers only under ``--attention-backend triton``; other backends get a warning. Drafter (MHA) pools
divide by ``layer.k_scale`` on every write path SGLang has.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

logger = logging.getLogger("sglang_kimi")

ENV = "SGLANG_KIMI_KV_SCALES"
FORMAT = "sglang-kimi-kv-scales/1"
FP8_E4M3_MAX = 448.0
MODES = ("dynamic", "observe", "off")
TARGET, DRAFT = "target", "draft"
DRAFTER_ARCHITECTURES = ("DFlashDraftModel", "LlamaForCausalLMEagle3", "Eagle3DeepseekV2ForCausalLM")
SCALE_AWARE_MLA_BACKENDS = ("triton",)


class KVScalesError(ValueError):
    """A KV scale file or setting that cannot be used; the message names the problem and the fix."""

    names_the_fix = True  # the plugin's registrations log the message alone, without a traceback


@dataclass(frozen=True)
class ScaleRule:
    """How a running max becomes a scale, and when it stops changing (see the module docstring)."""

    headroom: float = 1.25  # room above the observed max for later, larger values
    freeze_tokens: int = 4096  # freeze after this many observed tokens ...
    min_tokens: int = 256  # ... or, after at least this many,
    patience: int = 8  # ... once `patience` consecutive observed batches
    growth_tol: float = 0.05  # ... grew the running max by at most 5%
    fp8_max: float = FP8_E4M3_MAX

    def scale(self, amax: float) -> float:
        """The power-of-two scale that maps ``amax * headroom`` to at most ``fp8_max`` (1.0 for an empty layer)."""
        if amax <= 0 or not math.isfinite(amax):
            return 1.0
        return 2.0 ** math.ceil(math.log2(amax * self.headroom / self.fp8_max))


@dataclass
class LayerScale:
    """One attention layer's running max and scales. MLA layers keep one scale (``v_scale == k_scale``)."""

    mla: bool
    freeze: bool = True  # False: observe only (calibration), never frozen
    k_amax: float = 0.0
    v_amax: float = 0.0
    k_scale: float = 1.0
    v_scale: float = 1.0
    tokens: int = 0
    batches: int = 0
    stable_batches: int = 0
    frozen: bool = False
    _window_start: float = field(default=0.0, repr=False)

    def observe(self, k_amax: float, v_amax: float, tokens: int, rule: ScaleRule) -> bool:
        """Fold one batch's maxima in; returns whether the scales changed. No effect once frozen."""
        if self.frozen:
            return False
        if self.mla:
            k_amax = v_amax = max(k_amax, v_amax)
        self.k_amax, self.v_amax = max(self.k_amax, k_amax), max(self.v_amax, v_amax)
        self.tokens += tokens
        self.batches += 1
        running = max(self.k_amax, self.v_amax)
        if self.stable_batches == 0:
            self._window_start = running
        if running <= self._window_start * (1.0 + rule.growth_tol):
            self.stable_batches += 1
        else:
            self.stable_batches, self._window_start = 1, running
        old = (self.k_scale, self.v_scale)
        self.k_scale, self.v_scale = rule.scale(self.k_amax), rule.scale(self.v_amax)
        settled = self.tokens >= rule.min_tokens and self.stable_batches > rule.patience
        if self.freeze and (self.tokens >= rule.freeze_tokens or settled):
            self.frozen = True
        return (self.k_scale, self.v_scale) != old

    def as_json(self) -> dict:
        return {
            "k_scale": self.k_scale,
            "v_scale": self.v_scale,
            "k_amax": self.k_amax,
            "v_amax": self.v_amax,
            "tokens": self.tokens,
            "frozen": self.frozen,
            "mla": self.mla,
        }


# ---------------------------------------------------------------------------------------------------------------
# Re-encoding stored FP8 rows
# ---------------------------------------------------------------------------------------------------------------


def reencode_(buffer: torch.Tensor, fp8_dtype: torch.dtype, ratio: float, chunk: int = 1 << 16) -> None:
    """Re-encode stored FP8 rows in place for a scale change: ``x_new = x_old * ratio`` with ratio = old / new (a
    power of two: exact except values pushed below FP8's subnormal range). ``buffer`` is the pool's storage
    (uint8 or fp8) [rows, ...]."""
    view = buffer.view(fp8_dtype)
    for start in range(0, view.shape[0], chunk):
        part = view[start : start + chunk]
        part.copy_((part.to(torch.float32) * ratio).to(fp8_dtype))


# ---------------------------------------------------------------------------------------------------------------
# Scale files
# ---------------------------------------------------------------------------------------------------------------


def scales_document(layers: Mapping[str, Mapping[int, LayerScale]], rule: ScaleRule, models: Mapping[str, str]) -> dict:
    """The JSON ``calibrate-kv`` writes: per role (target, draft), per layer id, the scales and what they came from."""
    return {
        "format": FORMAT,
        "fp8_dtype": "float8_e4m3fn",
        "rule": asdict(rule),
        **{
            role: {"model": models.get(role), "layers": {str(i): s.as_json() for i, s in sorted(per.items())}}
            for role, per in layers.items()
        },
    }


def read_scales(path: str | Path) -> dict[str, dict[int, tuple[float, float]]]:
    """role -> layer id -> (k_scale, v_scale) from a ``calibrate-kv`` file."""
    path = Path(path).expanduser()
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise KVScalesError(
            f"{ENV}={path}: no such file: write it with `sglang-kimi calibrate-kv --out {path}`, or set {ENV} to "
            f"one of the modes {', '.join(MODES)}"
        )
    except json.JSONDecodeError as exc:
        raise KVScalesError(f"{ENV}={path} is not JSON ({exc}): write it with `sglang-kimi calibrate-kv`")
    if doc.get("format") != FORMAT:
        raise KVScalesError(
            f"{path} is not a KV scale file ({FORMAT!r} expected): write it with `sglang-kimi calibrate-kv`"
        )
    out: dict[str, dict[int, tuple[float, float]]] = {}
    for role in (TARGET, DRAFT):
        for layer, entry in ((doc.get(role) or {}).get("layers") or {}).items():
            k, v = float(entry["k_scale"]), float(entry["v_scale"])
            if not (k > 0 and v > 0 and math.isfinite(k) and math.isfinite(v)):
                raise KVScalesError(f"{path}: {role} layer {layer} has invalid scales ({k}, {v}): recalibrate")
            out.setdefault(role, {})[int(layer)] = (k, v)
    return out


# ---------------------------------------------------------------------------------------------------------------
# Process-wide state (one SGLang scheduler process serves one target and at most one drafter)
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class Tracked:
    role: str
    layer_id: int
    state: LayerScale
    dynamic: bool  # True: scales follow the rule; False: observe only


RULE = ScaleRule()
_TRACKED: dict[int, Tracked] = {}  # id(RadixAttention) -> tracking
# (role, layer id) -> every RadixAttention of that layer: DeepSeek-style MLA has two (attn_mqa, the absorbed path that
# writes the latent cache, and attn_mha), which share the layer's cache rows and so its state and scales.
_SIBLINGS: dict[tuple[str, int], list] = {}
_MODELS: dict[str, str] = {}


def _track(role: str, layers, make_state, dynamic: bool) -> None:
    states: dict[int, LayerScale] = {}
    for layer in layers:
        state = states.setdefault(layer.layer_id, make_state())
        _TRACKED[id(layer)] = Tracked(role, layer.layer_id, state, dynamic)
        _SIBLINGS.setdefault((role, layer.layer_id), []).append(layer)


def mode() -> str:
    value = os.environ.get(ENV, "").strip()
    return value or "dynamic"


def snapshot() -> dict:
    """The live state, reported in ``/server_info`` (``internal_states[0].sglang_kimi.kv_scales``)."""
    layers: dict[str, dict[int, LayerScale]] = {}
    for t in _TRACKED.values():
        layers.setdefault(t.role, {})[t.layer_id] = t.state
    doc = scales_document(layers, RULE, _MODELS)
    doc["mode"] = mode()
    return doc


def model_role(model) -> str:
    config = getattr(model, "config", None)
    archs = tuple(getattr(config, "architectures", None) or ())
    drafter = any(a in DRAFTER_ARCHITECTURES for a in archs) or type(model).__name__ in DRAFTER_ARCHITECTURES
    return DRAFT if drafter else TARGET


def _is_mla(model) -> bool:
    config = getattr(model, "config", None)
    text = getattr(config, "text_config", None) or config
    return getattr(text, "kv_lora_rank", None) is not None


def _attention_layers(model):
    from sglang.srt.layers.radix_attention import RadixAttention

    return [m for m in model.modules() if isinstance(m, RadixAttention)]


def set_layer_scales(layer, k_scale: float, v_scale: float) -> None:
    """Give a RadixAttention the scales SGLang's write and read paths use (tensor for the write, float for kernels)."""
    device = next((p.device for p in getattr(layer, "parameters", lambda: [])()), None) or torch.device("cpu")
    for name, value in (("k_scale", k_scale), ("v_scale", v_scale)):
        current = getattr(layer, name, None)
        if isinstance(current, torch.Tensor):
            current.data.fill_(value)
        else:
            setattr(layer, name, torch.tensor(value, dtype=torch.float32, device=device))
        setattr(layer, name + "_float", float(value))


def _mla_backend_ok(role: str) -> bool:
    from sglang.srt.runtime_context import attention_backends

    backends = set(b for b in attention_backends() if b)
    if backends <= set(SCALE_AWARE_MLA_BACKENDS):
        return True
    logger.warning(
        "sglang-kimi: FP8 KV scales are not applied to the %s's MLA layers: attention backend(s) %s ignore "
        "layer.k_scale for the MLA latent cache (values above 448 clip). Use --attention-backend triton.",
        role,
        ", ".join(sorted(backends)),
    )
    return False


CUDA_GRAPHS_OFF = "--cuda-graph-backend-decode disabled --cuda-graph-backend-prefill disabled"


def cuda_graph_phases_on(config, disable_cuda_graph: bool) -> list[str]:
    """The phases SGLang captures CUDA graphs for, from its resolved ``cuda_graph_config`` (a backend per phase,
    set by ``--cuda-graph-backend-*``, ``--disable-*-cuda-graph``, ``--cuda-graph-config`` and the older
    ``--disable-cuda-graph``); from ``disable_cuda_graph`` alone where no config was published."""
    phases = {p: getattr(getattr(config, p, None), "backend", None) for p in ("decode", "prefill")}
    if all(isinstance(b, str) for b in phases.values()):
        return [p for p, backend in phases.items() if backend != "disabled"]
    return [] if disable_cuda_graph else ["decode", "prefill"]


def _cuda_graphs_enabled() -> bool:
    if not torch.cuda.is_available():
        return False
    # SGLang's runtime context, published before any model loads (its older get_global_server_args() only raises)
    from sglang.srt.runtime_context import get_exec, get_server_args

    try:  # the config the model runner captures graphs by
        config = get_exec().graph.cuda_graph_config
    except (AttributeError, ValueError):
        config = None
    return bool(cuda_graph_phases_on(config, bool(getattr(get_server_args(), "disable_cuda_graph", False))))


def _after_load_kv_cache_scales(original, *args, model, kv_cache_dtype: str, **kwargs):
    """Around SGLang's ``load_kv_cache_scales`` (every model runner: target and drafter)."""
    result = original(*args, model=model, kv_cache_dtype=kv_cache_dtype, **kwargs)
    # SGLang passes the target's dtype to the drafter's runner too; its pool follows the drafter's own setting
    from sglang.srt.runtime_context import get_server_args

    draft_dtype = getattr(get_server_args(), "speculative_draft_kv_cache_dtype", None)
    setup_model(model, served_kv_dtypes(kv_cache_dtype, draft_dtype)[model_role(model)])
    return result


def setup_model(model, kv_cache_dtype: str, env_mode: str | None = None) -> str:
    """Apply the configured mode to a loaded model's attention layers; returns what was done."""
    chosen = env_mode or mode()
    fp8 = is_fp8(kv_cache_dtype)
    role, mla = model_role(model), _is_mla(model)
    layers = _attention_layers(model)
    _MODELS[role] = type(model).__name__
    for key in [k for k, t in _TRACKED.items() if t.role == role]:  # a new model of this role replaces the last
        del _TRACKED[key]
    for key in [k for k in _SIBLINGS if k[0] == role]:
        del _SIBLINGS[key]
    if chosen == "off" or (not fp8 and chosen != "observe"):
        return "off"
    if chosen == "observe":
        _track(role, layers, lambda: LayerScale(mla=mla, freeze=False), dynamic=False)
        return "observe"
    if fp8 and mla and not _mla_backend_ok(role):
        return "unsupported backend"
    if chosen == "dynamic":
        if _cuda_graphs_enabled():
            logger.warning(
                "sglang-kimi: FP8 KV cache with dynamic scales needs CUDA graphs off (%s; CUDA graphs bake the "
                "scale at capture); keeping scale 1.0 for the %s. Calibrate once instead: start a server with "
                "%s=observe, run `sglang-kimi calibrate-kv --base-url URL --out kv_scales.json`, then serve with "
                "%s=kv_scales.json",
                CUDA_GRAPHS_OFF,
                role,
                ENV,
                ENV,
            )
            return "dynamic refused (CUDA graphs)"
        for layer in layers:
            set_layer_scales(layer, 1.0, 1.0)
        _track(role, layers, lambda: LayerScale(mla=mla), dynamic=True)
        return "dynamic"
    scales = read_scales(chosen).get(role)
    if not scales:
        raise KVScalesError(
            f"{ENV}={chosen} has no {role} layers: calibrate with the {role} served "
            f"(`sglang-kimi calibrate-kv` records the drafter's layers when the server runs one)"
        )
    missing = sorted({layer.layer_id for layer in layers} - set(scales))
    if missing:
        raise KVScalesError(f"{ENV}={chosen} has no scales for {role} layers {missing}: recalibrate for this model")
    for layer in layers:
        k, v = scales[layer.layer_id]
        if mla:  # one latent row serves K and V
            k = v = max(k, v)
        set_layer_scales(layer, k, v)
        state = LayerScale(mla=mla, k_scale=k, v_scale=v, frozen=True)
        _TRACKED[id(layer)] = Tracked(role, layer.layer_id, state, dynamic=False)
        _SIBLINGS.setdefault((role, layer.layer_id), []).append(layer)
    logger.info("sglang-kimi: FP8 KV scales for %d %s layers from %s", len(layers), role, chosen)
    return "file"


# ---------------------------------------------------------------------------------------------------------------
# Observation on the pools' write paths
# ---------------------------------------------------------------------------------------------------------------


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def _amax(x: torch.Tensor) -> float:
    return float(x.detach().abs().amax()) if x is not None and x.numel() else 0.0


def _observe(
    pool, layer, cache_k, cache_v, incoming_scale: float, buffers, prescaled: bool
) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """Update the layer's running max from one write; under dynamic scales re-encode what is stored (and, for
    ``prescaled`` rows, the incoming ones) when the scale grows. ``incoming_scale``: what the incoming rows were
    already divided by (MLA under the triton backend: ``layer.k_scale``; MHA rows arrive raw, the pool divides)."""
    tracked = _TRACKED.get(id(layer))
    if tracked is None or tracked.state.frozen or _capturing():
        return cache_k, cache_v, False
    state = tracked.state
    old_k, old_v = state.k_scale, state.v_scale
    k_amax = _amax(cache_k) * incoming_scale
    # MLA: the stored row is cache_k ([latent | rope]); cache_v (the latent again, unscaled) is not stored
    v_amax = k_amax if state.mla else _amax(cache_v) * incoming_scale
    changed = state.observe(k_amax, v_amax, int(cache_k.shape[0]), RULE)
    if not (tracked.dynamic and changed):
        return cache_k, cache_v, False
    fp8_dtype = getattr(pool, "dtype", torch.float8_e4m3fn)
    for buffer, old, new in zip(buffers, (old_k, old_v), (state.k_scale, state.v_scale)):
        if buffer is not None and old != new:
            reencode_(buffer, fp8_dtype, old / new)
    if prescaled:  # MLA under the triton backend: the rows arrive divided by the old scale
        cache_k = cache_k * (incoming_scale / state.k_scale)
    for sibling in _SIBLINGS.get((tracked.role, tracked.layer_id), [layer]):
        set_layer_scales(sibling, state.k_scale, state.v_scale)
    return cache_k, cache_v, True


def _mha_set_kv_buffer(original, pool, layer, loc_info, cache_k, cache_v, k_scale=None, v_scale=None, *args, **kw):
    if id(layer) in _TRACKED and not _TRACKED[id(layer)].state.frozen:
        idx = layer.layer_id - pool.start_layer
        tracked = _TRACKED[id(layer)]
        buffers = (pool.k_buffer[idx], pool.v_buffer[idx]) if tracked.dynamic else (None, None)
        cache_k, cache_v, changed = _observe(pool, layer, cache_k, cache_v, 1.0, buffers, prescaled=False)
        if changed:
            k_scale, v_scale = layer.k_scale, layer.v_scale
    return original(pool, layer, loc_info, cache_k, cache_v, k_scale, v_scale, *args, **kw)


def _mla_set_kv_buffer(original, pool, layer, loc_info, cache_k, cache_v, *args, **kw):
    if id(layer) in _TRACKED and not _TRACKED[id(layer)].state.frozen:
        tracked = _TRACKED[id(layer)]
        incoming = float(layer.k_scale_float) if tracked.dynamic and getattr(layer, "k_scale_float", None) else 1.0
        buffers = (pool.kv_buffer[layer.layer_id - pool.start_layer], None) if tracked.dynamic else (None, None)
        cache_k, cache_v, _ = _observe(pool, layer, cache_k, cache_v, incoming, buffers, prescaled=tracked.dynamic)
    return original(pool, layer, loc_info, cache_k, cache_v, *args, **kw)


def check_setting() -> None:
    """Raise :class:`KVScalesError`, naming the fix, when ``SGLANG_KIMI_KV_SCALES`` is neither a mode nor a usable
    scale file. Called in every SGLang process by the registrations and, before any weight loads, by the start-up
    validation (a registration's failure is only logged, and the server would serve with scale 1.0)."""
    if mode() not in MODES:
        read_scales(mode())


def is_fp8(kv_cache_dtype) -> bool:
    """Whether a ``--kv-cache-dtype`` value builds an FP8 pool (the values the scales act on)."""
    return str(kv_cache_dtype).startswith("fp8")


def _scales_asked_for() -> str | None:
    """The setting when it asks for scales explicitly (a file, or ``dynamic`` set by hand), else None."""
    setting = os.environ.get(ENV, "").strip()
    return None if not setting or setting in ("observe", "off") else setting


def served_kv_dtypes(kv_cache_dtype: str, draft_kv_cache_dtype: str | None) -> dict[str, str]:
    """role -> the ``--kv-cache-dtype`` its pool is built with: the drafter's is
    ``--speculative-draft-kv-cache-dtype`` when given (its ``auto`` is the drafter's model dtype), else the target's."""
    return {
        TARGET: str(kv_cache_dtype),
        DRAFT: str(kv_cache_dtype if draft_kv_cache_dtype is None else draft_kv_cache_dtype),
    }


def check_kv_dtype(kv_cache_dtype: str, draft_kv_cache_dtype: str | None = None) -> None:
    """Raise :class:`KVScalesError` when ``SGLANG_KIMI_KV_SCALES`` asks for scales (a file, or ``dynamic`` set
    explicitly) and no KV cache of the launch is FP8: the scales would be left unused (the setting is only read by
    an FP8 cache; ``observe`` works with any dtype). ``draft_kv_cache_dtype``: the drafter's own setting, None
    where there is no drafter or it shares the target's dtype."""
    setting = _scales_asked_for()
    if setting is None:
        return
    if any(is_fp8(dtype) for dtype in served_kv_dtypes(kv_cache_dtype, draft_kv_cache_dtype).values()):
        return
    given = f"--kv-cache-dtype {kv_cache_dtype}"
    if draft_kv_cache_dtype:
        given += f" and --speculative-draft-kv-cache-dtype {draft_kv_cache_dtype}"
    raise KVScalesError(
        f"{ENV}={setting} sets FP8 KV cache scales, but {given} builds no FP8 KV cache, so nothing would use "
        f"them (the plugin scales a cache only under an explicit fp8 dtype): serve with --kv-cache-dtype fp8_e4m3 "
        f"(on a GPU), or unset {ENV} (`observe` records KV maxima for calibrate-kv with any dtype)"
    )


def check_mla_backends(kv_cache_dtype: str, backends: set[str | None], target_is_mla: bool) -> None:
    """Raise :class:`KVScalesError` when ``SGLANG_KIMI_KV_SCALES`` asks for scales (a file, or ``dynamic`` set
    explicitly) of an FP8 MLA target whose attention backends ignore ``layer.k_scale`` for the latent cache: the
    target kept scale 1.0 (values above 448 clip) with a warning. ``backends``: the resolved (prefill, decode)."""
    setting = _scales_asked_for()
    if setting is None or not target_is_mla:
        return
    if not is_fp8(kv_cache_dtype) or None in backends or backends <= set(SCALE_AWARE_MLA_BACKENDS):
        return
    raise KVScalesError(
        f"{ENV}={setting} sets FP8 KV scales, but the target's MLA layers would keep scale 1.0 (every latent value "
        f"above 448 clipped): attention backend(s) {', '.join(sorted(backends))} ignore layer.k_scale for the MLA "
        f"latent cache: serve with --attention-backend {' or '.join(SCALE_AWARE_MLA_BACKENDS)}, or unset {ENV}"
    )


def check_launch(cfg, draft_kv_cache_dtype: str | None) -> None:
    """Every start-up check of the setting, on SGLang's resolving view ``cfg`` of the server arguments (its attention
    backends already resolved): a usable setting, an FP8 cache for explicit scales, and a backend that applies them
    to an MLA target. The target's model config is read only when explicit scales meet an FP8 cache."""
    check_setting()
    check_kv_dtype(cfg.kv_cache_dtype, draft_kv_cache_dtype)
    if _scales_asked_for() is not None and is_fp8(cfg.kv_cache_dtype):
        from sglang.srt.arg_groups.model_override_base import attention_backends_of, use_mla_backend

        check_mla_backends(cfg.kv_cache_dtype, set(attention_backends_of(cfg)), use_mla_backend(cfg))


def _active() -> str | None:
    """None when the hooks should be installed; else why not (the table records it as skipped)."""
    if mode() == "off":
        return f"{ENV}=off"
    check_setting()
    return None


def install_kv_scales(target: str):
    """Table entry ``kimi-fp8-kv-scales``: scales (file / dynamic / observe) applied to every loaded model's
    attention layers, target and drafter."""
    from sglang_kimi.hooks import hook

    skipped = _active()
    if skipped is None:
        hook(target, _after_load_kv_cache_scales, "AROUND")
    return skipped


def install_mha_observer(target: str):
    """Table entry ``kimi-kv-observe-mha``: running max / dynamic scales on MHA writes (DFlash drafter pools)."""
    from sglang_kimi.hooks import hook

    skipped = _active()
    if skipped is None:
        hook(target, _mha_set_kv_buffer, "AROUND")
    return skipped


def install_mla_observer(target: str):
    """Table entry ``kimi-kv-observe-mla``: running max / dynamic scales on MLA latent writes (the Kimi target)."""
    from sglang_kimi.hooks import hook

    skipped = _active()
    if skipped is None:
        hook(target, _mla_set_kv_buffer, "AROUND")
    return skipped
