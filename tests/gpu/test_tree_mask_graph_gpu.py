"""SGLang's Triton extend-attention kernel (its ``triton`` backend's TARGET_VERIFY) in a CUDA graph, as SGLang captures
the target's verify: captured with the verify-mask buffer, every replay reads the tree mask copied to the buffer's
front (what the ``dflash-tree-verify-graph-mask`` registration arranges for the DFLASH tree worker); captured with
no mask (SGLang's capture for DFLASH chains on this backend), a replay attends causally whatever tree the step has.

Skipped, with the reason, where there is no CUDA device. Run with ``pytest tests/gpu -q``.
"""

from __future__ import annotations

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("no CUDA device (torch.cuda.is_available() is False)", allow_module_level=True)

from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd  # noqa: E402
from support.tree_attention import SCALE, random_trees, reference, verify_batch  # noqa: E402

from sglang_kimi.speculative.workers.tree_verify_inputs import tree_mask_capacity, write_tree_mask  # noqa: E402

pytestmark = pytest.mark.gpu
DEV = torch.device("cuda")
N, CONTEXT_LEN = 9, 64  # the captured window (budget 8) and the context SGLang sizes the mask buffer for
STEPS = [[7, 12, 3], [20, 1, 40], [33, 5, 2]]  # the committed lengths of a batch of 3 at three decode steps


class CapturedVerify:
    """The kernel's inputs as static buffers (SGLang's graph buffers), one graph captured over them."""

    def __init__(self, batch: int, with_mask: bool):
        gen = torch.Generator().manual_seed(0)
        first = verify_batch(STEPS[0], N, gen, DEV)
        slots = batch * (CONTEXT_LEN + N)
        self.static = {
            "q": first["q"].clone(),
            "k_extend": first["k_extend"].clone(),
            "v_extend": first["v_extend"].clone(),
            "k_buffer": torch.zeros(slots, *first["k_buffer"].shape[1:], device=DEV),
            "v_buffer": torch.zeros(slots, *first["v_buffer"].shape[1:], device=DEV),
            "qo_indptr": first["qo_indptr"].clone(),
            "kv_indptr": first["kv_indptr"].clone(),
            "kv_indices": torch.zeros(batch * CONTEXT_LEN, dtype=torch.int64, device=DEV),
            "mask_indptr": first["mask_indptr"].clone(),
        }
        # SGLang's verify-mask buffer: uint8, per request N * (context + N), whatever an earlier step left in it
        self.mask = torch.randint(0, 2, (batch * N * (CONTEXT_LEN + N),), dtype=torch.uint8, device=DEV)
        self.with_mask = with_mask
        self.out = torch.empty(batch * N, first["q"].shape[1], first["v_buffer"].shape[-1], device=DEV)
        self.load(first, random_trees(gen, batch, N).ancestor_mask().to(DEV), STEPS[0])
        self._run()  # compiles outside the capture
        torch.cuda.synchronize()
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self._run()

    def _run(self):
        s = self.static
        extend_attention_fwd(
            s["q"], s["k_extend"], s["v_extend"], self.out, s["k_buffer"], s["v_buffer"], s["qo_indptr"],
            s["kv_indptr"], s["kv_indices"], self.mask if self.with_mask else None, True, s["mask_indptr"], N, 1.0,
            1.0, sm_scale=SCALE,
        )  # fmt: skip

    def load(self, arrays: dict, ancestor: torch.Tensor, prefix_lens: list[int]):
        """What a replay's preparation does: the step's inputs into the static buffers, its tree blocks in place."""
        for name, value in arrays.items():
            self.static[name][: value.shape[0]].copy_(value)
        host_bound = torch.tensor(prefix_lens) + 2 * N  # the reserved lengths, an upper bound
        capacity = tree_mask_capacity(int(host_bound.sum()), len(prefix_lens), N, CONTEXT_LEN)
        write_tree_mask(self.mask[:capacity], ancestor, torch.tensor(prefix_lens, device=DEV))

    def replay(self, step: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        prefix_lens = STEPS[step]
        arrays = verify_batch(prefix_lens, N, gen, DEV)
        ancestor = random_trees(gen, len(prefix_lens), N).ancestor_mask().to(DEV)  # [B, N, N]
        self.load(arrays, ancestor, prefix_lens)
        self.graph.replay()
        torch.cuda.synchronize()
        return self.out.cpu(), reference(arrays, prefix_lens, ancestor)


def test_replays_read_the_tree_mask_of_each_step():
    captured = CapturedVerify(len(STEPS[0]), with_mask=True)
    for step in range(len(STEPS)):
        out, ref = captured.replay(step, torch.Generator().manual_seed(10 + step))
        assert (out - ref).abs().max().item() < 1e-2, f"step {step}"  # float32 inputs, TF32 dot products


def test_a_graph_captured_without_the_mask_attends_causally():
    """SGLang's DFLASH chain capture on triton: the tree's mask never reaches the kernel."""
    captured = CapturedVerify(len(STEPS[0]), with_mask=False)
    out, ref = captured.replay(1, torch.Generator().manual_seed(11))
    assert (out - ref).abs().max().item() > 5e-2
