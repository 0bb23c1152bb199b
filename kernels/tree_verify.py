"""Lossless tree verification over a batch: one Triton program per request.

The rules and their torch twin are ``speculators/verify.py`` (``walk_tree``; derivation in ``docs/verification.md``):
``speculators.verify.verify_tree`` launches this kernel on a GPU for sampled verification, through
:func:`verify_tree_on_device`; greedy verification there is one argmax over all nodes, then the torch walk on ids.
Vocabulary: the walk starts at the root (node 0, the last committed token), **accepts** a root-to-node path of
drafted children, then emits one **bonus** token sampled where it stopped.

Rules:

- **greedy**: at node v, with t = argmax p(.|v), descend to the first child (in sibling order) whose token is t;
  if there is none, the bonus is t.
- **sampled** (target-only rule, lossless for any tree): at node v with children c_1..c_m in sibling order and a
  coin u_v ~ U[0, 1), accept c_i iff ``p(c_i) > 0`` and ``sum_{j<i} p(c_j) <= u_v < sum_{j<=i} p(c_j)``
  (sequential float32 sums in sibling order, exactly SGLang's ``tree_speculative_sampling_target_only`` with
  thresholds 1). That is drawing y ~ p(.|v) and descending iff y is a child. If no child is accepted, the bonus is
  drawn from p(.|v) with the rejected children zeroed, by inverse CDF with a second coin u'. At the depth limit
  (``num_spec_tokens - 1`` accepted drafts) or at a leaf the bonus is drawn from p(.|v) unchanged.
  The interval is half-open at the top because SGLang's coins are in [0, 1) (``torch.rand``), and ``p(c) > 0``
  keeps a zero-probability child from being accepted by a coin of exactly 0. A sibling whose token repeats an
  earlier sibling's counts with probability 0 (SGLang's kernel would count it twice and over-accept it).

Inputs and outputs follow SGLang (``sglang/kernels/ops/speculative/{tree,sampling}.py`` and
``srt/speculative/eagle_utils.py``):

- ``candidates [B, N]``: token of each tree node (node 0 = root); ``retrieve_index [B, N]``: the node's global row
  (SGLang builds ``b * N + i``); ``retrieve_next_token [B, N]``: first child or -1;
  ``retrieve_next_sibling [B, N]``: next sibling or -1.
- target rows are indexed by the *local* node: ``target_probs[b, i]`` is p(.|node i of request b).
- ``predicts [B*N] int32``: ``predicts[accept_index[b, k]]`` is the k-th output token of request b: the accepted
  child's token for k < accept_token_num[b], the bonus for k == accept_token_num[b]. Other entries are left as
  they were (SGLang: "undefined").
- ``accept_index [B, num_spec_tokens] int32``: retrieve_index of the root and of each accepted node, -1 after
  (written by the kernel, so it need not be pre-filled).
- ``accept_token_num [B] int32``: number of accepted drafts (output tokens this step = accept_token_num + 1).

Worked example (B=1, N=4; root 0 has children 1 and 2 in that order, node 1 has child 3)::

    candidates            = [[r, a, b, c]]     retrieve_index = [[0, 1, 2, 3]]
    retrieve_next_token   = [[1, 3, -1, -1]]   retrieve_next_sibling = [[-1, 2, -1, -1]]
    greedy, argmax per node = [b, x, y, z]:    root -> child 2 (token b); node 2 has no child -> bonus y
    predicts[0] = b, predicts[2] = y;          accept_index = [[0, 2, -1]]; accept_token_num = [1]

Coins: ``uniform_samples [B, N]`` (coin of node i is ``uniform_samples[b, i]``, used while choosing among node i's
children) and ``uniform_samples_for_final_sampling`` either ``[B]`` (SGLang: one per request) or ``[B, N]`` (one
per node; the entry of the node where the walk stopped is used). Both are drawn outside so runs are reproducible.

Kernel layout: program b walks its tree with scalar loads (at most N node visits); greedy-from-logits computes the
argmax only at visited nodes (reads <= depth+1 vocab rows instead of N); the sampled bonus makes two passes over one
vocab row in ``BLOCK_V`` blocks: pass 1 sums the residual mass R = sum p - sum p(rejected children), pass 2 scans
block sums until the running sum passes u' * R, then resolves the token inside that block with a cumulative sum.
The kernel calls no ``@triton.jit`` helpers (see ``interpret.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sglang_kimi.speculators.trees import NO_NODE  # retrieve arrays' "none" and accept_index padding

try:  # the CPU backend (the *_ref functions) must work without triton
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - triton ships with torch on every platform we target
    triton = None

GREEDY_PREDICT = 0  # target is the argmax per node, int [B, N] (SGLang's target_predict)
GREEDY_LOGITS = 1  # target is logits [B, N, V]; argmax computed at visited nodes only
SAMPLED = 2  # target is probabilities [B, N, V]


@dataclass
class TreeVerifyOutput:
    predicts: torch.Tensor  # [B*N] int32, see module docstring
    accept_index: torch.Tensor  # [B, num_spec_tokens] int32, -1 padded
    accept_token_num: torch.Tensor  # [B] int32, accepted drafts (bonus not counted)


if triton is not None:

    @triton.jit
    def _tree_verify_kernel(
        predicts_ptr,  # int32 [B*N]
        accept_index_ptr,  # int32 [B, S]
        accept_token_num_ptr,  # int32 [B]
        candidates_ptr,  # int [B, N]
        retrieve_index_ptr,  # int [B, N]
        next_token_ptr,  # int [B, N]
        next_sibling_ptr,  # int [B, N]
        target_ptr,  # int [B, N] (GREEDY_PREDICT) or float [B, N, V]
        coins_ptr,  # fp32 [B, N] (SAMPLED)
        final_coins_ptr,  # fp32 [B] or [B, N] (SAMPLED)
        num_nodes,  # N
        vocab,  # V
        num_spec,  # S = accept_index.shape[1]
        stride_tb,
        stride_tn,  # target strides (elements); vocab stride is 1
        stride_fb,
        stride_fn,  # final coin strides: [B] -> (1, 0), [B, N] -> (N, 1)
        MODE: tl.constexpr,
        BLOCK_V: tl.constexpr,
        BLOCK_S: tl.constexpr,  # >= S, power of 2
        MAX_CHILDREN: tl.constexpr,  # >= N, power of 2
    ):
        b = tl.program_id(0).to(tl.int64)
        base = b * num_nodes
        offs_v = tl.arange(0, BLOCK_V)
        slot = tl.arange(0, MAX_CHILDREN)

        last = tl.load(retrieve_index_ptr + base).to(tl.int64)  # global row of the last accepted node
        tl.store(accept_index_ptr + b * num_spec, last.to(tl.int32))
        cur = base * 0  # local index of the node whose distribution is examined
        num_acc = tl.cast(0, tl.int32)
        active = tl.cast(1, tl.int32)
        tgt = base * 0 - 1  # greedy: argmax token at cur
        rej_tok = tl.full([MAX_CHILDREN], -1, tl.int64)  # sampled: rejected children of cur with p > 0
        rej_p = tl.zeros([MAX_CHILDREN], tl.float32)
        n_rej = tl.cast(0, tl.int32)

        for j in range(0, num_spec):
            if active != 0:
                row = b * stride_tb + cur * stride_tn
                if MODE == 0:
                    tgt = tl.load(target_ptr + row).to(tl.int64)
                if MODE == 1:
                    best = -float("inf")
                    best_idx = base * 0
                    for start in range(0, vocab, BLOCK_V):
                        vals = tl.load(
                            target_ptr + row + start + offs_v, mask=start + offs_v < vocab, other=-float("inf")
                        ).to(tl.float32)
                        m = tl.max(vals, 0)
                        i = tl.argmax(vals, 0).to(tl.int64)
                        if m > best:  # strict: the first maximum wins, as torch.argmax
                            best = m
                            best_idx = start + i
                    tgt = best_idx
                if j < num_spec - 1:
                    coin = 0.0
                    if MODE == 2:
                        coin = tl.load(coins_ptr + base + cur)
                    child = tl.load(next_token_ptr + base + cur).to(tl.int64)
                    prob_acc = 0.0
                    found = tl.cast(0, tl.int32)
                    rej_tok = tl.full([MAX_CHILDREN], -1, tl.int64)
                    rej_p = tl.zeros([MAX_CHILDREN], tl.float32)
                    n_rej = tl.cast(0, tl.int32)
                    new_cur = cur
                    for _ in range(0, num_nodes):
                        if (found == 0) & (child != -1):
                            tok = tl.load(candidates_ptr + base + child).to(tl.int64)
                            ok = tok == tgt
                            p = 0.0
                            if MODE == 2:
                                p = tl.load(target_ptr + row + tok).to(tl.float32)
                                # a token already rejected among earlier siblings counts once (its mass is spent)
                                dup = tl.sum((rej_tok == tok).to(tl.int32), 0)
                                p = tl.where(dup > 0, 0.0, p)
                                prob_acc += p
                                ok = (p > 0) & (coin < prob_acc)
                            if ok:
                                found = 1
                                tl.store(predicts_ptr + last, tok.to(tl.int32))
                                num_acc += 1
                                last = tl.load(retrieve_index_ptr + base + child).to(tl.int64)
                                tl.store(accept_index_ptr + b * num_spec + num_acc, last.to(tl.int32))
                                new_cur = child
                                # the walk moves to the child: the siblings rejected here are not zeroed there
                                rej_tok = tl.full([MAX_CHILDREN], -1, tl.int64)
                                rej_p = tl.zeros([MAX_CHILDREN], tl.float32)
                                n_rej = tl.cast(0, tl.int32)
                            else:
                                if MODE == 2:
                                    if p > 0:
                                        rej_tok = tl.where(slot == n_rej, tok, rej_tok)
                                        rej_p = tl.where(slot == n_rej, p, rej_p)
                                        n_rej += 1
                                child = tl.load(next_sibling_ptr + base + child).to(tl.int64)
                    cur = new_cur
                    if found == 0:
                        active = 0

        # The bonus at the node where the walk stopped.
        bonus = tgt
        if MODE == 2:
            row = b * stride_tb + cur * stride_tn
            # pass 1: residual mass R, block by block (the same block sums pass 2 accumulates)
            total = 0.0
            for start in range(0, vocab, BLOCK_V):
                vals = tl.load(target_ptr + row + start + offs_v, mask=start + offs_v < vocab, other=0.0).to(tl.float32)
                in_blk = (rej_tok >= start) & (rej_tok < start + BLOCK_V)
                total += tl.sum(vals, 0) - tl.sum(tl.where(in_blk, rej_p, 0.0), 0)
            u = tl.load(final_coins_ptr + b * stride_fb + cur * stride_fn) * total
            # pass 2: find the block where the running residual sum passes u, then the token inside it
            acc = 0.0
            sampled = base * 0 - 1
            for start in range(0, vocab, BLOCK_V):
                if sampled < 0:
                    valid = start + offs_v < vocab
                    vals = tl.load(target_ptr + row + start + offs_v, mask=valid, other=0.0).to(tl.float32)
                    in_blk = (rej_tok >= start) & (rej_tok < start + BLOCK_V)
                    blk = tl.sum(vals, 0) - tl.sum(tl.where(in_blk, rej_p, 0.0), 0)
                    if acc + blk > u:
                        ids = start + offs_v
                        r = vals
                        for c in range(0, n_rej):  # zero the rejected children (few) inside this block
                            r = tl.where(ids == tl.sum(tl.where(slot == c, rej_tok, 0), 0), 0.0, r)
                        cs = acc + tl.cumsum(r, 0)
                        pos = valid & (r > 0)
                        first = tl.min(tl.where(pos & (cs > u), ids, vocab), 0)
                        if first == vocab:  # rounding: the block sum passed u but the cumulative sum did not
                            first = tl.max(tl.where(pos, ids, -1), 0)
                        sampled = first.to(tl.int64)
                    acc += blk
            if sampled < 0:
                # rounding left u at or past the total: take the last token with positive residual
                for start in range(0, vocab, BLOCK_V):
                    valid = start + offs_v < vocab
                    vals = tl.load(target_ptr + row + start + offs_v, mask=valid, other=0.0).to(tl.float32)
                    ids = start + offs_v
                    r = vals
                    for c in range(0, n_rej):
                        r = tl.where(ids == tl.sum(tl.where(slot == c, rej_tok, 0), 0), 0.0, r)
                    sampled = tl.maximum(sampled, tl.max(tl.where(valid & (r > 0), ids, -1), 0).to(tl.int64))
            if sampled < 0:
                # no residual mass at all (all of p on rejected children, by rounding): the last such child
                sampled = tl.sum(tl.where(slot == n_rej - 1, rej_tok, 0), 0)
            bonus = sampled

        tl.store(predicts_ptr + last, bonus.to(tl.int32))
        tl.store(accept_token_num_ptr + b, num_acc)
        offs_s = tl.arange(0, BLOCK_S)
        tl.store(
            accept_index_ptr + b * num_spec + offs_s,
            tl.full([BLOCK_S], -1, tl.int32),  # NO_NODE
            mask=(offs_s > num_acc) & (offs_s < num_spec),
        )


def _mode_and_target(target_predict, target_logits, target_probs):
    given = [t is not None for t in (target_predict, target_logits, target_probs)]
    if sum(given) != 1:
        raise ValueError("pass exactly one of target_predict, target_logits, target_probs")
    if target_predict is not None:
        return GREEDY_PREDICT, target_predict
    if target_logits is not None:
        return GREEDY_LOGITS, target_logits
    return SAMPLED, target_probs


def _outputs(candidates, num_spec_tokens, predicts, accept_index, accept_token_num):
    B, N = candidates.shape
    device = candidates.device
    if predicts is None:
        predicts = torch.zeros(B * N, dtype=torch.int32, device=device)
    if accept_index is None:
        accept_index = torch.full((B, num_spec_tokens), NO_NODE, dtype=torch.int32, device=device)
    if accept_token_num is None:
        accept_token_num = torch.zeros(B, dtype=torch.int32, device=device)
    if accept_index.shape != (B, num_spec_tokens):
        raise ValueError(f"accept_index must be [{B}, {num_spec_tokens}], got {list(accept_index.shape)}")
    return predicts, accept_index, accept_token_num


def _check_inputs(candidates, mode, target, uniform_samples, uniform_samples_for_final_sampling, num_spec_tokens):
    B, N = candidates.shape
    if num_spec_tokens < 1:
        raise ValueError("num_spec_tokens (max tree depth + 1) must be >= 1")
    if mode == GREEDY_PREDICT and tuple(target.shape) != (B, N):
        raise ValueError(f"target_predict must be [{B}, {N}], got {list(target.shape)}")
    if mode != GREEDY_PREDICT and (target.dim() != 3 or tuple(target.shape[:2]) != (B, N)):
        raise ValueError(f"target rows must be [{B}, {N}, V], got {list(target.shape)}")
    if mode == SAMPLED:
        if uniform_samples is None or uniform_samples_for_final_sampling is None:
            raise ValueError("sampled verification needs uniform_samples and uniform_samples_for_final_sampling")
        if tuple(uniform_samples.shape) != (B, N):
            raise ValueError(f"uniform_samples must be [{B}, {N}]")
        if tuple(uniform_samples_for_final_sampling.shape) not in ((B,), (B, N)):
            raise ValueError(f"uniform_samples_for_final_sampling must be [{B}] or [{B}, {N}]")


def tree_verify(
    candidates: torch.Tensor,  # [B, N] int
    retrieve_index: torch.Tensor,  # [B, N] int
    retrieve_next_token: torch.Tensor,  # [B, N] int
    retrieve_next_sibling: torch.Tensor,  # [B, N] int
    *,
    num_spec_tokens: int,  # max tree depth + 1 (accept_index width)
    target_predict: torch.Tensor | None = None,  # [B, N] int: greedy from argmax per node
    target_logits: torch.Tensor | None = None,  # [B, N, V]: greedy, argmax at visited nodes only
    target_probs: torch.Tensor | None = None,  # [B, N, V]: sampled (target-only rule)
    uniform_samples: torch.Tensor | None = None,  # [B, N] fp32 in [0, 1)
    uniform_samples_for_final_sampling: torch.Tensor | None = None,  # [B] or [B, N] fp32 in [0, 1)
    predicts: torch.Tensor | None = None,  # [B*N] int32, written in place if given
    accept_index: torch.Tensor | None = None,  # [B, num_spec_tokens] int32, written in place if given
    accept_token_num: torch.Tensor | None = None,  # [B] int32, written in place if given
    block_v: int | None = None,
) -> TreeVerifyOutput:
    """Verify a batch of draft trees with one Triton program per request (see the module docstring)."""
    from sglang_kimi.kernels.interpret import launch

    mode, target = _mode_and_target(target_predict, target_logits, target_probs)
    _check_inputs(candidates, mode, target, uniform_samples, uniform_samples_for_final_sampling, num_spec_tokens)
    predicts, accept_index, accept_token_num = _outputs(
        candidates, num_spec_tokens, predicts, accept_index, accept_token_num
    )
    B, N = candidates.shape
    if B == 0:
        return TreeVerifyOutput(predicts, accept_index, accept_token_num)
    candidates, retrieve_index = candidates.contiguous(), retrieve_index.contiguous()
    retrieve_next_token, retrieve_next_sibling = retrieve_next_token.contiguous(), retrieve_next_sibling.contiguous()
    if mode == GREEDY_PREDICT:
        target = target.contiguous()
        vocab, stride_tb, stride_tn = 1, N, 1
    else:
        if target.stride(-1) != 1:
            target = target.contiguous()
        vocab, stride_tb, stride_tn = target.shape[2], target.stride(0), target.stride(1)
    if mode == SAMPLED:
        coins = uniform_samples.to(torch.float32).contiguous()
        final = uniform_samples_for_final_sampling.to(torch.float32).contiguous()
        stride_fb, stride_fn = (1, 0) if final.dim() == 1 else (N, 1)
    else:  # unused by the kernel; any valid pointer
        coins = final = accept_token_num
        stride_fb = stride_fn = 0
    if block_v is None:
        block_v = min(1024, triton.next_power_of_2(max(vocab, 16)))
    launch(
        _tree_verify_kernel,
        (B,),
        predicts,
        accept_index,
        accept_token_num,
        candidates,
        retrieve_index,
        retrieve_next_token,
        retrieve_next_sibling,
        target,
        coins,
        final,
        N,
        vocab,
        num_spec_tokens,
        stride_tb,
        stride_tn,
        stride_fb,
        stride_fn,
        MODE=mode,
        BLOCK_V=block_v,
        BLOCK_S=triton.next_power_of_2(num_spec_tokens),
        MAX_CHILDREN=triton.next_power_of_2(max(N, 2)),
        num_warps=1 if mode == GREEDY_PREDICT else 4,
    )
    return TreeVerifyOutput(predicts, accept_index, accept_token_num)


def verify_tree_on_device(tree, *, target_probs, coins) -> TreeVerifyOutput:
    """The launch behind ``speculators.verify.verify_tree``'s sampled verification on a CUDA/ROCm device: a
    ``DraftTree`` in SGLang's retrieve layout, one kernel launch; the caller reads the outputs back into a
    ``VerifyResult``."""
    batch, n = tree.tokens.shape
    retrieve_index = torch.arange(batch * n, device=tree.tokens.device).view(batch, n)
    return tree_verify(
        tree.tokens.clamp(min=0),
        retrieve_index,
        tree.retrieve_next_token(),
        tree.retrieve_next_sibling(),
        num_spec_tokens=tree.max_depth + 1,
        target_probs=target_probs,
        uniform_samples=coins.uniform,
        uniform_samples_for_final_sampling=coins.final,
    )
