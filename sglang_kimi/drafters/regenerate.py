"""``sglang-kimi drafter regenerate``: a prompt set answered by the target, as SpecForge's regenerated-conversation
jsonl, the training data of a drafter matched to the target's own outputs.

Input rows (a ``.jsonl`` file, one object a line, or a ``.json`` array as ShareGPT dumps come):

- ``{"conversations" | "messages": [{"role", "content"}, ...]}`` (SpecForge, OpenAI);
- ``{"conversations": [{"from": "human" | "gpt" | "system", "value"}, ...]}`` (ShareGPT);
- ``{"prompt" | "question" | "instruction": "..."}``: one user turn.

Every user turn is sent in order to the server's ``/v1/chat/completions`` with the conversation so far (system and
user turns as given, assistant turns as the target answered them); the dataset's own assistant turns are dropped.
The output is SpecForge's (``scripts/regenerate_train_data.py``): each answered row as
``{..., "id", "conversations": [{"role", "content"[, "reasoning_content"]}], "status": "success"}`` in ``OUT``,
rows the server failed on in ``OUT_error.jsonl`` and rows that cannot be regenerated (no user turn, a role out of
order, empty content) in ``OUT_skipped.jsonl``, each with its ``error``. A row's ``id`` is its own, else
``row-<index>``. ``--resume`` continues a run: rows in ``OUT`` or ``OUT_skipped.jsonl`` are done, those in
``OUT_error.jsonl`` are tried again.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import threading
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

import requests
from tqdm import tqdm

from sglang_kimi.launcher.api_key import auth_headers
from sglang_kimi.launcher.client import get_json

SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system"}
PROMPT_KEYS = ("prompt", "question", "instruction")
REASONING = ("none", "save", "disable")


class RegenerateError(RuntimeError):
    """A run that cannot start or finish; the message names the fix."""


@dataclasses.dataclass(frozen=True)
class Sampling:
    max_tokens: int = 2048
    temperature: float = 0.7
    top_p: float | None = None
    top_k: int | None = None
    reasoning: str = "none"  # none | save (keep reasoning_content) | disable (chat_template_kwargs.enable_thinking)

    def body(self, model: str, messages: list[dict]) -> dict:
        body = {"model": model, "messages": messages, "max_tokens": self.max_tokens,
                "temperature": self.temperature, "stream": False}  # fmt: skip
        if self.top_p is not None:
            body["top_p"] = self.top_p
        if self.top_k is not None:
            body["top_k"] = self.top_k
        if self.reasoning != "none":
            body["chat_template_kwargs"] = {"enable_thinking": self.reasoning == "save"}
        return body


@dataclasses.dataclass(frozen=True)
class Outputs:
    success: Path
    error: Path
    skipped: Path

    @classmethod
    def of(cls, path: Path) -> Outputs:
        stem = path.name[: -len(".jsonl")] if path.name.endswith(".jsonl") else path.name
        return cls(path, path.with_name(f"{stem}_error.jsonl"), path.with_name(f"{stem}_skipped.jsonl"))


def read_rows(path: Path) -> list[dict | str]:
    """The file's rows: objects, or the text of a line that is not a JSON object (reported as skipped)."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        try:
            data = json.loads(text)
        except ValueError as e:
            raise RegenerateError(f"{path}: not a JSON array ({e}); give a .jsonl file or a .json array") from None
        if not isinstance(data, list):
            raise RegenerateError(f"{path}: a .json input must be an array of rows")
        return data
    rows: list[dict | str] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except ValueError:
            rows.append(line)
    return rows


def row_id(row, index: int) -> str:
    given = row.get("id") if isinstance(row, dict) else None
    return str(given) if isinstance(given, (str, int)) and str(given) else f"row-{index}"


def turns(row) -> tuple[list[dict] | None, str | None]:
    """The row's messages as ``{"role", "content"}``, or why the row cannot be regenerated."""
    if not isinstance(row, dict):
        return None, "not a JSON object"
    messages = row.get("conversations", row.get("messages"))
    if messages is None:
        prompt = next((row[k] for k in PROMPT_KEYS if k in row), None)
        if not isinstance(prompt, str) or not prompt.strip():
            return None, f"no conversations, messages or {' / '.join(PROMPT_KEYS)} text"
        return [{"role": "user", "content": prompt}], None
    if not isinstance(messages, list) or not messages:
        return None, "conversations is not a non-empty list"
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            return None, f"message {i} is not an object"
        role = m.get("role", SHAREGPT_ROLES.get(str(m.get("from", "")).lower()))
        content = m.get("content", m.get("value"))
        if role not in ("system", "user", "assistant"):
            return None, f"message {i} has role {m.get('role', m.get('from'))!r} (system, user or assistant)"
        if not isinstance(content, str) or not content.strip():
            return None, f"message {i} has no text content"
        out.append({"role": role, "content": content})
    expected, saw_user = "user", False
    for i, m in enumerate(out):
        if m["role"] == "system" and not saw_user:
            continue
        if m["role"] != expected:
            return None, f"message {i} is a {m['role']} turn where a {expected} turn belongs"
        saw_user, expected = True, "assistant" if m["role"] == "user" else "user"
    if not saw_user:
        return None, "no user turn"
    return out, None


class Server:
    """The target's OpenAI chat route."""

    def __init__(self, base_url: str, timeout: float):
        self.url = base_url.rstrip("/")
        self.timeout = timeout
        self.model = self._model()

    def _model(self) -> str:
        fix = "start the target's server, or fix --base-url"
        models = get_json(self.url, "/v1/models", 30, fix=fix, error=RegenerateError)
        try:
            return models["data"][0]["id"]
        except (KeyError, IndexError, TypeError):
            raise RegenerateError(
                f"{self.url} is not an OpenAI-compatible SGLang server: GET /v1/models answered without a model; "
                "give the URL of the target's SGLang server"
            ) from None

    def answer(self, messages: list[dict], sampling: Sampling) -> dict:
        """The assistant turn: ``{"role", "content"[, "reasoning_content"]}``; raises ``RuntimeError`` with the
        server's reason."""
        body = sampling.body(self.model, messages)
        response = requests.post(self.url + "/v1/chat/completions", json=body, timeout=self.timeout,
                                 headers=auth_headers())  # fmt: skip
        if response.status_code != 200:
            raise RuntimeError(f"HTTP {response.status_code}: {response.text[:300]}")
        message = response.json()["choices"][0]["message"]
        content = message.get("content")
        if not isinstance(content, str) or not content.strip():
            raise RuntimeError("the target answered with no text")
        turn = {"role": "assistant", "content": content}
        if sampling.reasoning == "save":
            reasoning = message.get("reasoning_content")
            if not isinstance(reasoning, str) or not reasoning.strip():
                raise RuntimeError(
                    "no reasoning_content: start the server with --reasoning-parser, or use --reasoning none"
                )
            turn["reasoning_content"] = reasoning
        return turn


def regenerate_row(row: dict, messages: list[dict], server: Server, sampling: Sampling) -> dict:
    """The row with its conversation answered by the target, turn by turn; ``status`` success or error."""
    conversation: list[dict] = []
    try:
        for message in messages:
            if message["role"] == "assistant":
                continue  # the dataset's answer: the target's own replaces it
            conversation.append(message)
            if message["role"] == "user":
                conversation.append(server.answer(conversation, sampling))
    except (RuntimeError, requests.RequestException, ValueError, KeyError) as e:
        return {**row, "status": "error", "error": str(e)}
    out = {k: v for k, v in row.items() if k not in ("messages", "prompt", "question", "instruction", "error")}
    return {**out, "conversations": conversation, "status": "success"}


def _done_ids(path: Path) -> set[str]:
    if not path.is_file():
        return set()
    ids = set()
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            ids.add(str(json.loads(line)["id"]))
        except (ValueError, KeyError, TypeError):
            continue
    return ids


@dataclasses.dataclass
class Summary:
    success: int = 0
    error: int = 0
    skipped: int = 0
    resumed: int = 0
    reasons: dict[str, int] = dataclasses.field(default_factory=dict)


def regenerate(input_path: Path, output: Path, base_urls: list[str], sampling: Sampling, *, concurrency: int = 16,
               limit: int | None = None, resume: bool = False, timeout: float = 600.0) -> Summary:  # fmt: skip
    """Answer every row of ``input_path`` with the target at ``base_urls`` (round robin), written to ``output``."""
    outputs = Outputs.of(output)
    if output.exists() and not resume:
        raise RegenerateError(f"{output} exists: pass --resume to continue that run, or remove it")
    servers = [Server(url, timeout) for url in base_urls]
    rows = read_rows(input_path)[:limit]
    done = _done_ids(outputs.success) | _done_ids(outputs.skipped) if resume else set()
    output.parent.mkdir(parents=True, exist_ok=True)
    summary, lock = Summary(resumed=0), threading.Lock()
    mode = "a" if resume else "w"
    with (open(outputs.success, mode, encoding="utf-8") as ok, open(outputs.error, "w", encoding="utf-8") as bad,
          open(outputs.skipped, mode, encoding="utf-8") as skipped):  # fmt: skip

        def write(handle, record: dict) -> None:
            with lock:
                handle.write(json.dumps(record, ensure_ascii=False) + "\n")
                handle.flush()

        todo = []
        for index, row in enumerate(rows):
            rid = row_id(row, index)
            if rid in done:
                summary.resumed += 1
                continue
            messages, why = turns(row)
            if messages is None:
                record = {**row} if isinstance(row, dict) else {"line": row}
                write(skipped, {**record, "id": rid, "status": "skipped", "error": why})
                summary.skipped += 1
                summary.reasons[why] = summary.reasons.get(why, 0) + 1
                continue
            todo.append(({**row, "id": rid}, messages))
        cycle = itertools.cycle(servers)
        bar = tqdm(total=len(todo), desc="regenerate", unit="row")
        with ThreadPoolExecutor(max(1, concurrency)) as pool, bar:
            futures = [pool.submit(regenerate_row, row, messages, next(cycle), sampling) for row, messages in todo]
            for future in as_completed(futures):
                record = future.result()
                if record["status"] == "success":
                    write(ok, record)
                    summary.success += 1
                else:
                    write(bad, record)
                    summary.error += 1
                bar.update(1)
    return summary
