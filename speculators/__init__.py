"""Speculative decoding algorithms in pure PyTorch (no SGLang, no kernels), installed as ``sglang_kimi.speculators``.

- :mod:`.trees`: :class:`DraftTree` and its builders: chains, DDTree best-first trees, EAGLE dynamic trees;
  ancestor masks, positions and SGLang's retrieve arrays.
- :mod:`.verify`: greedy, sampled (target-only) and stochastic-chain verification; the sampler's processing.
- :mod:`.reference`: the reference decode loop (the oracle for every lossless test), proposers, target adapters.
"""

from .reference import (
    ChainProposer,
    DDTreeProposer,
    DraftContext,
    EagleProposer,
    GenerateOutput,
    Proposal,
    Proposer,
    Target,
    TargetOutput,
    TinyTarget,
    generate,
    hf_target,
)
from .trees import (
    NO_NODE,
    NO_PARENT,
    PAD_TOKEN_ID,
    DraftTree,
    build_chain,
    build_ddtree,
    build_eagle_tree,
    draft_eagle_tree,
)
from .verify import (
    VerifyResult,
    process_logits,
    verify_chain_stochastic,
    verify_greedy,
    verify_sampled,
)

__all__ = [
    "NO_NODE",
    "NO_PARENT",
    "PAD_TOKEN_ID",
    "ChainProposer",
    "DDTreeProposer",
    "DraftContext",
    "DraftTree",
    "EagleProposer",
    "GenerateOutput",
    "Proposal",
    "Proposer",
    "Target",
    "TargetOutput",
    "TinyTarget",
    "VerifyResult",
    "build_chain",
    "build_ddtree",
    "build_eagle_tree",
    "draft_eagle_tree",
    "generate",
    "hf_target",
    "process_logits",
    "verify_chain_stochastic",
    "verify_greedy",
    "verify_sampled",
]
