"""Which worker serves a speculative algorithm: DFLASH with ``--speculative-dflash-tree-budget`` or
``--speculative-kimi-adaptive`` runs the plugin's DDTree worker; everything else keeps SGLang's own choice."""

from __future__ import annotations

from sglang_kimi.hooks import hook
from sglang_kimi.settings import plugin_args


def _create_worker(original, algorithm, server_args):
    args = plugin_args(server_args)
    if algorithm.is_dflash() and (args.dflash_tree_budget is not None or args.adaptive):
        from sglang_kimi.speculative.workers.dflash_tree import DFlashTreeWorker

        return DFlashTreeWorker
    return original(algorithm, server_args)


def install_worker_selection(target: str):
    hook(target, _create_worker, "AROUND")
