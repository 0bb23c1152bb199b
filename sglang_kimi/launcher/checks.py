"""What is checked before SGLang is started, each failure a :class:`LaunchError` naming the fix: the model path (a
checkpoint folder, or a hub id SGLang can resolve) and the port (a number, free on the host's addresses), and the
picking of free ports for servers started side by side."""

from __future__ import annotations

import errno
import json
import os
import re
import socket
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

DEFAULT_HOST = "127.0.0.1"


class LaunchError(RuntimeError):
    """A server could not be started; the message names the problem and the fix."""


POLL_S = 0.05  # between tries of wait_until_listening
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json")


def lacks_image_processor(model_path: str) -> bool:
    """Whether ``model_path`` is a local multimodal checkpoint (a ``vision_config`` in its config.json) that ships
    no image processor. SGLang loads the processor at start-up for a multimodal model and stops there without one
    (transformers: "Can't load image processor"); such a checkpoint is served text-only. The embedded tiny model and
    the variants made from it are such checkpoints: they have a vision config and no vision tower."""
    path = Path(model_path).expanduser()
    config = path / "config.json"
    if not path.is_dir() or not config.is_file() or any((path / f).exists() for f in PROCESSOR_FILES):
        return False
    try:
        return "vision_config" in json.loads(config.read_text())
    except (OSError, ValueError):
        return False  # an unreadable config is SGLang's to report


def check_model_path(model_path: str, revision: str | None = None, flag: str = "--model-path") -> None:
    """A checkpoint folder with its config.json, or a hub id SGLang can resolve: in the hub cache, or (online) on a
    hub that answers for it. Raises :class:`LaunchError` naming the fix; the hub is asked once, for config.json."""
    path = Path(model_path).expanduser()
    what = "model path" if flag == "--model-path" else flag
    if path.exists():
        if path.is_dir() and not (path / "config.json").exists():
            raise LaunchError(f"{what} {model_path} has no config.json: point {flag} at a checkpoint folder")
        return
    if HUB_ID.match(model_path):  # a hub id, resolved by SGLang: downloaded, or read from the hub cache offline
        if _in_hub_cache(model_path, revision):
            return
        if hub_offline():
            raise LaunchError(
                f"{what} {model_path} is no local folder, and HF_HUB_OFFLINE is set while the hub cache lacks it: "
                f"download it first (`hf download {model_path}`), unset HF_HUB_OFFLINE, or pass a checkpoint folder"
            )
        problem = None if modelscope() else hub_problem(model_path, revision)
        if problem:
            raise LaunchError(f"{what} {model_path} is not in the Hugging Face cache, and {problem}")
        return
    raise LaunchError(f"{what} {model_path} does not exist: pass {flag} with an existing checkpoint folder")


MODELSCOPE_ENV = "SGLANG_USE_MODELSCOPE"  # SGLang then downloads from ModelScope, not the Hugging Face hub


def modelscope() -> bool:
    """Whether SGLang resolves hub ids on ModelScope (``SGLANG_USE_MODELSCOPE``), so the Hugging Face hub is not
    the one to ask."""
    return os.environ.get(MODELSCOPE_ENV, "").lower() in ("1", "true")


def hub_problem(repo_id: str, revision: str | None = None) -> str | None:
    """Why SGLang could not fetch ``repo_id``'s config.json from the Hugging Face hub now, with the fix; None when it
    can, or when the hub answered something else (SGLang reports that in its own words)."""
    from huggingface_hub import constants, file_exists
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, HFValidationError

    try:
        if file_exists(repo_id, "config.json", revision=revision):
            return None
        at = f" at revision {revision}" if revision else ""
        return (
            f"the hub has no config.json there{at}: check the id (and the revision), or log in (`hf auth login` or "
            "HF_TOKEN) if the repository is private"
        )
    except GatedRepoError:
        return "the repository is gated: accept its terms on the hub, then log in (`hf auth login` or HF_TOKEN)"
    except (HfHubHTTPError, HFValidationError):
        return None
    except Exception as e:  # no answer at all: name resolution, refused connection, proxy, timeout
        return (
            f"the hub ({constants.ENDPOINT}) cannot be reached ({type(e).__name__}: {e}): download it where the hub "
            f"is reachable (`hf download {repo_id}`) and pass the folder, or set HF_ENDPOINT to a mirror"
        )


def hub_offline() -> bool:
    """HF_HUB_OFFLINE as huggingface_hub reads it."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in {"1", "ON", "YES", "TRUE"}


def _in_hub_cache(repo_id: str, revision: str | None = None) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache

        return isinstance(try_to_load_from_cache(repo_id, "config.json", revision=revision), str)
    except Exception:  # an id the hub client refuses, an unreadable cache
        return False


def _addresses(host: str, port: int) -> list[tuple]:
    """(family, address) of each address ``host`` stands for, as SGLang's server binds them."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError):
        raise LaunchError(
            f"--host {host} is not an address of this machine: pass --host 127.0.0.1 or 0.0.0.0"
        ) from None
    return [(family, address) for family, _, _, _, address in infos]


def _bind(family: int, address: tuple) -> socket.socket:
    """A socket bound as uvicorn binds (SO_REUSEADDR: a port whose last connections linger in TIME_WAIT is free)."""
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(address)
    except OSError:
        sock.close()
        raise
    return sock


def port_number(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise LaunchError(f"--port {text} is not a number: pass --port with a port from 1 to 65535") from None
    if not 1 <= port <= 65535:
        raise LaunchError(f"--port {port} is outside 1..65535: pass --port with a port in that range")
    return port


def check_port_free(host: str, port: int) -> None:
    for family, address in _addresses(host, port):
        try:
            _bind(family, address).close()
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise LaunchError(f"port {port} on {host} is already in use: pass --port with a free port") from None
            if exc.errno == errno.EACCES:
                raise LaunchError(f"port {port} needs privileges to bind: pass --port with a port above 1023") from None
            raise LaunchError(
                f"cannot listen on {host}:{port} ({exc.strerror}): pass --host with an address of this machine"
            ) from None


_handed_out: set[int] = set()  # ports free_port() gave this process: servers started side by side get distinct ones
_handed_out_lock = threading.Lock()


def free_port(host: str = DEFAULT_HOST) -> int:
    """A port free now and not handed out before by this process (the kernel may offer a port again once it is
    released; two servers starting at once on one port would answer each other's health checks)."""
    family, address = _addresses(host, 0)[0]
    with _handed_out_lock:
        while True:
            with socket.socket(family, socket.SOCK_STREAM) as sock:
                sock.bind(address)
                port = sock.getsockname()[1]
            if port not in _handed_out:
                _handed_out.add(port)
                return port


def wait_until_listening(url: str, timeout_s: float, connect_timeout_s: float = 1.0) -> bool:
    """Whether ``url``'s host and port accept a TCP connection within ``timeout_s`` seconds (0: one try), each try
    given ``connect_timeout_s``."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection((parts.hostname, port), timeout=connect_timeout_s):
                return True
        except OSError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(POLL_S)
