"""GSM8K from the Hugging Face hub (``openai/gsm8k``, ``main``), answered at once where the hub cannot be reached.

``datasets.load_dataset`` on a machine without the hub retries each request with back-off (about 25 s) before it
fails or falls back to its cache. :func:`load_gsm8k` first tries a TCP connection to the hub's host (a few
milliseconds where its name does not resolve, at most :data:`PROBE_TIMEOUT_S`): where that fails it loads in the
hub libraries' offline mode, so a cached copy loads and a missing one fails at once with :class:`HubUnreachable`.
Behind an HTTP proxy (``HTTPS_PROXY`` / ``ALL_PROXY``) the host is reached through the proxy, so no probe is made;
with ``HF_HUB_OFFLINE=1`` the libraries are offline already.
"""

from __future__ import annotations

import contextlib
import os

from sglang_kimi.launcher.checks import wait_until_listening

DATASET = ("openai/gsm8k", "main")
PROBE_TIMEOUT_S = 3.0
PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")


class HubUnreachable(ConnectionError):
    """The hub cannot be reached and the data set is not in the local cache."""


def hub_endpoint() -> str:
    from huggingface_hub import constants

    return constants.ENDPOINT


def hub_reachable(endpoint: str, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """Whether ``endpoint``'s host accepts a TCP connection (True behind a proxy, which is not probed)."""
    if any(os.environ.get(name) for name in PROXY_VARIABLES):
        return True
    return wait_until_listening(endpoint, timeout_s=0, connect_timeout_s=timeout_s)


@contextlib.contextmanager
def hub_offline():
    """The hub libraries in offline mode for the block: read from the local cache only, no request made."""
    import datasets.config
    from huggingface_hub import constants

    saved = constants.HF_HUB_OFFLINE, datasets.config.HF_HUB_OFFLINE
    constants.HF_HUB_OFFLINE = datasets.config.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE, datasets.config.HF_HUB_OFFLINE = saved


def load_gsm8k(split: str | None = None):
    """``datasets.load_dataset("openai/gsm8k", "main", split=split)``; from the local cache only where the hub's
    host cannot be reached (:class:`HubUnreachable` when it is not cached)."""
    import datasets

    endpoint = hub_endpoint()
    if hub_reachable(endpoint):
        return datasets.load_dataset(*DATASET, split=split)
    with hub_offline():
        try:
            return datasets.load_dataset(*DATASET, split=split)
        except Exception:
            raise HubUnreachable(f"{endpoint} cannot be reached from here and {DATASET[0]} is not cached") from None


def why_not_loaded(exc: Exception) -> str:
    """A short reason for a failed :func:`load_gsm8k`: its own message, or the error's type (the hub libraries'
    messages run to several lines)."""
    return str(exc) if isinstance(exc, HubUnreachable) else type(exc).__name__
