"""The table of ``docs/scale-out.md`` as data: each of SGLang's distributed modes by each speculative mode, and what
backs each cell.

- :class:`Tested`: the pytest node (relative to ``tests/``) that serves it on CPU with greedy parity;
- :class:`Refused`: a launch SGLang's real argument pipeline refuses, and words the refusal must hold;
- :class:`GpuOnly`: it needs a GPU (or several), and no test here serves it;
- :class:`Untested`: it could run here, and no test serves it.

``tests/unit/test_scale_out_table.py`` checks that the doc's table is :func:`render`'s and that every named test is
collected; ``tests/e2e/test_speculative_config.py`` resolves every refused launch. ``python tests/support/scale_out.py``
prints the table.
"""

from __future__ import annotations

import dataclasses

from sglang_kimi.assets import TINY_DFLASH

COLUMNS = {
    "chain": "SGLang's DFLASH chain",
    "tree": "DFLASH tree (`--speculative-dflash-tree-budget`)",
    "eagle3": "EAGLE3 tree",
    "adaptive": "adaptive DFLASH (`--speculative-kimi-adaptive`)",
}


@dataclasses.dataclass(frozen=True)
class Tested:
    test: str  # a pytest node id, relative to tests/

    def status(self) -> str:
        return "tested on CPU"


@dataclasses.dataclass(frozen=True)
class Refused:
    because: str
    argv: tuple[str, ...]  # on the tiny target with the CPU settings
    words: tuple[str, ...]

    def status(self) -> str:
        return f"refused: {self.because}"


@dataclasses.dataclass(frozen=True)
class GpuOnly:
    why: str

    def status(self) -> str:
        return f"GPU only, untested: {self.why}"


@dataclasses.dataclass(frozen=True)
class Untested:
    why: str

    def status(self) -> str:
        return f"untested: {self.why}"


_KIMI_CPU = ("--attention-backend", "kimi_cpu")
_DFLASH = ("--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", str(TINY_DFLASH), *_KIMI_CPU)
_DP_ATTENTION = ("--tp", "2", "--dp-size", "2", "--enable-dp-attention")
_A2A_REASON = "their kernels need CUDA (the verify's tokens are checked against the buffer at start-up)"
_PD_TEST = "e2e/test_disaggregation.py::test_greedy_through_prefill_and_decode_servers_equals_autoregressive"

ROWS: dict[str, dict[str, object]] = {
    "TP 2 on one node (`--tp 2`)": {
        "chain": Tested("e2e/test_parallel.py::test_tp2_greedy_equals_tp1[dflash-chain]"),
        "tree": Tested("e2e/test_parallel.py::test_tp2_greedy_equals_tp1[dflash-tree-adaptive]"),
        "eagle3": Tested("e2e/test_parallel.py::test_tp2_greedy_equals_tp1[eagle3-tree]"),
        "adaptive": Tested("e2e/test_parallel.py::test_tp2_greedy_equals_tp1[dflash-tree-adaptive]"),
    },
    "TP 2 over two nodes (`--nnodes 2`)": {
        "chain": Untested("SGLang's own worker; the tree worker's two-node test covers the launch"),
        "tree": Tested("e2e/test_parallel.py::test_two_nodes_greedy_equals_tp1[dflash-tree-adaptive]"),
        "eagle3": Tested("e2e/test_parallel.py::test_two_nodes_greedy_equals_tp1[eagle3-tree]"),
        "adaptive": Tested("e2e/test_parallel.py::test_two_nodes_greedy_equals_tp1[dflash-tree-adaptive]"),
    },
    "DP attention (`--enable-dp-attention` / `--attn-dp-size`)": {
        "chain": Refused(
            "SGLang serves DFLASH with DP attention on CUDA and NPU only (with `--enable-dp-lm-head`); GPU untested",
            (*_DFLASH, *_DP_ATTENTION),
            ("DFLASH with dp attention requires CUDA or NPU",),
        ),
        "tree": Tested("e2e/test_parallel.py::test_tp2_greedy_equals_tp1[dflash-tree-dp-attention]"),
        "eagle3": Tested("e2e/test_parallel.py::test_tp2_greedy_equals_tp1[eagle3-tree-dp-attention]"),
        "adaptive": Refused(
            "each attention group would choose its own width, and SGLang gives every group's share of the DP gather "
            "one verify window",
            (*_DFLASH, "--speculative-kimi-adaptive", *_DP_ATTENTION, "--enable-dp-lm-head"),
            ("--speculative-kimi-adaptive is not served with DP attention",),
        ),
    },
    "DP replicas in one server (`--dp-size 2`)": {
        "chain": Untested("SGLang's own worker"),
        "tree": Tested("e2e/test_parallel.py::test_dp2_dflash_tree_greedy_and_counters_of_both_ranks"),
        "eagle3": Untested("SGLang's own worker"),
        "adaptive": Untested("each rank runs its own policy; its DP report merge is unit-tested"),
    },
    "expert parallelism over an all-to-all (`--moe-a2a-backend deepep` ...)": {
        column: GpuOnly(_A2A_REASON) for column in COLUMNS
    },
    "PD disaggregation, decode side (`--disaggregation-mode`)": {
        "chain": Untested("SGLang's own worker"),
        "tree": Tested(_PD_TEST),
        "eagle3": Untested("SGLang's own worker (hidden states travel from prefill)"),
        "adaptive": Untested("the tree worker's decode side, at budgets chosen per step; no test serves it"),
    },
    "replicas behind `sglang-router`": {
        "chain": Untested("SGLang's own worker; the router sees a plain server"),
        "tree": Tested("e2e/test_router.py::test_a_mixed_load_through_the_router_is_lossless"),
        "eagle3": Tested("e2e/test_router.py::test_a_mixed_load_through_the_router_is_lossless"),
        "adaptive": Untested("the router sees a plain server; no adaptive worker behind it is tested"),
    },
}  # fmt: skip

BEGIN, END = "<!-- scale-out table: begin -->", "<!-- scale-out table: end -->"


def cells():
    """(row, column, cell) of every cell, in the table's order."""
    for row, by_column in ROWS.items():
        for column in COLUMNS:
            yield row, column, by_column[column]


def render() -> str:
    """The table and the tests behind it, between :data:`BEGIN` and :data:`END`, as the doc holds them."""
    lines = [BEGIN, "", "| mode | " + " | ".join(COLUMNS.values()) + " |", "|---" * (len(COLUMNS) + 1) + "|"]
    for row, by_column in ROWS.items():
        lines.append(f"| {row} | " + " | ".join(by_column[c].status() for c in COLUMNS) + " |")
    lines += ["", "The tests behind the cells (under `tests/`):", ""]
    tests: dict[str, list[str]] = {}
    for row, column, cell in cells():
        if isinstance(cell, Tested):
            tests.setdefault(cell.test, []).append(f"{row.split(' (')[0]} / {COLUMNS[column].split(' (')[0]}")
    lines += [f"- `{test}`: {'; '.join(where)}" for test, where in tests.items()]
    return "\n".join([*lines, "", END])


if __name__ == "__main__":
    print(render())
