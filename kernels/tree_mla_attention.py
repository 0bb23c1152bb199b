"""MLA attention for tree verification (absorbed form, paged latent KV cache), plus the torch twin.

Absorbed MLA: per head, the query is ``[q_nope @ W_UK (kv_lora) ++ q_rope (rope)]`` (width kv_lora + rope = 576 for
Kimi) and every key is one row of the latent cache ``[c_kv (kv_lora) ++ k_rope (rope)]``; the value is the
same row's first kv_lora columns. So::

    score(q, t) = q . kv[t] * sm_scale              kv[t]: [576]
    out(q)      = sum_t softmax(score)_t * kv[t, :kv_lora]          -> [kv_lora], W_UV is applied by the caller

Tree verify: request b has ``prefix_lens[b]`` committed tokens and N tree nodes whose KV rows are already written
at positions ``prefix_lens[b] .. prefix_lens[b] + N - 1`` of its ``req_to_token`` row (SGLang's
``req_to_token[req_pool_index, position] = kv slot``). Query (node i, head h) sees the whole prefix plus the tree
nodes j with ``tree_mask[b, i, j]`` (ancestors and itself). Worked example (prefix 3, N = 3, node 1 and node 2 are
children of root 0)::

    positions      0 1 2 | 3 4 5        (tree nodes 0 1 2 at positions 3 4 5)
    node 0 sees    x x x | x . .
    node 1 sees    x x x | x x .
    node 2 sees    x x x | x . x

Kernel (flash-decoding over the prefix, tree part separate, merged by log-sum-exp):

- one program owns a tile of ``BLOCK_M`` query rows of ONE request (rows are (node, head) pairs, all N*H rows of a
  request in as few tiles as fit, the tile index varying fastest so the tiles of one request run together) and a
  range of its key positions, and streams keys ``BLOCK_N`` at a time: slots from ``req_to_token``, the key tile
  from the cache (``[BLOCK_N, 576]``, each key's row contiguous, with ``K_ROWS``, the CUDA tile; else
  ``[576, BLOCK_N]``), ``qk = q_nope.k_nope + q_rope.k_rope``, online softmax in base 2, and ``acc += p @ k_nope``
  (the value tile is the key tile itself: the prefix KV is read once per tile, not once per query token);
- with S > 1 splits the grid is (tiles, S + 1, B): programs 0..S-1 take equal slices of the prefix, program S the N
  tree keys with the bit mask; each writes a normalised partial output and its LSE, and a second kernel merges the
  S + 1 partials per row; with S == 1 one program does prefix then tree and writes the output directly (no
  workspace: the choice for large batches, where B * tiles already fills the GPU).

The mask reaches the kernel as packed bits ``[B, N]`` (bit j of row i set iff node i sees node j; int32 for
N <= 32, int64 for N <= 64); a bool ``[B, N, N]`` mask is packed by :func:`pack_tree_mask`. A query row that sees
no key at all (no prefix, empty mask row) gets output 0 and LSE -inf in both kernel and reference.

GPU: q and the cache in bf16 (fp16 works the same), dots on the tensor cores with fp32 accumulation, p cast to the
cache dtype for the value dot (as SGLang's Triton MLA decode kernel). CPU: float32 through Triton's interpreter,
for tests; the CPU backend is :func:`tree_mla_attention_ref`.
"""

from __future__ import annotations

import math

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
MAX_TREE_NODES = 64  # the packed mask is one int64 per query row


def pack_tree_mask(mask: torch.Tensor) -> torch.Tensor:
    """bool ``[B, N, N]`` (row i: what node i sees) -> int64 ``[B, N]`` with bit j of row i = mask[b, i, j].

    Example: ``[[1,0,0],[1,1,0],[1,0,1]] -> [0b001, 0b011, 0b101] = [1, 3, 5]``. Bit 63 lands on the sign bit; the
    kernel only ever tests bits, so that is fine.
    """
    B, N, N2 = mask.shape
    if N != N2 or N > MAX_TREE_NODES:
        raise ValueError(f"tree mask must be [B, N, N] with N <= {MAX_TREE_NODES}, got {list(mask.shape)}")
    weights = torch.ones(N, dtype=torch.int64, device=mask.device) << torch.arange(N, device=mask.device)
    return (mask.to(torch.int64) * weights).sum(dim=-1)  # distinct powers of two: the sum is the bitwise or


def unpack_tree_mask(bits: torch.Tensor, num_nodes: int) -> torch.Tensor:
    """int ``[B, N]`` packed bits -> bool ``[B, N, num_nodes]``."""
    shifts = torch.arange(num_nodes, device=bits.device)
    return ((bits.to(torch.int64)[..., None] >> shifts) & 1).bool()


def tree_mla_attention_ref(
    q: torch.Tensor,  # [B*N, H, kv_lora + rope]
    kv_cache: torch.Tensor,  # [slots, kv_lora + rope] or [slots, 1, kv_lora + rope]
    req_to_token: torch.Tensor,  # [max_reqs, max_ctx] int
    req_pool_indices: torch.Tensor,  # [B] int
    prefix_lens: torch.Tensor,  # [B] int
    tree_mask: torch.Tensor,  # bool [B, N, N] or packed int [B, N]
    sm_scale: float,
    *,
    kv_lora_rank: int = 512,
    return_lse: bool = False,
    max_elements: int = 1 << 24,
):
    """Torch twin of :func:`tree_mla_attention` (float32 math): gather each request's rows through
    ``req_to_token``, score, mask, softmax, weight the latent values. Requests are processed in chunks that keep
    the score tensor under ``max_elements``. Returns ``out [B*N, H, kv_lora]`` in q's dtype (and ``lse [B*N, H]``
    float32, natural log, if ``return_lse``)."""
    BN, H, D = q.shape
    B = req_pool_indices.numel()
    N = BN // B
    if B * N != BN:
        raise ValueError(f"q has {BN} rows, not a multiple of the batch {B}")
    mask = tree_mask if tree_mask.dtype == torch.bool else unpack_tree_mask(tree_mask, N)  # [B, N, N]
    kv = kv_cache.reshape(kv_cache.shape[0], -1)  # [slots, D]
    prefix = prefix_lens.to(torch.long)
    out = torch.empty(B, N, H, kv_lora_rank, dtype=q.dtype, device=q.device)
    lse_all = torch.empty(B, N, H, dtype=torch.float32, device=q.device)
    qf = q.view(B, N, H, D)
    lengths = (prefix + N).tolist()
    b0 = 0
    while b0 < B:
        b1 = b0 + 1
        L = lengths[b0]
        while b1 < B and (b1 + 1 - b0) * N * H * max(L, lengths[b1]) <= max_elements:
            L = max(L, lengths[b1])
            b1 += 1
        pos = torch.arange(L, device=q.device)
        slots = req_to_token[req_pool_indices[b0:b1].long()][:, :L].long()  # [c, L]
        keys = kv[slots.clamp(min=0)].float()  # [c, L, D]
        scores = torch.einsum("cnhd,cld->cnhl", qf[b0:b1].float(), keys) * sm_scale  # [c, N, H, L]
        j = pos[None, :] - prefix[b0:b1, None]  # [c, L]: tree node index of each position
        in_tree = (j >= 0) & (j < N)
        tree_vis = torch.gather(mask[b0:b1], 2, j.clamp(0, N - 1)[:, None, :].expand(-1, N, -1))  # [c, N, L]
        visible = (j < 0)[:, None, :] | (in_tree[:, None, :] & tree_vis)  # [c, N, L]
        scores = scores.masked_fill(~visible[:, :, None, :], float("-inf"))
        lse = torch.logsumexp(scores, dim=-1)  # [c, N, H]
        probs = torch.exp(scores - lse[..., None]).nan_to_num(0.0)  # rows with no visible key: all zero
        out[b0:b1] = torch.einsum("cnhl,cld->cnhd", probs, keys[..., :kv_lora_rank]).to(q.dtype)
        lse_all[b0:b1] = lse
        b0 = b1
    out = out.view(BN, H, kv_lora_rank)
    return (out, lse_all.view(BN, H)) if return_lse else out


if triton is not None:

    @triton.jit
    def _tree_mla_fwd_kernel(
        q_ptr,  # [B*N, H, D]
        kv_ptr,  # [slots, D] (row stride stride_kv)
        req_to_token_ptr,  # [max_reqs, max_ctx]
        req_pool_ptr,  # [B]
        prefix_ptr,  # [B]
        bits_ptr,  # [B, N] packed mask
        out_ptr,  # FUSED: [B*N, H, DV] output; else [S+1, B*N*H, DV] fp32 partials
        lse_ptr,  # FUSED: [B*N, H] fp32 (natural log); else [S+1, B*N*H] fp32 (base 2)
        sm_scale_log2,  # sm_scale * log2(e)
        num_nodes,  # N
        num_heads,  # H
        num_splits,  # S (prefix splits)
        stride_qt,
        stride_qh,
        stride_kv,
        stride_r2t,
        stride_ot,
        stride_oh,
        part_rows,  # B*N*H (partial layout)
        KV_LORA: tl.constexpr,
        ROPE: tl.constexpr,
        BLOCK_DV: tl.constexpr,  # next_pow2(KV_LORA)
        BLOCK_PE: tl.constexpr,  # next_pow2(ROPE)
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        FUSED: tl.constexpr,
        K_ROWS: tl.constexpr,  # key tile loaded [BLOCK_N, D] (rows contiguous) instead of [D, BLOCK_N]
    ):
        tile = tl.program_id(0)
        split = tl.program_id(1)
        b = tl.program_id(2).to(tl.int64)
        rows_per_req = num_nodes * num_heads
        r = tile * BLOCK_M + tl.arange(0, BLOCK_M)  # row = node * H + head
        row_ok = r < rows_per_req
        node = r // num_heads
        head = r % num_heads
        q_row = (b * num_nodes + node) * stride_qt + head * stride_qh  # [BLOCK_M]

        offs_dv = tl.arange(0, BLOCK_DV)
        offs_pe = tl.arange(0, BLOCK_PE)
        dv_ok = offs_dv < KV_LORA
        pe_ok = offs_pe < ROPE
        q = tl.load(q_ptr + q_row[:, None] + offs_dv[None, :], mask=row_ok[:, None] & dv_ok[None, :], other=0.0)
        qpe = tl.load(
            q_ptr + q_row[:, None] + KV_LORA + offs_pe[None, :], mask=row_ok[:, None] & pe_ok[None, :], other=0.0
        )
        q = q.to(kv_ptr.dtype.element_ty)
        qpe = qpe.to(kv_ptr.dtype.element_ty)
        bits = tl.load(bits_ptr + b * num_nodes + node, mask=row_ok, other=0).to(tl.int64)  # [BLOCK_M]

        req = tl.load(req_pool_ptr + b).to(tl.int64)
        prefix = tl.load(prefix_ptr + b).to(tl.int32)
        if FUSED:
            lo = prefix * 0
            hi = prefix + num_nodes
        else:
            per_split = tl.cdiv(tl.cdiv(prefix, num_splits), BLOCK_N) * BLOCK_N
            lo = tl.minimum(split * per_split, prefix)
            hi = tl.minimum(lo + per_split, prefix)
            if split == num_splits:  # the tree program
                lo = prefix
                hi = prefix + num_nodes

        m_i = tl.full([BLOCK_M], -float("inf"), tl.float32)  # running max, base-2 units
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
        for start in range(lo, hi, BLOCK_N):
            pos = start + tl.arange(0, BLOCK_N)
            pos_ok = pos < hi
            slot = tl.load(req_to_token_ptr + req * stride_r2t + pos, mask=pos_ok, other=0).to(tl.int64)
            if K_ROWS:
                k = tl.load(
                    kv_ptr + slot[:, None] * stride_kv + offs_dv[None, :],
                    mask=pos_ok[:, None] & dv_ok[None, :],
                    other=0.0,
                )  # [BLOCK_N, BLOCK_DV]
                kpe = tl.load(
                    kv_ptr + slot[:, None] * stride_kv + KV_LORA + offs_pe[None, :],
                    mask=pos_ok[:, None] & pe_ok[None, :],
                    other=0.0,
                )  # [BLOCK_N, BLOCK_PE]
                qk = tl.dot(q, tl.trans(k)) + tl.dot(qpe, tl.trans(kpe))  # [BLOCK_M, BLOCK_N] fp32
            else:
                k = tl.load(
                    kv_ptr + slot[None, :] * stride_kv + offs_dv[:, None],
                    mask=pos_ok[None, :] & dv_ok[:, None],
                    other=0.0,
                )  # [BLOCK_DV, BLOCK_N]
                kpe = tl.load(
                    kv_ptr + slot[None, :] * stride_kv + KV_LORA + offs_pe[:, None],
                    mask=pos_ok[None, :] & pe_ok[:, None],
                    other=0.0,
                )  # [BLOCK_PE, BLOCK_N]
                qk = tl.dot(q, k) + tl.dot(qpe, kpe)  # [BLOCK_M, BLOCK_N] fp32
            qk = qk * sm_scale_log2
            j = pos - prefix  # tree node index of each key (negative in the prefix)
            in_tree = j >= 0
            bit = (bits[:, None] >> tl.where(in_tree, j, 0)[None, :].to(tl.int64)) & 1
            visible = ((~in_tree)[None, :] | (bit != 0)) & pos_ok[None, :] & row_ok[:, None]
            qk = tl.where(visible, qk, -float("inf"))
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)
            alpha = tl.exp2(m_i - m_safe)
            p = tl.exp2(qk - m_safe[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            if K_ROWS:
                acc = acc * alpha[:, None] + tl.dot(p.to(k.dtype), k)
            else:
                acc = acc * alpha[:, None] + tl.dot(p.to(k.dtype), tl.trans(k))
            m_i = m_new

        has = l_i > 0
        o = acc / tl.where(has, l_i, 1.0)[:, None]
        lse2 = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), -float("inf"))
        if FUSED:
            o_row = (b * num_nodes + node) * stride_ot + head * stride_oh
            tl.store(
                out_ptr + o_row[:, None] + offs_dv[None, :],
                o.to(out_ptr.dtype.element_ty),
                mask=row_ok[:, None] & dv_ok[None, :],
            )
            tl.store(lse_ptr + (b * num_nodes + node) * num_heads + head, lse2 * 0.6931471805599453, mask=row_ok)
        else:
            g = split * part_rows + b * rows_per_req + r  # partial row
            tl.store(out_ptr + g[:, None] * BLOCK_DV + offs_dv[None, :], o, mask=row_ok[:, None] & dv_ok[None, :])
            tl.store(lse_ptr + g, lse2, mask=row_ok)

    @triton.jit
    def _tree_mla_merge_kernel(
        part_o_ptr,  # [S+1, R, BLOCK_DV] fp32
        part_lse_ptr,  # [S+1, R] fp32, base 2
        out_ptr,  # [B*N, H, DV]
        lse_ptr,  # [B*N, H] fp32, natural log
        num_parts,  # S + 1
        total_rows,  # R = B*N*H
        num_heads,
        stride_ot,
        stride_oh,
        KV_LORA: tl.constexpr,
        BLOCK_DV: tl.constexpr,
        BLOCK_R: tl.constexpr,
    ):
        g = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)  # global row = (b*N + node) * H + head
        g_ok = g < total_rows
        offs_dv = tl.arange(0, BLOCK_DV)
        dv_ok = offs_dv < KV_LORA
        m = tl.full([BLOCK_R], -float("inf"), tl.float32)
        for s in range(0, num_parts):
            m = tl.maximum(m, tl.load(part_lse_ptr + s * total_rows + g, mask=g_ok, other=-float("inf")))
        m_safe = tl.where(m == -float("inf"), 0.0, m)
        l_sum = tl.zeros([BLOCK_R], tl.float32)
        acc = tl.zeros([BLOCK_R, BLOCK_DV], tl.float32)
        for s in range(0, num_parts):
            w = tl.exp2(tl.load(part_lse_ptr + s * total_rows + g, mask=g_ok, other=-float("inf")) - m_safe)
            o = tl.load(
                part_o_ptr + (s * total_rows + g)[:, None] * BLOCK_DV + offs_dv[None, :],
                mask=g_ok[:, None] & dv_ok[None, :],
                other=0.0,
            )
            acc += w[:, None] * o
            l_sum += w
        has = l_sum > 0
        o = acc / tl.where(has, l_sum, 1.0)[:, None]
        lse = tl.where(has, (m_safe + tl.log2(tl.where(has, l_sum, 1.0))) * 0.6931471805599453, -float("inf"))
        t = g // num_heads
        h = g % num_heads
        o_row = t * stride_ot + h * stride_oh
        tl.store(
            out_ptr + o_row[:, None] + offs_dv[None, :],
            o.to(out_ptr.dtype.element_ty),
            mask=g_ok[:, None] & dv_ok[None, :],
        )
        tl.store(lse_ptr + g, lse, mask=g_ok)


# Launch tiles per vendor (docs/kernels.md, "Tree attention tiles"). CUDA: measured on an H200
# (bench/sweep_tree_attention.py, then bench/bench_kernels.py with CUDA-graph replay): 32 query rows x 64 keys, the
# key tile loaded row-contiguous, two pipeline stages; it spills ~1.5 KB/thread on sm_90 and is still the fastest
# tile measured at every shape. HIP: not measured on an AMD GPU yet: the tile that compiles for gfx942 without
# spills and within its 64 KiB of LDS (a 64-key tile needs all of it).
CUDA_TILE = {"block_m": 32, "block_n": 64, "num_warps": 4, "num_stages": 2, "k_rows": True}
HIP_TILE = {"block_m": 16, "block_n": 16, "num_warps": 4, "num_stages": 1, "k_rows": False}


def default_config(
    num_nodes: int, num_heads: int, batch: int, max_ctx: int, device: torch.device, hip: bool | None = None
) -> dict:
    """Launch parameters: the vendor's tile (:data:`CUDA_TILE`, :data:`HIP_TILE`; ``hip`` None: this torch build's
    vendor) and the number of prefix splits.

    Splits: enough (request, tile, split) programs to cover the GPU about twice, at least 256 prefix keys per
    split, at most 32 splits; 1 (the fused single pass) when the batch alone fills the GPU. The tiles of one
    request run next to each other (tile index fastest), so the prefix is fetched from HBM about once and re-read
    from L2.
    """
    hip = bool(torch.version.hip) if hip is None else hip
    tile = dict(HIP_TILE if hip else CUDA_TILE)
    tiles = -(-(num_nodes * num_heads) // tile["block_m"])
    if device.type == "cuda":
        sms = torch.cuda.get_device_properties(device).multi_processor_count
    else:
        sms = 4
    want = -(-2 * sms // max(1, batch * tiles))
    splits = max(1, min(want, -(-max_ctx // 256), 32))
    return {**tile, "num_kv_splits": splits}


def tree_mla_attention(
    q: torch.Tensor,  # [B*N, H, kv_lora + rope]
    kv_cache: torch.Tensor,  # [slots, kv_lora + rope] or [slots, 1, kv_lora + rope]
    req_to_token: torch.Tensor,  # [max_reqs, max_ctx] int32
    req_pool_indices: torch.Tensor,  # [B] int
    prefix_lens: torch.Tensor,  # [B] int, tokens before the tree (may differ per request)
    tree_mask: torch.Tensor,  # bool [B, N, N] or packed bits int32/int64 [B, N]
    sm_scale: float,
    *,
    kv_lora_rank: int = 512,
    out: torch.Tensor | None = None,  # [B*N, H, kv_lora], written in place if given
    return_lse: bool = False,
    num_kv_splits: int | None = None,
    block_m: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    k_rows: bool | None = None,
):
    """Tree-masked absorbed-MLA attention over a paged latent cache (see the module docstring).

    Returns ``out [B*N, H, kv_lora]`` in q's dtype, and ``lse [B*N, H]`` (float32, natural log) if ``return_lse``.
    ``num_kv_splits`` and the block sizes default to :func:`default_config`; ``num_kv_splits=1`` is the fused single
    pass. No host synchronisation: split ranges are computed on the device from ``prefix_lens``, so the call can be
    captured in a CUDA graph.
    """
    from sglang_kimi.kernels.interpret import launch

    BN, H, D = q.shape
    B = req_pool_indices.numel()
    N = BN // B if B else 0
    if B == 0:
        empty = torch.empty(0, H, kv_lora_rank, dtype=q.dtype, device=q.device)
        return (empty, torch.empty(0, H, dtype=torch.float32, device=q.device)) if return_lse else empty
    if B * N != BN or N < 1 or N > MAX_TREE_NODES:
        raise ValueError(f"q must be [B*N, H, D] with 1 <= N <= {MAX_TREE_NODES}; got {BN} rows for batch {B}")
    rope = D - kv_lora_rank
    kv = kv_cache.reshape(kv_cache.shape[0], -1)
    if kv.shape[1] != D or kv.stride(1) != 1 or q.stride(2) != 1:
        raise ValueError(f"kv_cache rows must be contiguous with width {D} (= q's last dim)")
    if tree_mask.dtype == torch.bool:
        bits = pack_tree_mask(tree_mask)
    else:
        bits = tree_mask
        if tuple(bits.shape) != (B, N) or bits.dtype not in (torch.int32, torch.int64):
            raise ValueError("a packed tree mask must be int32/int64 [B, N]")
        if bits.dtype == torch.int32 and N > 32:
            raise ValueError("an int32 packed mask holds at most 32 nodes; use int64")
    bits = bits.contiguous()
    cfg = default_config(N, H, B, req_to_token.shape[1], q.device)
    for key, value in (
        ("num_kv_splits", num_kv_splits),
        ("block_m", block_m),
        ("block_n", block_n),
        ("num_warps", num_warps),
        ("num_stages", num_stages),
        ("k_rows", k_rows),
    ):
        if value is not None:
            cfg[key] = value
    if out is None:
        out = torch.empty(BN, H, kv_lora_rank, dtype=q.dtype, device=q.device)
    lse = torch.empty(BN, H, dtype=torch.float32, device=q.device)
    block_dv = triton.next_power_of_2(kv_lora_rank)
    block_pe = max(16, triton.next_power_of_2(max(rope, 1)))
    splits = int(cfg["num_kv_splits"])
    fused = splits == 1
    tiles = triton.cdiv(N * H, cfg["block_m"])
    rows = BN * H
    if fused:
        part_o, part_lse, grid = out, lse, (tiles, 1, B)
        stride_ot, stride_oh = out.stride(0), out.stride(1)
    else:
        part_o = torch.empty(splits + 1, rows, block_dv, dtype=torch.float32, device=q.device)
        part_lse = torch.empty(splits + 1, rows, dtype=torch.float32, device=q.device)
        grid = (tiles, splits + 1, B)
        stride_ot, stride_oh = 0, 0
    launch(
        _tree_mla_fwd_kernel,
        grid,
        q,
        kv,
        req_to_token,
        req_pool_indices,
        prefix_lens,
        bits,
        part_o,
        part_lse,
        sm_scale * LOG2E,
        N,
        H,
        splits,
        q.stride(0),
        q.stride(1),
        kv.stride(0),
        req_to_token.stride(0),
        stride_ot,
        stride_oh,
        rows,
        KV_LORA=kv_lora_rank,
        ROPE=rope,
        BLOCK_DV=block_dv,
        BLOCK_PE=block_pe,
        BLOCK_M=cfg["block_m"],
        BLOCK_N=cfg["block_n"],
        FUSED=fused,
        K_ROWS=bool(cfg["k_rows"]),
        num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"],
    )
    if not fused:
        block_r = 8
        launch(
            _tree_mla_merge_kernel,
            (triton.cdiv(rows, block_r),),
            part_o,
            part_lse,
            out,
            lse,
            splits + 1,
            rows,
            H,
            out.stride(0),
            out.stride(1),
            KV_LORA=kv_lora_rank,
            BLOCK_DV=block_dv,
            BLOCK_R=block_r,
            num_warps=4,
        )
    return (out, lse) if return_lse else out


def mla_sm_scale(qk_nope_head_dim: int = 128, qk_rope_head_dim: int = 64, mscale: float = 1.0) -> float:
    """Kimi/DeepSeek softmax scale: ``mscale**2 / sqrt(qk_nope + qk_rope)`` (mscale from YaRN, 1.0 without)."""
    return mscale * mscale / math.sqrt(qk_nope_head_dim + qk_rope_head_dim)
