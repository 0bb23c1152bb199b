"""Torch implementations of the ``sgl_kernel`` ops SGLang's CPU path calls (served by the CPU shim).

Each op keeps the signature of its SGLang caller and writes its outputs in place, as the compiled op does. Each is a
port of the Triton kernel SGLang runs on GPUs for the same step (named in the op's docstring; file paths relative to
the installed ``sglang`` package), so the CPU path computes what the GPU path computes:

====================================== ===================================================== ======================
op                                     Triton twin                                           caller
====================================== ===================================================== ======================
copy_all_layer_kv_cache_cpu            kernels/ops/kvcache/cache_move.py                     KV move (tree accept)
                                       ``copy_all_layer_kv_cache_tiled``
assign_req_to_token_pool_cpu           srt/mem_cache/allocation.py ``assign_req_to_token_pool`` KV allocation
assign_draft_cache_locs_contiguous_cpu kernels/ops/speculative/cache_locs.py                 EAGLE draft
                                       ``assign_draft_cache_locs_contiguous``
assign_extend_cache_locs_cpu           cache_locs.py ``assign_extend_cache_locs``            verify / DFLASH block
build_tree_kernel_efficient_cpu        kernels/ops/speculative/spec_tree.py                  EAGLE tree build
                                       ``sgl_build_tree_kernel_efficient_triton``
verify_tree_greedy_cpu                 spec_tree.py ``verify_tree_greedy_kernel_triton``     greedy tree verify
fill_bonus_tokens_cpu                  kernels/ops/speculative/eagle.py ``fill_bonus_tokens`` verify commit
fill_accept_out_cache_loc_cpu          eagle.py ``fill_accept_out_cache_loc``                tree accept (topk > 1)
rotate_input_ids_cpu                   kernels/ops/speculative/multi_layer_eagle.py          multi-layer EAGLE
                                       ``rotate_input_ids_kernel``
reconstruct_indices_from_tree_mask     kernels/ops/speculative/reconstruct_tree.py           NGRAM verify
                                       ``reconstruct_indices_from_tree_mask_triton``
====================================== ===================================================== ======================

The tree ops walk small trees (``num_draft_tokens`` nodes per request) on host lists; everything else is one
vectorised gather or scatter.
"""

from __future__ import annotations

import ctypes

import torch

TREE_FULL_MASK = 0  # sglang.kernels.ops.speculative.spec_tree.TreeMaskMode
TREE_QLEN_ONLY = 1
TREE_QLEN_ONLY_BITPACKING = 2


def _segments(starts: torch.Tensor, ends: torch.Tensor):
    """Per row i the positions ``starts[i] .. ends[i]-1``, flattened: (row of each entry, position of each entry).

    Rows are concatenated in order, so entry k of the result is output slot k of the "cumulative offsets" layout
    the Triton kernels compute with ``tl.sum(end - start)`` over the previous rows.
    """
    starts = starts.to(torch.long).view(-1)
    lengths = (ends.to(torch.long).view(-1) - starts).clamp(min=0)
    rows = torch.repeat_interleave(torch.arange(lengths.numel(), device=starts.device), lengths)
    first = torch.cumsum(lengths, 0) - lengths  # output offset of each row
    within = torch.arange(int(lengths.sum()), device=starts.device) - first[rows]
    return rows, starts[rows] + within


def copy_all_layer_kv_cache_cpu(
    data_ptrs: torch.Tensor,  # [num_buffers] base address of each layer's K (then V) buffer
    strides: torch.Tensor,  # [num_buffers] bytes per token row of each buffer
    tgt_loc: torch.Tensor,  # [n] token slots written
    src_loc: torch.Tensor,  # [n] token slots read
) -> None:
    """In every buffer, copy token row ``src_loc[i]`` to row ``tgt_loc[i]`` (``copy_all_layer_kv_cache_tiled``).

    The buffers arrive as raw addresses, as the Triton kernel takes them. The kernel loads all source rows of a tile
    before storing, so overlapping source and target sets copy the old rows ("safe for in-place copy"): gather, then
    scatter.
    """
    if tgt_loc.numel() == 0:
        return
    tgt = tgt_loc.to(torch.long).view(-1)
    src = src_loc.to(torch.long).view(-1)
    rows_needed = int(torch.maximum(tgt.max(), src.max())) + 1
    for ptr, stride in zip(data_ptrs.tolist(), strides.tolist()):
        stride = int(stride)
        raw = (ctypes.c_uint8 * (rows_needed * stride)).from_address(int(ptr))
        rows = torch.frombuffer(raw, dtype=torch.uint8).view(rows_needed, stride)
        rows[tgt] = rows[src].clone()


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,  # [bs]
    req_to_token: torch.Tensor,  # [max_reqs, pool_len] (written)
    start_offset: torch.Tensor,  # [bs]
    end_offset: torch.Tensor,  # [bs]
    out_cache_loc: torch.Tensor,  # [sum(end - start)] slots, request after request
    pool_len: int,
) -> None:
    """``req_to_token[rpi[i], start[i]:end[i]] = out_cache_loc[off_i : off_i + end[i] - start[i]]`` with ``off_i``
    the summed lengths of the rows before i (``assign_req_to_token_pool``)."""
    rows, positions = _segments(start_offset, end_offset)
    if rows.numel() == 0:
        return
    req = req_pool_indices.to(torch.long).view(-1)[rows]
    req_to_token[req, positions] = out_cache_loc.view(-1)[: rows.numel()].to(req_to_token.dtype)


def assign_draft_cache_locs_contiguous_cpu(
    req_pool_indices: torch.Tensor,  # [bs]
    req_to_token: torch.Tensor,  # [max_reqs, pool_len]
    seq_lens: torch.Tensor,  # [bs]
    out_cache_loc: torch.Tensor,  # [bs * topk * num_cols] (written)
    pool_len: int,
    topk: int,
    num_cols: int,
) -> None:
    """Row block i of ``out_cache_loc`` (``topk * num_cols`` entries) is
    ``req_to_token[rpi[i], seq_lens[i] : seq_lens[i] + topk * num_cols]`` (``assign_draft_cache_locs_contiguous``;
    the CPU caller asks for no positions)."""
    bs = seq_lens.numel()
    width = topk * num_cols
    if bs == 0 or width == 0:
        return
    cols = seq_lens.to(torch.long).view(-1, 1) + torch.arange(width, device=seq_lens.device)  # [bs, width]
    rows = req_pool_indices.to(torch.long).view(-1, 1).expand(-1, width)
    out_cache_loc[: bs * width] = req_to_token[rows, cols].reshape(-1).to(out_cache_loc.dtype)


def assign_extend_cache_locs_cpu(
    req_pool_indices: torch.Tensor,  # [bs]
    req_to_token: torch.Tensor,  # [max_reqs, pool_len]
    start_offset: torch.Tensor,  # [bs]
    end_offset: torch.Tensor,  # [bs]
    out_cache_loc: torch.Tensor,  # [sum(end - start)] (written)
    pool_len: int,
) -> None:
    """The inverse of :func:`assign_req_to_token_pool_cpu`: ``out_cache_loc`` is the concatenation of
    ``req_to_token[rpi[i], start[i]:end[i]]`` over i (``assign_extend_cache_locs``)."""
    rows, positions = _segments(start_offset, end_offset)
    if rows.numel() == 0:
        return
    req = req_pool_indices.to(torch.long).view(-1)[rows]
    out_cache_loc.view(-1)[: rows.numel()] = req_to_token[req, positions].to(out_cache_loc.dtype)


def build_tree_kernel_efficient_cpu(
    parent_list: torch.Tensor,  # [bs, topk * (depth - 1) + 1] draft-token index of each expanded parent
    selected_index: torch.Tensor,  # [bs, draft_token_num - 1] selected draft tokens (flat ids, sorted)
    verified_seq_len: torch.Tensor,  # [bs] committed length of each request
    tree_mask: torch.Tensor,  # FULL_MASK [sum(seq_len) * N + bs * N * N] or QLEN_ONLY [bs * N * N] (written)
    positions: torch.Tensor,  # [bs * N] (written)
    retrieve_index: torch.Tensor,  # [bs, N] (written)
    retrieve_next_token: torch.Tensor,  # [bs, N] pre-filled -1 (written)
    retrieve_next_sibling: torch.Tensor,  # [bs, N] pre-filled -1 (written)
    topk: int,
    depth: int,
    draft_token_num: int,
    tree_mask_mode: int,
) -> None:
    """Link each selected draft token to its parent and fill positions and the tree mask, line by line as
    ``sgl_build_tree_kernel_efficient_triton`` (one request at a time here; the kernel runs one program per request).

    Node 0 is the root (the last committed token); node i >= 1 is ``selected_index[b, i-1]`` whose parent is the
    draft token ``parent_list[b, selected_index[b, i-1] // topk]``, found among the selected ones (or the root when
    that index is 0). Children are linked first-child / next-sibling, the later-selected child first (the kernel
    walks i downwards). Mask row i: the root, node i and its ancestors; FULL_MASK rows also span the
    ``seq_len`` prefix columns, which the caller pre-filled (the kernel writes only the tree columns).
    Positions are ``seq_len + depth``.
    """
    mode = int(tree_mask_mode)
    if mode == TREE_QLEN_ONLY_BITPACKING:
        raise NotImplementedError(
            "build_tree_kernel_efficient_cpu: QLEN_ONLY_BITPACKING is not implemented on CPU (SGLang's Triton "
            "tree builder lacks it too); use FULL_MASK or QLEN_ONLY"
        )
    n = int(draft_token_num)
    bs = verified_seq_len.numel()
    seq_lens = verified_seq_len.tolist()
    parents = parent_list.reshape(bs, -1).tolist() if parent_list.numel() else [[] for _ in range(bs)]
    selected = selected_index.reshape(bs, -1).tolist()
    next_token = retrieve_next_token.tolist()
    next_sibling = retrieve_next_sibling.tolist()
    r_index = retrieve_index.tolist()
    pos = positions.view(bs, n).tolist()
    mask_rows: list[tuple[int, list[bool]]] = []  # (flat offset of a row's tree columns, its N values)
    prefix_sum = 0
    for b in range(bs):
        seq_len = int(seq_lens[b])
        sel = selected[b]
        par = parents[b]

        def parent_position(i: int) -> int | None:
            """Node index of the parent of node i (>= 1), or None when the kernel finds none."""
            parent_tb = sel[i - 1] // topk
            if parent_tb == 0:
                return 0
            parent_token = par[parent_tb]
            for pp in range(n - 1):
                if sel[pp] == parent_token:
                    return pp + 1
            return None

        pos[b][0] = seq_len
        for i in range(n - 1, 0, -1):
            r_index[b][i] = b * n + i
            parent = parent_position(i)
            if parent is not None:
                first_child = next_token[b][parent]
                next_token[b][parent] = i
                if first_child != -1:
                    next_sibling[b][i] = first_child
        r_index[b][0] = b * n

        for x in range(n):
            if mode == TREE_FULL_MASK:
                row_start = (n * n * b + prefix_sum * n) + (seq_len + n) * x + seq_len
            else:
                row_start = n * n * b + n * x
            row = [True] + [False] * (n - 1)
            if x > 0:
                cur = x - 1  # index into sel of the node whose column is set
                level = 0
                for _ in range(depth):
                    level += 1
                    row[cur + 1] = True
                    parent_tb = sel[cur] // topk
                    if parent_tb == 0:
                        break
                    parent_token = par[parent_tb]
                    found = next((cp for cp in range(n - 1) if sel[cp] == parent_token), None)
                    if found is None:
                        break
                    cur = found
                pos[b][x] = seq_len + level
            mask_rows.append((row_start, row))
        prefix_sum += seq_len

    device = positions.device
    retrieve_index.copy_(torch.tensor(r_index, dtype=retrieve_index.dtype, device=device))
    retrieve_next_token.copy_(torch.tensor(next_token, dtype=retrieve_next_token.dtype, device=device))
    retrieve_next_sibling.copy_(torch.tensor(next_sibling, dtype=retrieve_next_sibling.dtype, device=device))
    positions.view(bs, n).copy_(torch.tensor(pos, dtype=positions.dtype, device=device))
    if mask_rows:
        starts = torch.tensor([s for s, _ in mask_rows], dtype=torch.long, device=device)
        flat = (starts[:, None] + torch.arange(n, device=device)).view(-1)
        values = torch.tensor([v for _, row in mask_rows for v in row], dtype=torch.bool, device=device)
        tree_mask[flat] = values.to(tree_mask.dtype)


def verify_tree_greedy_cpu(
    predicts: torch.Tensor,  # [bs * N] int32 (written at accepted rows)
    accept_index: torch.Tensor,  # [bs, num_spec_tokens] int32 (written up to the accepted count)
    accept_token_num: torch.Tensor,  # [bs] int32 (written)
    candidates: torch.Tensor,  # [bs, N] draft token of each node
    retrive_index: torch.Tensor,  # [bs, N] global row of each node
    retrive_next_token: torch.Tensor,  # [bs, N] first child or -1
    retrive_next_sibling: torch.Tensor,  # [bs, N] next sibling or -1
    target_predict: torch.Tensor,  # [bs, N] target argmax at each node
) -> None:
    """Greedy tree verification, as ``verify_tree_greedy_kernel_triton``: from the root, at each depth accept the
    first child (in sibling order) whose token equals the target argmax at the last accepted node; write that
    argmax into ``predicts`` at the accepted node's row, the accepted nodes' rows into ``accept_index``, and finally
    the target argmax at the last accepted node (the bonus). Entries of ``accept_index`` past the accepted count
    are left as they were (the caller pre-fills -1)."""
    bs, n = candidates.shape
    num_spec = accept_index.shape[1]
    cand = candidates.tolist()
    r_index = retrive_index.tolist()
    nxt = retrive_next_token.tolist()
    sib = retrive_next_sibling.tolist()
    target = target_predict.reshape(-1).tolist()  # indexed by global row
    acc = accept_index.tolist()
    writes: list[tuple[int, int]] = []
    num_acc_all = []
    for b in range(bs):
        last = r_index[b][0]
        acc[b][0] = last
        num_acc = 0
        cur = 0
        for _ in range(1, num_spec):
            cur = nxt[b][cur]
            target_token = target[last]
            matched = False
            while cur != -1:
                if cand[b][cur] == target_token:
                    writes.append((last, target_token))
                    num_acc += 1
                    last = r_index[b][cur]
                    acc[b][num_acc] = last
                    matched = True
                    break
                cur = sib[b][cur]
            if not matched:
                break
        num_acc_all.append(num_acc)
        writes.append((last, target[last]))
    device = predicts.device
    accept_index.copy_(torch.tensor(acc, dtype=accept_index.dtype, device=device))
    accept_token_num.copy_(torch.tensor(num_acc_all, dtype=accept_token_num.dtype, device=device))
    if writes:
        rows = torch.tensor([r for r, _ in writes], dtype=torch.long, device=device)
        predicts[rows] = torch.tensor([t for _, t in writes], dtype=predicts.dtype, device=device)


def fill_bonus_tokens_cpu(
    accept_tokens: torch.Tensor,  # [bs, accept_stride] accepted tokens of each request (bonus last)
    accept_lens: torch.Tensor,  # [bs] accepted tokens including the bonus
    bonus_tokens: torch.Tensor,  # [bs] (written)
    accept_stride: int,
) -> None:
    """``bonus_tokens[i] = accept_tokens.flat[accept_stride * i + accept_lens[i] - 1]`` (``fill_bonus_tokens``)."""
    bs = accept_lens.numel()
    if bs == 0:
        return
    flat = torch.arange(bs, device=accept_lens.device) * accept_stride + accept_lens.to(torch.long).view(-1) - 1
    bonus_tokens.copy_(accept_tokens.reshape(-1)[flat].to(bonus_tokens.dtype))


def fill_accept_out_cache_loc_cpu(
    accept_index: torch.Tensor,  # [bs, S] global rows of accepted nodes, -1 padded
    out_cache_loc: torch.Tensor,  # [bs * N] verify window slots
    accept_out_cache_loc: torch.Tensor,  # [>= number of accepted entries] (written)
) -> None:
    """Compact ``out_cache_loc[accept_index[j]]`` over the entries with ``accept_index[j] != -1``, in order
    (``fill_accept_out_cache_loc``: entry j lands at the count of valid entries before it)."""
    flat = accept_index.reshape(-1).to(torch.long)
    valid = flat[flat != -1]
    accept_out_cache_loc[: valid.numel()] = out_cache_loc.view(-1)[valid].to(accept_out_cache_loc.dtype)


def rotate_input_ids_cpu(
    input_ids: torch.Tensor,  # [num_tokens] (rotated in place)
    extend_start_loc: torch.Tensor,  # [bs]
    extend_seq_lens: torch.Tensor,  # [bs]
    topk_index: torch.Tensor,  # [bs] token appended to each request
    select_index: torch.Tensor | None = None,  # [bs] where that token goes (default: the request's last slot)
) -> None:
    """Shift each request's ids left by one and write ``topk_index[i]`` at its last position, or at
    ``select_index[i]`` when given (``rotate_input_ids_kernel``)."""
    starts = extend_start_loc.tolist()
    lengths = extend_seq_lens.tolist()
    new_tokens = topk_index.reshape(-1)
    for i, (start, length) in enumerate(zip(starts, lengths)):
        if length <= 0:
            continue
        input_ids[start : start + length - 1] = input_ids[start + 1 : start + length].clone()
        last = int(select_index[i]) if select_index is not None else start + length - 1
        input_ids[last] = new_tokens[i].to(input_ids.dtype)


def reconstruct_indices_from_tree_mask(
    tree_mask: torch.Tensor,  # bool [bs * n * n], row-major (b, i, j): node j is an ancestor of node i (or i itself)
    verified_seq_len: torch.Tensor,  # [bs]
    positions: torch.Tensor,  # int64 [bs * n] (written)
    retrieve_index: torch.Tensor,  # int64 [bs, n] or [bs * n] (written)
    retrieve_next_token: torch.Tensor,  # int64 [bs, n] or [bs * n] (written)
    retrieve_next_sibling: torch.Tensor,  # int64 [bs, n] or [bs * n] (written)
    batch_size: int,
    draft_token_num: int,
) -> None:
    """The NGRAM verify's tree metadata from its ancestor mask, as ``reconstruct_indices_from_tree_mask_triton``:
    a node's position is the verified length plus its number of strict ancestors, its parent the last of them, its
    first child the first later node it is an ancestor of, its next sibling the first later node with the same parent
    (-1 for none, and for nodes without a parent)."""
    bs, n = batch_size, draft_token_num
    device = positions.device
    slots = torch.arange(n, device=device)
    later = slots[:, None] > slots[None, :]  # [n, n]: i > j
    ancestors = tree_mask.reshape(bs, n, n).bool() & later  # [bs, n, n]: j a strict ancestor of i
    depth = ancestors.sum(dim=2)  # [bs, n]
    positions.copy_((depth + verified_seq_len.to(device).reshape(bs, 1).long()).reshape(positions.shape))
    retrieve_index.copy_(torch.arange(bs * n, device=device).reshape(retrieve_index.shape))
    parent = torch.where(ancestors, slots, -1).amax(dim=2)  # [bs, n]
    first_child = torch.where(ancestors, slots[:, None], n).amin(dim=1)  # [bs, n], over the rows i of column j
    retrieve_next_token.copy_(torch.where(first_child < n, first_child, -1).reshape(retrieve_next_token.shape))
    same_parent = (parent[:, :, None] == parent[:, None, :]) & later  # [bs, k, tid]: k > tid, one parent
    first_sibling = torch.where(same_parent, slots[:, None], n).amin(dim=1)  # [bs, n]
    next_sibling = torch.where((parent >= 0) & (first_sibling < n), first_sibling, -1)
    retrieve_next_sibling.copy_(next_sibling.reshape(retrieve_next_sibling.shape))


OPS: dict = {
    fn.__name__: fn
    for fn in (
        copy_all_layer_kv_cache_cpu,
        assign_req_to_token_pool_cpu,
        assign_draft_cache_locs_contiguous_cpu,
        assign_extend_cache_locs_cpu,
        build_tree_kernel_efficient_cpu,
        verify_tree_greedy_cpu,
        fill_bonus_tokens_cpu,
        fill_accept_out_cache_loc_cpu,
        rotate_input_ids_cpu,
        reconstruct_indices_from_tree_mask,
    )
}
