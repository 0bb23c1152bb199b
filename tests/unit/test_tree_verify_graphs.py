"""The DFLASH tree worker under CUDA graphs (``speculative/workers/tree_verify_graphs.py``,
``DFlashTreeWorker.init_cuda_graphs``):
SGLang's capture of the DFLASH verify graph takes the tree mask when the tree worker serves, and a start-up whose
target graphs lack it is refused; the drafter is not captured (it runs the block eager, at another width than the
verify window SGLang captures it for).

These run SGLang's own capture-time code (``DecodeCudaGraphRunner.get_spec_info``, the mask policy) on CPU with
stand-in runners; the graphs themselves need a CUDA device. SGLang's modules need the CPU import shims, so the
tests run in the session's CPU SGLang child process (``cpu_sglang_child``).
"""

from __future__ import annotations

import os

CHILD_ENV = "SGLANG_KIMI_TREE_VERIFY_GRAPHS_CHILD"

if os.environ.get(CHILD_ENV) != "1":

    def test_tree_verify_graphs_in_a_cpu_sglang_process(cpu_sglang_child):
        cpu_sglang_child.check(__file__)

else:
    import functools
    from types import SimpleNamespace as NS

    import pytest
    import torch
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend
    from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner
    from sglang.srt.speculative import dflash_utils
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    from sglang_kimi.speculative.workers import tree_verify_graphs as tvg

    @pytest.fixture
    def policy_hooked(monkeypatch):
        """SGLang's mask policy with the plugin's AROUND hook applied, as the hook registry applies it in a server; the
        tree worker not yet built."""
        monkeypatch.setattr(tvg, "_tree_verify_in_process", False)
        hooked = functools.partial(tvg._mask_policy, dflash_utils.resolve_dflash_verify_mask_policy)
        monkeypatch.setattr(dflash_utils, "resolve_dflash_verify_mask_policy", hooked)

    def triton_backend():
        return object.__new__(TritonAttnBackend)  # the policy reads the backend's type only

    def capture_spec_info(is_draft_worker: bool = False):
        """What SGLang's decode graph runner hands the model at capture for a DFLASH target verify of width 9."""
        runner = NS(
            model_runner=NS(
                spec_algorithm=SpeculativeAlgorithm.DFLASH,
                attn_backend=triton_backend(),
                is_draft_worker=is_draft_worker,
            ),
            captured_req_width=9,
            buffers=NS(custom_mask=torch.ones(64, dtype=torch.bool)),
            _capture_ragged_verify_layout=lambda num_tokens: None,
        )
        return DecodeCudaGraphRunner.get_spec_info(runner, 9 * 4), runner.buffers.custom_mask

    def test_sglang_captures_dflash_chains_causally_on_triton(policy_hooked):
        spec_info, _ = capture_spec_info()
        assert spec_info.custom_mask is None  # the captured kernel ignores any mask a replay brings

    def test_the_tree_worker_makes_the_capture_take_the_mask(policy_hooked):
        tvg.mark_tree_verify()
        spec_info, buffer = capture_spec_info()
        assert spec_info.custom_mask is buffer and spec_info.draft_token_num == 9
        drafter_info, _ = capture_spec_info(is_draft_worker=True)
        assert drafter_info.custom_mask is None  # the drafter's non-causal block keeps SGLang's capture

    def test_target_graphs_without_the_mask_are_refused(policy_hooked):
        eager = NS(decode_cuda_graph_runner=None, attn_backend=triton_backend())
        graphs = NS(decode_cuda_graph_runner=object(), attn_backend=triton_backend())
        tvg.check_target_graphs(eager)  # no graphs: nothing replays
        with pytest.raises(RuntimeError, match="--cuda-graph-backend-decode disabled") as refused:
            tvg.check_target_graphs(graphs)
        assert "TritonAttnBackend" in str(refused.value) and "dflash-tree-verify-graph-mask" in str(refused.value)
        tvg.mark_tree_verify()
        tvg.check_target_graphs(graphs)

    def test_the_drafter_is_not_captured(monkeypatch, policy_hooked):
        """SGLang's set-up runs as it is (its memory checks, its draft scopes) with the drafter's capture turned off;
        then the target's graphs are checked."""
        from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2

        from sglang_kimi.speculative.workers.dflash_tree import DFlashTreeWorker

        captured = []

        class Drafter:
            def init_cuda_graphs(self, capture_decode_cuda_graph: bool = True):
                captured.append(capture_decode_cuda_graph)

        def sglang_setup(self):  # what DFlashWorkerV2.init_cuda_graphs does with the drafter on a GPU
            assert self._maybe_build_draft_sampler() is None
            self._draft_worker.init_cuda_graphs(capture_decode_cuda_graph=True)

        monkeypatch.setattr(DFlashWorkerV2, "init_cuda_graphs", sglang_setup)
        worker = object.__new__(DFlashTreeWorker)
        drafter = Drafter()
        target = NS(model_runner=NS(decode_cuda_graph_runner=object(), attn_backend=triton_backend()))
        vars(worker).update(_draft_worker=drafter, _target_worker=target, _adaptive_pending=False)
        monkeypatch.setattr(DFlashTreeWorker, "target_worker", property(lambda self: target), raising=False)
        with pytest.raises(RuntimeError, match="causal chain verify"):
            worker.init_cuda_graphs()  # the tree worker not marked: the target's graphs are refused
        assert captured == [False] and "init_cuda_graphs" not in vars(drafter)
        tvg.mark_tree_verify()
        worker.init_cuda_graphs()
        assert captured == [False, False]
