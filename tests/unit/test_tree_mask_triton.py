"""The DFLASH tree verify's FULL_MASK (``workers.tree_verify_inputs.write_tree_mask``) as SGLang's ``triton``
attention backend reads it: SGLang's Triton extend-attention kernel (the one its TARGET_VERIFY runs on a GPU) over a
batch of trees, on CPU tensors through Triton's interpreter, against attention with each node seeing the prefix and
its ancestors. Only the tree blocks are written: the buffers start stale (random cells), as a reused buffer is, and
the kernel reads the prefix as visible without reading its cells.

On a GPU SGLang's overlap scheduler gives the worker no host copy of the lengths with that backend, only an upper
bound (the reserved KV lengths), while the kernel lays the mask out from the device lengths. The cases therefore
build the mask from the device lengths with a capacity from a larger bound, and check that a mask laid out from
the bound instead (what the worker once built) gives other outputs. Triton must be in interpreter mode before its
first import, so the cases run in a child process; in the parent one test runs that child.
"""

from __future__ import annotations

import pytest
import torch

from sglang_kimi.kernels.interpret import interpreter_active, interpreter_imports

pytestmark = pytest.mark.interpreted_sglang_child


with interpreter_imports():
    from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd

from support.tree_attention import SCALE, random_trees, reference, verify_batch  # noqa: E402

from sglang_kimi.speculative.workers.tree_verify_inputs import write_tree_mask  # noqa: E402

assert interpreter_active(), "the child process must run Triton's interpreter"


def written(ancestor: torch.Tensor, lens: list[int], capacity: int, gen) -> torch.Tensor:
    """A stale buffer of ``capacity`` cells with the trees' blocks written, laid out from ``lens``."""
    buffer = torch.randint(0, 2, (capacity,), dtype=torch.uint8, generator=gen)
    write_tree_mask(buffer, ancestor, torch.tensor(lens))
    return buffer


def attention(prefix_lens: list[int], ancestor: torch.Tensor, mask: torch.Tensor, gen) -> tuple:
    """SGLang's kernel with ``mask``, and the reference; the verify batch laid out as the triton backend does."""
    batch, n, _ = ancestor.shape
    a = verify_batch(prefix_lens, n, gen)
    out = torch.empty(batch * n, a["q"].shape[1], a["v_buffer"].shape[-1])
    extend_attention_fwd(
        a["q"], a["k_extend"], a["v_extend"], out, a["k_buffer"], a["v_buffer"], a["qo_indptr"], a["kv_indptr"],
        a["kv_indices"], mask, True, a["mask_indptr"], n, 1.0, 1.0, sm_scale=SCALE,
    )  # fmt: skip
    return out, reference(a, prefix_lens, ancestor)


@pytest.mark.parametrize(
    "prefix_lens,n,slack",
    [([7, 12, 3], 5, [0, 0, 0]), ([7, 12, 3], 5, [18, 18, 18]), ([1, 30], 9, [4, 0]), ([20], 8, [16])],
)
def test_mask_from_the_device_lengths(prefix_lens, n, slack):
    gen = torch.Generator().manual_seed(sum(prefix_lens) + n)
    tree = random_trees(gen, len(prefix_lens), n)
    ancestor = tree.ancestor_mask()  # [B, N, N]
    bound = [p + s for p, s in zip(prefix_lens, slack)]  # the host's upper bound of the lengths
    mask = written(ancestor, prefix_lens, n * (sum(bound) + len(bound) * n), gen)
    out, ref = attention(prefix_lens, ancestor, mask, gen)
    assert (out - ref).abs().max().item() < 1e-4  # float32 softmax over at most 40 keys
    if any(slack):  # laid out from the bound, the rows land on other requests' and the prefix's columns
        gen = torch.Generator().manual_seed(sum(prefix_lens) + n)
        random_trees(gen, len(prefix_lens), n)
        stale = written(ancestor, bound, n * (sum(bound) + len(bound) * n), gen)
        out, ref = attention(prefix_lens, ancestor, stale, gen)
        assert (out - ref).abs().max().item() > 1e-2


def test_only_the_tree_blocks_are_written():
    gen = torch.Generator().manual_seed(5)
    ancestor = random_trees(gen, 2, 4).ancestor_mask()
    zeros, ones = torch.zeros(500, dtype=torch.bool), torch.ones(500, dtype=torch.bool)
    for buffer in (zeros, ones):
        write_tree_mask(buffer, ancestor, torch.tensor([3, 6]))
    written = zeros != ones  # a cell that differs kept what each buffer held: not written
    assert int((~written).sum()) == 2 * 4 * 4  # the two 4 x 4 tree blocks, nothing else


def test_mask_written_into_a_graph_replay_buffer():
    """Under CUDA graphs the captured kernel reads SGLang's verify-mask buffer (uint8, sized for the captured
    batch at full context, holding an earlier step's values); the step writes its tree blocks into it in place.
    The capacity is clipped at a batch of full contexts when the host bound runs past the context's end."""
    from sglang_kimi.speculative.workers.tree_verify_inputs import tree_mask_capacity

    gen = torch.Generator().manual_seed(11)
    prefix_lens, n, context_len, max_bs = [14, 5, 9], 6, 16, 4
    tree = random_trees(gen, len(prefix_lens), n)
    ancestor = tree.ancestor_mask()  # [B, N, N]
    host_bound = torch.tensor(prefix_lens) + 2 * 8  # reserved lengths: past the context for the first request
    capacity = tree_mask_capacity(int(host_bound.sum()), len(prefix_lens), n, context_len)
    assert capacity == len(prefix_lens) * n * (context_len + n) < n * (int(host_bound.sum()) + len(prefix_lens) * n)
    buffer = torch.randint(0, 2, (max_bs * n * (context_len + n),), dtype=torch.uint8, generator=gen)  # stale
    write_tree_mask(buffer[:capacity], ancestor, torch.tensor(prefix_lens))
    out, ref = attention(prefix_lens, ancestor, buffer, gen)
    assert (out - ref).abs().max().item() < 1e-4
