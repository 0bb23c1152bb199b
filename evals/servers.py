"""The servers an eval or benchmark talks to: probing, model identity, launching.

:func:`probe` turns a URL into a :class:`Server` (or an :class:`EvalError` naming the problem: unreachable,
not SGLang). :func:`check_same_model` refuses to compare a server with itself (one URL, or two URLs of one
server), or servers that serve different models: a different architecture, tokenizer, context length or (when both
checkpoints are readable here) a different shape in ``config.json``. Weights are deliberately not fingerprinted: a
quantized or otherwise re-weighted candidate of the same model is exactly what the gate exists to judge.
:func:`launch_pair` starts servers with the plugin's launcher (:mod:`sglang_kimi.launcher.server`).
"""

from __future__ import annotations

import functools
import json
import shlex
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from sglang_kimi.evals.errors import EvalError
from sglang_kimi.launcher import client

# Tokenized on both servers: same ids <=> same tokenizer for all practical purposes (digits, $, unicode, newline).
PROBE_TEXT = "Question: Janet’s 16 ducks lay 3.5 eggs; $2 × 7 = 14?\nAnswer: 48/2 = <<48/2=24>>24\n#### 72 你好"

# config.json fields that define the network (text_config of a multimodal wrapper when present).
SHAPE_KEYS = (
    "architectures",
    "model_type",
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "intermediate_size",
    "moe_intermediate_size",
    "n_routed_experts",
    "n_shared_experts",
    "num_experts_per_tok",
    "first_k_dense_replace",
    "kv_lora_rank",
    "q_lora_rank",
    "qk_rope_head_dim",
    "qk_nope_head_dim",
    "v_head_dim",
    "max_position_embeddings",
    "rope_theta",
)


@dataclass
class Server:
    """What an SGLang server says about itself (``/model_info``, ``/server_info``, ``/v1/models``)."""

    url: str
    model_info: dict
    server_info: dict
    max_model_len: int | None
    probe_tokens: list[int] = field(default_factory=list)

    @property
    def model_path(self) -> str:
        return str(self.model_info.get("model_path"))

    @property
    def served_model_name(self) -> str:
        return str(self.model_info.get("served_model_name") or self.model_path)

    @property
    def max_input_len(self) -> int | None:
        """The longest prompt the server admits (``max_req_input_len``: the context or the KV pool, the smaller)."""
        value = self.server_info.get("max_req_input_len")
        return int(value) if isinstance(value, int) and value > 0 else None

    @property
    def device(self) -> str | None:
        return self.server_info.get("device")

    @property
    def speculative(self) -> str:
        """``none`` or ``ALGO (draft PATH, N draft tokens)``."""
        algo = self.server_info.get("speculative_algorithm")
        if not algo:
            return "none"
        draft = self.server_info.get("speculative_draft_model_path")
        tokens = self.server_info.get("speculative_num_draft_tokens")
        details = ", ".join(
            x for x in (f"draft {draft}" if draft else "", f"{tokens} draft tokens" if tokens else "") if x
        )
        return f"{algo} ({details})" if details else str(algo)

    def summary(self) -> dict:
        return {
            "url": self.url,
            "model_path": self.model_path,
            "architectures": self.model_info.get("architectures"),
            "device": self.device,
            "dtype": self.server_info.get("dtype"),
            "speculative": self.speculative,
            "max_model_len": self.max_model_len,
            "sglang_version": self.server_info.get("version"),
            "launch_command": self.server_info.get("launch_command"),
        }


# seconds a launched server may take to answer /health (a 1T-parameter checkpoint loads for many minutes)
LAUNCH_TIMEOUT = 900.0


def normalize_url(url: str) -> str:
    """``host:port`` or ``http://host:port/`` or ``.../v1`` -> ``http://host:port``."""
    url = url.strip().rstrip("/")
    if "://" not in url:
        url = "http://" + url
    if url.endswith("/v1"):
        url = url[: -len("/v1")]
    return url


# One JSON object from an SGLang server (``launcher.client.get_json``): EvalError naming the problem (and ``fix`` for
# an unreachable server) when it is unreachable, slow, refuses the API key or is not SGLang.
get_json = functools.partial(client.get_json, error=EvalError)


def probe(url: str, timeout: float = 30.0) -> Server:
    """Ask the server at ``url`` who it is; :class:`EvalError` when it is unreachable or not SGLang."""
    url = normalize_url(url)
    model_info = get_json(url, "/model_info", timeout)
    if "model_path" not in model_info or "is_generation" not in model_info:
        raise EvalError(f"{url} is not an SGLang server: /model_info has no model_path / is_generation")
    if not model_info["is_generation"]:
        raise EvalError(f"{url} serves an embedding model ({model_info['model_path']}): GSM8K needs a generative model")
    server_info = get_json(url, "/server_info", timeout)
    if "internal_states" not in server_info:
        raise EvalError(f"{url} is not an SGLang server: /server_info has no internal_states")
    models = get_json(url, "/v1/models", timeout).get("data") or [{}]
    tokens = get_json(url, "/tokenize", timeout, method="POST", body={"prompt": PROBE_TEXT}).get("tokens", [])
    return Server(url, model_info, server_info, models[0].get("max_model_len"), list(tokens))


def local_shape(model_path: str) -> dict | None:
    """The :data:`SHAPE_KEYS` of a checkpoint's config.json when it is readable on this machine."""
    config = Path(model_path).expanduser() / "config.json"
    if not config.is_file():
        return None
    data = json.loads(config.read_text())
    text = data.get("text_config") or {}
    return {key: text.get(key, data.get(key)) for key in SHAPE_KEYS if key in text or key in data}


def model_differences(a: Server, b: Server) -> list[str]:
    """Human-readable differences between what ``a`` and ``b`` serve (empty: the same model)."""
    diffs = []
    for key in ("architectures", "model_type"):
        if a.model_info.get(key) != b.model_info.get(key):
            diffs.append(f"{key} {a.model_info.get(key)} vs {b.model_info.get(key)}")
    if a.max_model_len != b.max_model_len:
        diffs.append(f"context length {a.max_model_len} vs {b.max_model_len}")
    if a.probe_tokens != b.probe_tokens:
        diffs.append(f"tokenizer (probe text -> {len(a.probe_tokens)} vs {len(b.probe_tokens)} tokens, different ids)")
    shape_a, shape_b = local_shape(a.model_path), local_shape(b.model_path)
    if shape_a is not None and shape_b is not None:
        for key in SHAPE_KEYS:
            if shape_a.get(key) != shape_b.get(key):
                diffs.append(f"{key} {shape_a.get(key)} vs {shape_b.get(key)}")
    return diffs


def instance(server: Server) -> tuple | None:
    """What tells one running server from another: its port, its random seed (drawn at launch unless given) and its
    scheduler's pid (the plugin's state); None without the plugin's state."""
    states = server.server_info.get("internal_states") or [{}]
    pid = ((states[0] or {}).get("sglang_kimi") or {}).get("pid")
    return None if pid is None else (server.server_info.get("port"), server.server_info.get("random_seed"), pid)


def check_same_model(baseline: Server, candidate: Server) -> None:
    """Refuse to compare servers of different models, or a server with itself (the same URL, or two URLs of one
    server)."""
    diffs = model_differences(baseline, candidate)
    if diffs:
        raise EvalError(
            f"baseline ({baseline.model_path}) and candidate ({candidate.model_path}) serve different models: "
            + "; ".join(diffs)
            + ": compare a candidate with a baseline of the same model"
        )
    if baseline.url == candidate.url or (instance(baseline) is not None and instance(baseline) == instance(candidate)):
        raise EvalError(
            f"the baseline ({baseline.url}) and the candidate ({candidate.url}) are the same server, so they cannot "
            "differ: start the baseline without speculative decoding on another port and give its URL"
        )


def check_generation_room(flag: str, tokens: int, server: Server) -> None:
    """Refuse an output length (``flag`` = ``tokens``) that leaves no room for a prompt in ``server``'s context: the
    server would refuse every request, and the clients (lm-eval, SGLang's benchmark) report that poorly or not at
    all."""
    if server.max_model_len and tokens >= server.max_model_len:
        raise EvalError(
            f"{flag} {tokens} leaves no room for a prompt in the model's context ({server.max_model_len} tokens) on "
            f"{server.url}: lower {flag}"
        )


def launch_pair(
    specs: dict[str, list[str]], stack: ExitStack, log_dir: Path, timeout: float = LAUNCH_TIMEOUT
) -> dict[str, str]:
    """Start one server per ``{name: sglang args}`` concurrently; ``{name: base_url}``.

    The servers are stopped when ``stack`` closes. Start-up failures become :class:`EvalError` with the
    launcher's message (which names the log).
    """
    from sglang_kimi.launcher.server import ANY_PORT, LaunchError, require_sglang, start_server

    try:
        require_sglang()
    except LaunchError as exc:
        raise EvalError(str(exc)) from None
    log_dir.mkdir(parents=True, exist_ok=True)

    def start(name: str):
        return start_server(specs[name], port=ANY_PORT, log_path=log_dir / f"{name}-server.log", timeout=timeout)

    urls, errors = {}, []
    with ThreadPoolExecutor(len(specs)) as pool:
        futures = {name: pool.submit(start, name) for name in specs}
        for name, future in futures.items():
            try:
                server = future.result()
            except LaunchError as exc:
                errors.append(f"{name}: {exc}" if name == "server" else f"{name} server: {exc}")
                continue
            stack.callback(server.stop)
            urls[name] = server.base_url
    if errors:
        stack.close()
        raise EvalError(" | ".join(errors))
    return urls


def split_args(text: str | None) -> list[str]:
    """``"--speculative-algorithm DFLASH --x 1"`` -> argv list (shell quoting rules)."""
    return shlex.split(text) if text else []
