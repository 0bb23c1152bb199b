"""GSM8K from the hub (``evals/hub_data.py``): where the hub's host cannot be reached, the data set is read from the
local cache only (the hub libraries in offline mode) and a missing one fails at once naming the host."""

import socket

import datasets
import datasets.config
import pytest
from huggingface_hub import constants

from sglang_kimi.evals import hub_data
from sglang_kimi.evals.hub_data import HubUnreachable, hub_reachable, load_gsm8k, why_not_loaded
from sglang_kimi.launcher.checks import free_port


@pytest.fixture
def no_proxy(monkeypatch):
    for name in hub_data.PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def test_a_listening_host_is_reachable_and_a_closed_port_is_not(no_proxy):
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        assert hub_reachable(f"http://127.0.0.1:{server.getsockname()[1]}")
    assert not hub_reachable(f"http://127.0.0.1:{free_port()}")


def test_behind_a_proxy_the_host_is_not_probed(monkeypatch, no_proxy):
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.invalid:3128")
    assert hub_reachable(f"http://127.0.0.1:{free_port()}")


def offline_flags() -> tuple[bool, bool]:
    return constants.HF_HUB_OFFLINE, datasets.config.HF_HUB_OFFLINE


@pytest.fixture
def recorded_loads(monkeypatch, no_proxy):
    """``datasets.load_dataset`` recording the hub libraries' offline flags at each call."""
    calls = []

    def load_dataset(*args, split=None, **kwargs):
        calls.append((args, split, offline_flags()))
        if getattr(load_dataset, "cached", True):
            return ["question"]
        raise FileNotFoundError("Dataset openai/gsm8k is not cached")

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    return load_dataset, calls


def test_unreachable_hub_loads_from_the_cache_only(monkeypatch, recorded_loads):
    _, calls = recorded_loads
    monkeypatch.setattr(hub_data, "hub_endpoint", lambda: f"http://127.0.0.1:{free_port()}")
    before = offline_flags()
    assert load_gsm8k("test") == ["question"]
    assert calls == [(("openai/gsm8k", "main"), "test", (True, True))]
    assert offline_flags() == before  # restored


def test_unreachable_hub_without_a_cached_copy_names_the_host(monkeypatch, recorded_loads):
    load_dataset, _ = recorded_loads
    load_dataset.cached = False
    endpoint = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setattr(hub_data, "hub_endpoint", lambda: endpoint)
    before = offline_flags()
    with pytest.raises(HubUnreachable) as info:
        load_gsm8k()
    assert why_not_loaded(info.value) == f"{endpoint} cannot be reached from here and openai/gsm8k is not cached"
    assert offline_flags() == before


def test_a_reachable_hub_is_asked(monkeypatch, recorded_loads):
    _, calls = recorded_loads
    monkeypatch.setattr(hub_data, "hub_reachable", lambda endpoint: True)
    before = offline_flags()
    assert load_gsm8k("train") == ["question"]
    assert calls == [(("openai/gsm8k", "main"), "train", before)]


def test_other_failures_are_named_by_type():
    assert why_not_loaded(ConnectionError("a long\nmulti-line message")) == "ConnectionError"
