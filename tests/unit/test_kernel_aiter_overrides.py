"""AITER environment overrides: only on ROCm, never over the user's value, reported for `doctor`."""

from __future__ import annotations

import sys

import pytest

from sglang_kimi.kernels import aiter_overrides as ao


@pytest.fixture(autouse=True)
def fresh_state():
    ao.APPLIED.clear()
    yield
    ao.APPLIED.clear()


def test_not_rocm_changes_nothing():
    env = {}
    assert "not ROCm" in ao.apply_aiter_env(env, is_rocm=False)
    assert env == {}
    assert ao.aiter_override_state()[0]["active"] is False


def test_rocm_sets_every_override_the_user_did_not_set(monkeypatch):
    monkeypatch.delitem(sys.modules, "aiter", raising=False)
    env = {"FLYDSL_MOE_STAGE1_SCHED": "1"}  # the user's own choice
    assert ao.apply_aiter_env(env, is_rocm=True) is None
    assert env == {"AITER_FLYDSL_STAGE2_TILE_K": "256", "FLYDSL_MOE_STAGE1_SCHED": "1"}
    state = {row["name"]: row for row in ao.aiter_override_state()}
    assert state["AITER_FLYDSL_STAGE2_TILE_K"]["set_by"] == "plugin"
    assert state["AITER_FLYDSL_STAGE2_TILE_K"]["note"] == ""
    assert state["FLYDSL_MOE_STAGE1_SCHED"] == {
        **state["FLYDSL_MOE_STAGE1_SCHED"],
        "set_by": "user",
        "value": "1",
    }
    assert all(row["active"] and row["why"] for row in state.values())


def test_can_be_disabled():
    env = {ao.DISABLE_ENV: "0"}
    assert "disabled" in ao.apply_aiter_env(env, is_rocm=True)
    assert set(env) == {ao.DISABLE_ENV}


def test_late_application_is_recorded(monkeypatch):
    monkeypatch.setitem(sys.modules, "aiter", object())
    env = {}
    assert ao.apply_aiter_env(env, is_rocm=True) is None
    assert all("after aiter was imported" in row["note"] for row in ao.aiter_override_state())


def test_defaults_read_torch_and_os_environ(monkeypatch):
    fake_environ = {}
    monkeypatch.setattr(ao.os, "environ", fake_environ)  # restored after the test
    monkeypatch.setattr(ao, "_is_rocm", lambda: True)
    assert ao.apply_aiter_env() is None
    assert fake_environ == {o.name: o.value for o in ao.AITER_ENV_OVERRIDES}
    monkeypatch.setattr(ao, "_is_rocm", lambda: False)
    ao.APPLIED.clear()
    assert ao.apply_aiter_env() is not None
