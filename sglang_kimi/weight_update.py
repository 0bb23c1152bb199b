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
"""

from __future__ import annotations

import logging

from sglang_kimi.hooks import hook

logger = logging.getLogger("sglang_kimi")


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
    return success, message


def install_weight_update_rollback(target: str):
    hook(target, update_weights_from_disk, "AROUND")
