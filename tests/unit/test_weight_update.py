"""The rollback of a failed ``/update_weights_from_disk`` (``sglang_kimi/weight_update.py``), around a stand-in for
SGLang's updater that behaves as SGLang's does: it records the new path first, and its rollback reads that path."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from sglang_kimi.weight_update import update_weights_from_disk

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
    assert update(updater, "/models/missing") == (False, "Failed to get weights iterator: no checkpoint")
    assert updater.model_config.model_path == SERVED
    success, _ = update(updater, OTHER)
    assert not success and updater.weights == SERVED and updater.model_config.model_path == SERVED


@pytest.mark.parametrize("served", ["lost", "broken"])
def test_a_served_checkpoint_that_cannot_be_reloaded_is_an_error(served):
    updater = Updater(
        broken={OTHER} | ({SERVED} if served == "broken" else set()), lost={SERVED} if served == "lost" else ()
    )
    with pytest.raises(RuntimeError, match="the model holds parts of both") as raised:
        update(updater, OTHER)
    assert OTHER in str(raised.value) and SERVED in str(raised.value)
