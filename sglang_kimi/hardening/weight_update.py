"""A failed ``/update_weights_from_disk`` leaves the server serving its checkpoint instead of ending it.

SGLang's weight updater (``WeightUpdater.update_weights_from_disk``, the same in 0.5.20 to 0.5.23) records the new
path in the model config before it loads anything. When the load fails partway (a checkpoint of another model, a
drafter's say, whose names the target lacks; a truncated file), its rollback reads "the original weights" from that
recorded path, which is the new one: the same error is raised again, out of the scheduler, and the server dies with
part of the new weights loaded.

An update refused before anything loads (a path that holds no checkpoint) also leaves the new path recorded, so the
next failed update's rollback, and the plugin's below, would read it.

The AROUND hook keeps the path and load format being served, and records that path again after a failed update. If
the update raises, it loads that checkpoint again and answers the update as failed, with the update's own error:
the server goes on serving the weights it served before (HTTP 400 for the request). If the served checkpoint cannot
be loaded again either, the weights are a mix of two checkpoints, and the error is raised as SGLang raised it: a
server must not serve such a model.

An update sent as soon as the last request's answer arrived could also fail after loading. The tokenizer sends it
once no request holds its model-update lock, but the scheduler keeps the batch whose requests just finished as its
running and last batch until its next loop iteration, and a flush before then finds it "not idle". SGLang 0.5.22+
then answers 400 ("Weights were updated, but the cache was not flushed"): the new weights serve with the old
weights' prefix cache, and the tokenizer still records the old path; 0.5.20 asserts in the scheduler, which
ends the server. Inside that lock, the AROUND hook on the tokenizer's dispatch first asks the scheduler for SGLang's
waiting flush (``/flush_cache?timeout``), which answers once the scheduler has retired that batch, then sends the
update. A paused engine is left to SGLang: its paused requests are the ones the update is meant to run beside.
"""

from __future__ import annotations

import logging
import os

from sglang_kimi.hooks import hook

logger = logging.getLogger("sglang_kimi")

# How long the update waits for the scheduler to retire finished batches: one loop iteration when the lock is held
# (a verify step on a loaded CPU is under a second); longer means requests the lock does not cover are running.
IDLE_WAIT_S = 30.0


def update_weights_from_disk(original, updater, model_path, load_format, *args, **kwargs):
    """AROUND ``WeightUpdater.update_weights_from_disk``: returns SGLang's ``(success, message)``."""
    served_path = updater.model_config.model_path
    served_format = getattr(getattr(updater.get_model_runner(), "load_config", None), "load_format", None)
    try:
        success, message = original(updater, model_path, load_format, *args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - SGLang's rollback raised: reload what was served
        cause = exc.__context__ or exc  # the update's own error (exc: the same one, raised again by the rollback)
        error = f"{type(cause).__name__}: {cause}"
        logger.error(
            "sglang-kimi: updating the weights from %s failed (%s); loading the served weights from %s again",
            model_path,
            error,
            served_path,
        )
        updater.model_config.model_path = served_path
        try:
            restored, reason = original(updater, served_path, served_format, *args, **kwargs)
        except Exception as again:  # noqa: BLE001 - reported below, with the update's error
            restored, reason = False, again
        if not restored:
            raise RuntimeError(
                f"updating the weights from {model_path} failed ({error}), and the served weights from {served_path} "
                f"could not be loaded again ({reason}): the model holds parts of both"
            ) from exc
        return False, (
            f"Failed to update weights from {model_path}: {error}. The served weights ({served_path}) were loaded "
            "again and are served unchanged."
        )
    if not success:  # refused before loading (no such checkpoint): SGLang leaves the new path recorded
        updater.model_config.model_path = served_path
        if not os.path.isdir(os.path.expanduser(model_path)):  # SGLang's message is the hub's, about a repo id
            message = (
                f"{message} ({model_path!r} is not a folder on the server: give a checkpoint folder's path, relative "
                f"paths resolve against the server's working directory {os.getcwd()})"
            )
    return success, message


async def update_once_idle(original, tokenizer_manager, obj, *args, **kwargs):
    """AROUND ``TokenizerManager._wait_for_model_update_from_disk(self, obj)``, called inside the model-update lock."""
    if getattr(obj, "flush_cache", True) and not tokenizer_manager.is_pause:
        flushed = await tokenizer_manager.flush_cache(timeout_s=IDLE_WAIT_S)
        if not flushed.success:  # the update goes on: SGLang's own answer tells what is still running
            logger.warning(
                "sglang-kimi: the scheduler was not idle %.0f s into a weight update (%s); updating anyway",
                IDLE_WAIT_S,
                getattr(flushed, "message", "") or "requests running",
            )
    return await original(tokenizer_manager, obj, *args, **kwargs)


def install_weight_update_rollback(target: str):
    hook(target, update_weights_from_disk, "AROUND")


def install_weight_update_idle_wait(target: str):
    hook(target, update_once_idle, "AROUND")
