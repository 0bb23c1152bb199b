"""``sglang_kimi/hardening/weight_update.py`` around stand-ins that behave as SGLang's do: the rollback of a failed
``/update_weights_from_disk`` (the updater records the new path first, and its rollback reads that path), and the
wait for the scheduler to retire the batch whose requests just finished before the update is sent."""

from __future__ import annotations

import asyncio
import logging
import os
from types import SimpleNamespace

import pytest

from sglang_kimi.hardening import weight_update
from sglang_kimi.hardening.weight_update import update_once_idle, update_weights_from_disk

SERVED, OTHER = "/models/served", "/models/drafter"


class Updater:
    """Loads a checkpoint by path; ``broken`` paths fail partway, ``lost`` ones cannot be read at all."""

    def __init__(self, broken=(), lost=()):
        self.model_config = SimpleNamespace(model_path=SERVED)
        self.runner = SimpleNamespace(load_config=SimpleNamespace(load_format="safetensors"))
        self.broken, self.lost = set(broken), set(lost)
        self.weights, self.calls = SERVED, []

    def get_model_runner(self):
        return self.runner

    def sglang_update(self, model_path, load_format, recapture_cuda_graph=False):
        """SGLang 0.5.23's steps: record the path, load, on failure 'roll back' from the recorded path."""
        self.calls.append((model_path, load_format, recapture_cuda_graph))
        self.model_config.model_path = model_path
        if model_path in self.lost:
            return False, "Failed to get weights iterator: no checkpoint"  # the new path stays recorded
        try:
            self._load(model_path)
        except Exception:
            self._load(self.model_config.model_path)  # the rollback reads the new path again
            return False, "Rolling back to original weights."
        return True, "Succeeded to update model weights."

    def _load(self, path):
        if path in self.lost:
            raise FileNotFoundError(path)
        if path in self.broken:
            self.weights = f"part of {path}"
            raise KeyError("layers.0.mlp.gate_up_proj.weight")
        self.weights = path


def update(updater, path):
    return update_weights_from_disk(
        lambda u, *args, **kwargs: u.sglang_update(*args, **kwargs), updater, path, None, recapture_cuda_graph=True
    )


def test_a_good_update_is_sglang_s():
    updater = Updater()
    assert update(updater, OTHER) == (True, "Succeeded to update model weights.")
    assert updater.weights == OTHER and updater.model_config.model_path == OTHER


def test_a_failed_update_loads_the_served_checkpoint_again():
    updater = Updater(broken={OTHER})
    with pytest.raises(KeyError):
        updater.sglang_update(OTHER, None)  # SGLang alone: the error escapes, the weights half replaced
    updater = Updater(broken={OTHER})
    success, message = update(updater, OTHER)
    assert not success
    assert OTHER in message and "KeyError: 'layers.0.mlp.gate_up_proj.weight'" in message and SERVED in message
    assert updater.weights == SERVED and updater.model_config.model_path == SERVED
    assert updater.calls[-1] == (SERVED, "safetensors", True)  # the served format, the caller's other arguments


def test_a_refused_update_leaves_the_served_path_recorded():
    """SGLang records the path of an update it refuses before loading: the next failed update's rollback read it."""
    updater = Updater(broken={OTHER}, lost={"/models/missing"})
    success, message = update(updater, "/models/missing")
    assert not success and message.startswith("Failed to get weights iterator: no checkpoint")
    assert "'/models/missing' is not a folder on the server" in message and os.getcwd() in message
    assert updater.model_config.model_path == SERVED
    success, _ = update(updater, OTHER)
    assert not success and updater.weights == SERVED and updater.model_config.model_path == SERVED


def test_an_update_to_a_file_says_a_folder_is_wanted(tmp_path):
    weights = tmp_path / "model.safetensors"  # the weights file instead of its checkpoint folder
    weights.write_bytes(b"")
    success, message = update(Updater(lost={str(weights)}), str(weights))
    assert not success and f"{str(weights)!r} is not a folder on the server" in message
    success, message = update(Updater(lost={str(tmp_path)}), str(tmp_path))  # a folder SGLang could not read
    assert not success and "is not a folder" not in message


@pytest.mark.parametrize("served", ["lost", "broken"])
def test_a_served_checkpoint_that_cannot_be_reloaded_is_an_error(served):
    updater = Updater(
        broken={OTHER} | ({SERVED} if served == "broken" else set()), lost={SERVED} if served == "lost" else ()
    )
    with pytest.raises(RuntimeError, match="the model holds parts of both") as raised:
        update(updater, OTHER)
    assert OTHER in str(raised.value) and SERVED in str(raised.value)


class Scheduler:
    """SGLang's scheduler as a weight update sees it: the batch whose requests finished last stays its running batch
    until the next loop iteration (``steps_to_idle`` of them); a flush before that is refused, and the update's flush
    after loading with it. ``flush_cache(timeout_s)`` is SGLang's waiting flush."""

    def __init__(self, steps_to_idle=1, paused=False):
        self.steps_to_idle, self.is_pause, self.events = steps_to_idle, paused, []

    async def loop(self):
        while self.steps_to_idle > 0:
            await asyncio.sleep(0.01)
            self.steps_to_idle -= 1

    async def flush_cache(self, timeout_s=None):
        self.events.append(("flush", timeout_s))
        deadline = asyncio.get_running_loop().time() + (timeout_s or 0.0)
        while self.steps_to_idle > 0 and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.005)
        return SimpleNamespace(success=self.steps_to_idle == 0, message="Timed out waiting for idle state.")

    async def sglang_update(self, manager, obj):
        """``_wait_for_model_update_from_disk``: the scheduler loads, then flushes at once (refused while not idle)."""
        self.events.append(("update", obj.model_path))
        flushed = not obj.flush_cache or self.steps_to_idle == 0
        return flushed, "Succeeded to update model weights." if flushed else "the cache was not flushed", 0


def run_update(scheduler, hooked=True, flush_cache=True):
    obj = SimpleNamespace(model_path=OTHER, flush_cache=flush_cache)

    async def main():
        loop = asyncio.create_task(scheduler.loop())
        if hooked:
            result = await update_once_idle(scheduler.sglang_update, scheduler, obj)
        else:
            result = await scheduler.sglang_update(scheduler, obj)
        await loop
        return result

    return asyncio.run(main())


def test_an_update_right_after_the_last_answer_waits_for_the_finished_batch():
    assert not run_update(Scheduler(), hooked=False)[0]  # SGLang alone: loaded, then the flush refused
    scheduler = Scheduler(steps_to_idle=3)
    assert run_update(scheduler) == (True, "Succeeded to update model weights.", 0)
    assert scheduler.events == [("flush", weight_update.IDLE_WAIT_S), ("update", OTHER)]


@pytest.mark.parametrize("field", ["paused", "no flush"])
def test_a_paused_engine_or_an_update_without_a_flush_is_sent_at_once(field):
    scheduler = Scheduler(steps_to_idle=0, paused=field == "paused")
    assert run_update(scheduler, flush_cache=field != "no flush")[0]
    assert scheduler.events == [("update", OTHER)]


def test_an_update_that_cannot_wait_is_sent_with_a_warning(monkeypatch, caplog):
    monkeypatch.setattr(weight_update, "IDLE_WAIT_S", 0.02)
    scheduler = Scheduler(steps_to_idle=50)  # requests the update's lock does not cover
    with caplog.at_level(logging.WARNING, logger="sglang_kimi"):
        success, message, _ = run_update(scheduler)
    assert scheduler.events == [("flush", 0.02), ("update", OTHER)]
    assert not success and "not idle" in caplog.text and "Timed out waiting for idle state." in caplog.text
