"""Independent oracles for the speculators tests: plain-Python tree walks, DDTree by brute force and by a heap,
SGLang's own speculative code loaded from its installed source, and a chi-square p-value."""

from __future__ import annotations

import ast
import functools
import importlib.util
import pathlib
from collections.abc import Sequence

import numpy as np
import pytest
import torch

from sglang_kimi.speculators.trees import DraftTree


@pytest.fixture(autouse=True, scope="module")
def single_thread():
    """These tests run many tiny ops, where waking torch's CPU thread pool costs more than the work itself."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# --------------------------------------------------------------------------------------------------------------
# Plain-Python views of a DraftTree


def tree_lists(tree: DraftTree, b: int) -> tuple[list[int], list[int]]:
    """(tokens, parents) of request b's real nodes, as Python lists."""
    n = int(tree.num_nodes[b])
    return tree.tokens[b, :n].tolist(), tree.parents[b, :n].tolist()


def path_to_root(parents: list[int], i: int) -> list[int]:
    """[i, parent(i), ..., 0]."""
    path = [i]
    while parents[path[-1]] >= 0:
        path.append(parents[path[-1]])
    return path


def children_of(parents: list[int]) -> list[list[int]]:
    kids: list[list[int]] = [[] for _ in parents]
    for i, p in enumerate(parents):
        if p >= 0:
            kids[p].append(i)
    return kids


def random_tree(gen: torch.Generator, batch: int, slots: int, vocab: int, min_nodes: int = 1) -> DraftTree:
    """B random trees: node i's parent uniform in [0, i), tokens uniform, num_nodes uniform in [min_nodes, N]."""
    num_nodes = torch.randint(min_nodes, slots + 1, (batch,), generator=gen)
    parents = (torch.rand((batch, slots), generator=gen) * torch.arange(slots)).long()
    parents[:, 0] = -1
    tokens = torch.randint(0, vocab, (batch, slots), generator=gen)
    return DraftTree.from_parents(tokens, parents, num_nodes)


# --------------------------------------------------------------------------------------------------------------
# DDTree oracles. Scores are float32 sums accumulated root to leaf, as build_ddtree computes them.


def _ranked(lp: np.ndarray) -> list[list[int]]:
    """Per depth, token ids by log-prob descending then id ascending."""
    return [sorted(range(lp.shape[1]), key=lambda t: (-lp[d, t], t)) for d in range(lp.shape[0])]


def ddtree_brute_force(root: int, logits: torch.Tensor, budget: int) -> tuple[list[int], list[int], list[int]]:
    """Enumerate every prefix of logits [L, V], sort them all by the documented order, keep the best ``budget``.

    Order: score desc, depth asc, then the parents compared by this same order, then the last token's rank.
    Returns (tokens, parents, depths) with the root first.
    """
    # log q = logit - logsumexp, the float32 values rank_draft_logits produces (log_softmax may round differently)
    lp = (logits.float() - torch.logsumexp(logits.float(), dim=-1, keepdim=True)).numpy()
    length, vocab = lp.shape
    rank = [{t: r for r, t in enumerate(order)} for order in _ranked(lp)]
    score = {(): np.float32(0)}
    frontier: list[tuple[int, ...]] = [()]
    for d in range(length):
        frontier = [p + (t,) for p in frontier for t in range(vocab)]
        for p in frontier:
            score[p] = np.float32(score[p[:-1]] + lp[d, p[-1]])

    def compare(a: tuple[int, ...], b: tuple[int, ...]) -> int:
        key_a, key_b = (-score[a], len(a)), (-score[b], len(b))
        if key_a != key_b:
            return -1 if key_a < key_b else 1
        if a[:-1] != b[:-1]:
            return compare(a[:-1], b[:-1])
        ra, rb = rank[len(a) - 1][a[-1]], rank[len(b) - 1][b[-1]]
        return (ra > rb) - (ra < rb)

    chosen = sorted((p for p in score if p), key=functools.cmp_to_key(compare))[:budget]
    index = {(): 0} | {p: i + 1 for i, p in enumerate(chosen)}
    return (
        [root] + [p[-1] for p in chosen],
        [-1] + [index[p[:-1]] for p in chosen],
        [0] + [len(p) for p in chosen],
    )


# --------------------------------------------------------------------------------------------------------------
# SGLang's own code, compiled from the installed source file without importing the module (its imports pull
# in CUDA-only packages). Functions decorated with @triton.jit run under the Triton interpreter on CPU.

SGLANG_ROOT = pathlib.Path(importlib.util.find_spec("sglang").submodule_search_locations[0])


def load_sglang(relpath: str, names: Sequence[str], namespace: dict) -> dict:
    from triton.runtime.interpreter import InterpretedFunction

    path = SGLANG_ROOT / relpath
    found = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in names:
            jit = any("jit" in ast.unparse(d) for d in node.decorator_list)
            node.decorator_list = []
            exec(compile(ast.Module(body=[node], type_ignores=[]), str(path), "exec"), namespace)
            if jit:
                namespace[node.name] = InterpretedFunction(namespace[node.name])
            found[node.name] = namespace[node.name]
    missing = set(names) - set(found)
    assert not missing, f"{missing} not found in {path}"
    return found


@functools.cache
def sglang_speculative() -> dict:
    """SGLang 0.5.23's EAGLE selection, tree build and greedy tree verify, runnable on CPU."""
    import enum

    import triton
    import triton.language as tl

    # compile() inherits this module's `from __future__ import annotations`: SGLang's annotations stay strings
    namespace = {"torch": torch, "triton": triton, "tl": tl, "IntEnum": enum.IntEnum}
    namespace["maybe_detect_oob"] = lambda *args, **kwargs: None
    fns = {}
    fns |= load_sglang("srt/utils/common.py", ["fast_topk"], namespace)
    fns |= load_sglang(
        "srt/speculative/spec_utils.py",
        ["_select_top_k_tokens_first", "_select_top_k_tokens_later", "select_top_k_tokens"],
        namespace,
    )
    fns |= load_sglang("srt/speculative/eagle_utils.py", ["organize_draft_results"], namespace)
    fns |= load_sglang(
        "kernels/ops/speculative/spec_tree.py",
        [
            "TreeMaskMode",
            "sgl_build_tree_kernel_efficient_triton",
            "sgl_build_tree_kernel_triton",
            "verify_tree_greedy_kernel_triton",
            "verify_tree_greedy_triton",
        ],
        namespace,
    )
    fns |= load_sglang("srt/layers/sampler.py", ["top_k_top_p_min_p_sampling_from_probs_torch"], namespace)
    return fns


def repeated_tree(tree: DraftTree, n: int) -> DraftTree:
    """One tree (batch 1) as a batch of n copies, without copying (expanded views)."""
    return DraftTree(
        tree.tokens.expand(n, -1),
        tree.parents.expand(n, -1),
        tree.depths.expand(n, -1),
        tree.num_nodes.expand(n),
        tree.max_depth,
    )
