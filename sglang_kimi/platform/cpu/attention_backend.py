"""``kimi_cpu``: an attention backend for SGLang on CPU that serves every forward mode speculative decoding uses.

Torch ops only, computed in float32. SGLang's CPU backends cover only part of speculative decoding:
``torch_native`` has no TARGET_VERIFY, tree masks or multi-step draft decode, and ``intel_amx`` needs the compiled
CPU ``sgl_kernel``. This backend reads the paged KV cache through ``req_to_token`` like every SGLang backend and
serves:

===================== ============================================================================================
forward mode          what a query row sees (``p`` = committed prefix of its request, keys in position order)
===================== ============================================================================================
EXTEND, MIXED,        the prefix and the extend tokens up to itself (causal), or all of them for
DRAFT_EXTEND(_V2)     ``AttentionType.ENCODER_ONLY`` layers; a sliding window when the layer has one
DECODE                the request's ``seq_len`` tokens (its own KV was just written at ``out_cache_loc``)
DECODE, EAGLE draft   step i of the multi-step draft (:class:`KimiCpuMultiStepDraftBackend`): row (request b,
step i                branch k) sees the prefix and its branch's draft slots ``p + k*num_steps + 0..i``
                      (SGLang's ``generate_draft_decode_kv_indices`` layout, page size 1)
TARGET_VERIFY         ``N = rows / bs`` draft tokens per request at positions ``p .. p+N-1``: the prefix plus
                      - all N tokens for ENCODER_ONLY layers (DFLASH's non-causal draft block),
                      - the causal chain when ``spec_info.custom_mask`` is None (DFLASH verify),
                      - the tree nodes ``custom_mask`` allows otherwise (EAGLE trees), in either SGLang layout:
                        QLEN_ONLY ``[bs, N, N]`` or FULL_MASK (row i of request b spans ``p_b + N`` columns,
                        blocks back to back), told apart by size (a QLEN_ONLY mask has exactly bs*N*N cells)
===================== ============================================================================================

MLA (DeepSeek/Kimi, absorbed form): the key is the latent cache row ``[kv_lora ++ rope]`` (one KV head) and the
value its first ``kv_lora`` columns, which ``MLATokenToKVPool.get_value_buffer`` returns; TARGET_VERIFY over an
MLA pool goes through :func:`sglang_kimi.kernels.tree_mla_attention.tree_mla_attention_ref` (the torch twin of the
plugin's GPU tree-MLA kernel). The DeepSeek attention-method registry maps ``kimi_cpu`` to the absorbed path in
every mode (see ``sglang_kimi/platform/cpu/cpu_path_fixes.py``), so prefill never takes the per-head MHA path.

No CUDA graphs (SGLang disables them on CPU): the graph hooks raise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

import torch
from sglang.srt.layers.attention.base_attn_backend import AttentionBackend
from sglang.srt.layers.radix_attention import AttentionType
from sglang.srt.mem_cache.memory_pool import KVWriteLoc
from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool
from sglang.srt.model_executor.forward_batch_info import ForwardBatch

if TYPE_CHECKING:
    from sglang.srt.layers.radix_attention import RadixAttention
    from sglang.srt.model_executor.model_runner import ModelRunner

from sglang_kimi.platform.cpu import KIMI_CPU_BACKEND as BACKEND_NAME

CAUSAL = "causal"  # query j of the extend part sees keys < prefix + j + 1
FULL = "full"  # every key visible (ENCODER_ONLY)


@dataclass
class KeyGroup:
    """Query rows ``q_start:q_end`` attend over the KV slots ``slots`` (in position order) under ``mask``:
    ``CAUSAL`` (with ``prefix`` keys before the first query), ``FULL``, or an explicit bool ``[rows, keys]``."""

    q_start: int
    q_end: int
    slots: torch.Tensor  # [L] long
    mask: object  # CAUSAL | FULL | torch.Tensor [q_end - q_start, L] bool
    prefix: int = 0  # keys before the first query row's own position (CAUSAL)
    first_position: int = 0  # absolute position of the first query row (sliding window)


@dataclass
class VerifyLayout:
    """TARGET_VERIFY metadata: ``bs`` requests of ``num_tokens`` rows each after ``prefix_lens`` committed tokens;
    ``tree_mask`` [bs, N, N] (None: causal chain); every node sees the whole prefix."""

    prefix_lens: torch.Tensor  # [bs] long
    num_tokens: int
    tree_mask: Optional[torch.Tensor]


class KimiCpuAttnBackend(AttentionBackend):
    """See the module docstring. ``draft_step`` set: step ``draft_step`` of EAGLE's multi-step draft decode."""

    needs_cpu_seq_lens = True

    def __init__(
        self,
        model_runner: ModelRunner,
        *,
        draft_step: Optional[int] = None,
        topk: int = 1,
        num_steps: int = 1,
    ):
        super().__init__()
        self.device = model_runner.device
        self.req_to_token_pool = model_runner.req_to_token_pool
        self.token_to_kv_pool = model_runner.token_to_kv_pool
        if isinstance(self.token_to_kv_pool, SWAKVPool) and self.token_to_kv_pool.swa_layer_nums > 0:
            raise NotImplementedError(
                f"the {BACKEND_NAME} attention backend does not support hybrid sliding-window KV pools"
            )
        page_size = getattr(model_runner, "page_size", 1) or 1
        if page_size != 1:
            raise NotImplementedError(f"the {BACKEND_NAME} attention backend needs --page-size 1, got {page_size}")
        self.kv_lora_rank = getattr(self.token_to_kv_pool, "kv_lora_rank", None)  # set on MLA pools
        self.draft_step = draft_step
        self.topk = topk
        self.num_steps = num_steps
        self.forward_metadata = None

    # -- metadata ---------------------------------------------------------------------------------------------

    def init_forward_metadata(self, forward_batch: ForwardBatch):
        mode = forward_batch.forward_mode
        if mode.is_idle():
            self.forward_metadata = None
        elif mode.is_target_verify():
            self.forward_metadata = self._verify_layout(forward_batch)
        elif mode.is_decode():
            self.forward_metadata = (
                self._draft_decode_groups(forward_batch)
                if self.draft_step is not None
                else self._decode_groups(forward_batch)
            )
        else:
            self.forward_metadata = self._extend_groups(forward_batch)

    def _rows(self, forward_batch: ForwardBatch, lengths: torch.Tensor, starts: Optional[torch.Tensor] = None):
        """Per request the KV slots of positions ``starts[b] .. starts[b] + lengths[b] - 1`` (default start 0)."""
        req_to_token = self.req_to_token_pool.req_to_token
        rpi = forward_batch.req_pool_indices.tolist()
        lengths = lengths.tolist()
        starts = [0] * len(lengths) if starts is None else starts.tolist()
        return [req_to_token[r, s : s + n].to(torch.long) for r, s, n in zip(rpi, starts, lengths)]

    def _extend_groups(self, forward_batch: ForwardBatch) -> list[KeyGroup]:
        prefix = forward_batch.extend_prefix_lens
        extend = forward_batch.extend_seq_lens
        slots = self._rows(forward_batch, prefix.to(torch.long) + extend.to(torch.long))
        groups, q = [], 0
        for b, (p, n) in enumerate(zip(prefix.tolist(), extend.tolist())):
            groups.append(KeyGroup(q, q + n, slots[b], CAUSAL, prefix=p, first_position=p))
            q += n
        return groups

    def _decode_groups(self, forward_batch: ForwardBatch) -> list[KeyGroup]:
        seq_lens = forward_batch.seq_lens.to(torch.long)
        slots = self._rows(forward_batch, seq_lens)
        return [KeyGroup(b, b + 1, slots[b], FULL, first_position=n - 1) for b, n in enumerate(seq_lens.tolist())]

    def _draft_decode_groups(self, forward_batch: ForwardBatch) -> list[KeyGroup]:
        # rows: (request b, branch k) -> b * topk + k; the branch's draft slots follow the prefix at
        # p + k * num_steps (EAGLE's assign_draft_cache_locs layout) and steps 0..draft_step are written.
        seq_lens = forward_batch.seq_lens.to(torch.long)
        prefix_slots = self._rows(forward_batch, seq_lens)
        req_to_token = self.req_to_token_pool.req_to_token
        groups = []
        for b, (r, p) in enumerate(zip(forward_batch.req_pool_indices.tolist(), seq_lens.tolist())):
            for k in range(self.topk):
                start = p + k * self.num_steps
                branch = req_to_token[r, start : start + self.draft_step + 1].to(torch.long)
                row = b * self.topk + k
                slots = torch.cat([prefix_slots[b], branch])
                groups.append(KeyGroup(row, row + 1, slots, FULL, first_position=p + self.draft_step))
        return groups

    def _verify_layout(self, forward_batch: ForwardBatch) -> VerifyLayout:
        bs = forward_batch.batch_size
        num_tokens = forward_batch.input_ids.shape[0] // bs if forward_batch.input_ids is not None else None
        spec_info = forward_batch.spec_info
        if num_tokens is None or num_tokens <= 0:
            num_tokens = int(getattr(spec_info, "draft_token_num", 0) or spec_info.num_tokens_per_req)
        prefix_lens = forward_batch.seq_lens[:bs].to(torch.long)
        custom_mask = getattr(spec_info, "custom_mask", None) if spec_info is not None else None
        tree_mask = None
        if custom_mask is not None:
            # attention data parallelism pads the batch after the verify input was built: its drafts count the real
            # rows
            draft = getattr(spec_info, "draft_token", None)
            real = min(bs, draft.numel() // num_tokens) if draft is not None else bs
            tree_mask = read_verify_mask(custom_mask, prefix_lens, num_tokens, real=real)
        return VerifyLayout(prefix_lens, num_tokens, tree_mask)

    # -- forward ----------------------------------------------------------------------------------------------

    def _save_kv(self, layer, forward_batch, k, v, save_kv_cache):
        if save_kv_cache and k is not None and v is not None:
            cache_loc = forward_batch.encoder_out_cache_loc if layer.is_cross_attention else forward_batch.out_cache_loc
            # SGLang 0.5.22+ marks physical locs (the unified pool refuses unmarked ones); 0.5.20-0.5.21 have no mark
            physical = getattr(forward_batch, "out_cache_loc_is_physical", None)
            loc = KVWriteLoc(cache_loc) if physical is None else KVWriteLoc(cache_loc, physical=physical)
            self.token_to_kv_pool.set_kv_buffer(layer, loc, k, v)

    def _check_layer(self, layer, kwargs):
        unsupported = {key for key, value in kwargs.items() if value is not None}
        if unsupported:
            raise NotImplementedError(
                f"the {BACKEND_NAME} attention backend does not support {sorted(unsupported)} (layer {layer.layer_id})"
            )
        if layer.is_cross_attention:
            raise NotImplementedError(f"the {BACKEND_NAME} attention backend does not support cross-attention")

    def forward_decode(self, q, k, v, layer: RadixAttention, forward_batch: ForwardBatch, save_kv_cache=True, **kwargs):
        self._check_layer(layer, kwargs)
        self._save_kv(layer, forward_batch, k, v, save_kv_cache)
        return self._attend_groups(q, layer, self.forward_metadata)

    def forward_extend(self, q, k, v, layer: RadixAttention, forward_batch: ForwardBatch, save_kv_cache=True, **kwargs):
        self._check_layer(layer, kwargs)
        self._save_kv(layer, forward_batch, k, v, save_kv_cache)
        if forward_batch.forward_mode.is_target_verify():
            return self._attend_verify(q, layer, forward_batch, self.forward_metadata)
        return self._attend_groups(q, layer, self.forward_metadata)

    def _kv_buffers(self, layer):
        return (
            self.token_to_kv_pool.get_key_buffer(layer.layer_id),
            self.token_to_kv_pool.get_value_buffer(layer.layer_id),
        )

    def _attend_groups(self, q, layer, groups: list[KeyGroup]):
        heads, dk, dv = layer.tp_q_head_num, layer.qk_head_dim, layer.v_head_dim
        q = q.reshape(-1, heads, dk)
        out = q.new_empty((q.shape[0], heads, dv))
        k_cache, v_cache = self._kv_buffers(layer)
        window = layer.sliding_window_size if layer.sliding_window_size is not None else -1
        non_causal = layer.attn_type == AttentionType.ENCODER_ONLY
        for g in groups:
            rows = g.q_end - g.q_start
            if rows == 0:
                continue
            mask = g.mask
            if mask is CAUSAL and non_causal:
                mask = FULL
            if mask is CAUSAL:
                key_pos = torch.arange(g.slots.numel(), device=q.device)
                query_pos = g.prefix + torch.arange(rows, device=q.device)
                mask = key_pos[None, :] <= query_pos[:, None]
            if window > -1:
                # keys at absolute positions >= query position - window (keys are positions 0.. in order)
                key_pos = torch.arange(g.slots.numel(), device=q.device)
                query_pos = g.first_position + torch.arange(rows, device=q.device)
                in_window = key_pos[None, :] >= query_pos[:, None] - window
                mask = in_window if mask is FULL else (mask & in_window)
            out[g.q_start : g.q_end] = attend(
                q[g.q_start : g.q_end],
                k_cache[g.slots],
                v_cache[g.slots],
                None if mask is FULL else mask,
                layer.scaling,
                logit_cap=layer.logit_cap,
            ).to(out.dtype)
        return out.view(q.shape[0], heads * dv)

    def _attend_verify(self, q, layer, forward_batch: ForwardBatch, layout: VerifyLayout):
        heads, dk, dv = layer.tp_q_head_num, layer.qk_head_dim, layer.v_head_dim
        bs, n = layout.prefix_lens.numel(), layout.num_tokens
        if q.shape[0] != bs * n:
            raise RuntimeError(f"TARGET_VERIFY got {q.shape[0]} query rows for {bs} requests of {n} tokens")
        q = q.reshape(bs * n, heads, dk)
        if layer.sliding_window_size is not None and layer.sliding_window_size > -1:
            raise NotImplementedError(
                f"the {BACKEND_NAME} attention backend does not support sliding-window layers in TARGET_VERIFY"
            )
        non_causal = layer.attn_type == AttentionType.ENCODER_ONLY
        if non_causal:
            tree = torch.ones(bs, n, n, dtype=torch.bool, device=q.device)
        elif layout.tree_mask is None:
            tree = torch.ones(n, n, dtype=torch.bool, device=q.device).tril().expand(bs, n, n)
        else:
            tree = layout.tree_mask
        k_cache, v_cache = self._kv_buffers(layer)
        is_mla = (
            self.kv_lora_rank is not None
            and layer.tp_k_head_num == 1
            and dv == self.kv_lora_rank
            and k_cache.shape[-1] == dk
        )
        if is_mla:
            from sglang_kimi.kernels.tree_mla_attention import tree_mla_attention_ref

            out = tree_mla_attention_ref(
                q,
                k_cache,
                self.req_to_token_pool.req_to_token,
                forward_batch.req_pool_indices,
                layout.prefix_lens,
                tree,
                layer.scaling,
                kv_lora_rank=self.kv_lora_rank,
            )
            return out.reshape(bs * n, heads * dv)
        out = q.new_empty((bs * n, heads, dv))
        slots = self._rows(forward_batch, layout.prefix_lens + n)
        for b, p in enumerate(layout.prefix_lens.tolist()):
            visible = torch.ones(n, p + n, dtype=torch.bool, device=q.device)
            visible[:, p:] = tree[b]
            out[b * n : (b + 1) * n] = attend(
                q[b * n : (b + 1) * n],
                k_cache[slots[b]],
                v_cache[slots[b]],
                visible,
                layer.scaling,
                logit_cap=layer.logit_cap,
            ).to(out.dtype)
        return out.view(bs * n, heads * dv)

    # -- the parts of the backend interface only GPU paths use ------------------------------------------------

    def update_verify_buffers_to_fill_after_draft(self, spec_info, cuda_graph_bs):
        """Metadata is built from the verify input at ``init_forward_metadata``: nothing precomputed to refresh."""

    def get_cuda_graph_seq_len_fill_value(self):
        return 1

    def get_cpu_graph_seq_len_fill_value(self):
        # the length SGLang gives the rows it pads a batch with on CPU (attention data parallelism syncs batch sizes)
        return 1

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int):
        raise NotImplementedError(f"the {BACKEND_NAME} attention backend runs without CUDA graphs")

    def init_forward_metadata_out_graph(self, forward_batch: ForwardBatch, in_capture: bool = False):
        raise NotImplementedError(f"the {BACKEND_NAME} attention backend runs without CUDA graphs")

    def support_triton(self):
        return False


class KimiCpuMultiStepDraftBackend:
    """EAGLE's multi-step draft decode on CPU: one :class:`KimiCpuAttnBackend` per draft step (steps
    ``0 .. num_steps - 2``; the last step only samples), as SGLang's ``TritonMultiStepDraftBackend``."""

    needs_cpu_seq_lens = True

    def __init__(self, model_runner: ModelRunner, topk: int, speculative_num_steps: int):
        self.topk = topk
        self.speculative_num_steps = speculative_num_steps
        self.attn_backends = [
            KimiCpuAttnBackend(model_runner, draft_step=i, topk=topk, num_steps=speculative_num_steps)
            for i in range(speculative_num_steps - 1)
        ]

    def init_forward_metadata(self, forward_batch: ForwardBatch):
        for backend in self.attn_backends:
            backend.init_forward_metadata(forward_batch)

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int):
        raise NotImplementedError(f"the {BACKEND_NAME} attention backend runs without CUDA graphs")

    def init_forward_metadata_out_graph(self, forward_batch: ForwardBatch, in_capture: bool = False):
        raise NotImplementedError(f"the {BACKEND_NAME} attention backend runs without CUDA graphs")

    def init_forward_metadata_in_graph(self, forward_batch: ForwardBatch):
        raise NotImplementedError(f"the {BACKEND_NAME} attention backend runs without CUDA graphs")


def attend(
    q: torch.Tensor,  # [n, Hq, Dk]
    keys: torch.Tensor,  # [L, Hk, Dk]
    values: torch.Tensor,  # [L, Hk, Dv]
    visible: Optional[torch.Tensor],  # [n, L] bool, None: all visible
    scale: float,
    *,
    logit_cap: float = 0.0,
) -> torch.Tensor:
    """softmax(q k^T * scale, masked) v in float32 with grouped KV heads (query head h reads KV head
    h // (Hq / Hk)); a row that sees no key gets 0. Returns [n, Hq, Dv] float32."""
    n, hq, _ = q.shape
    hk = keys.shape[1]
    if hq != hk:
        keys = keys.repeat_interleave(hq // hk, dim=1) if hk > 1 else keys.expand(-1, hq, -1)
        values = values.repeat_interleave(hq // hk, dim=1) if hk > 1 else values.expand(-1, hq, -1)
    scores = torch.einsum("nhd,lhd->hnl", q.float(), keys.float()) * scale  # [Hq, n, L]
    if logit_cap and logit_cap > 0:
        scores = logit_cap * torch.tanh(scores / logit_cap)
    if visible is not None:
        scores = scores.masked_fill(~visible[None], float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return torch.einsum("hnl,lhd->nhd", probs, values.float())


def read_verify_mask(custom_mask: torch.Tensor, prefix_lens: torch.Tensor, n: int, real: int | None = None):
    """SGLang's verify mask as the trees' masks (bool [bs, N, N]), ``bs`` = the rows of ``prefix_lens``, of which
    the first ``real`` (default all) have cells in the mask.

    QLEN_ONLY (``eagle_utils.build_tree_kernel_efficient`` on CPU): exactly ``bs * N * N`` cells, request-major,
    row = query node, column = key node.
    FULL_MASK (GPU layout; ``build_tree_kernel_efficient`` with ``TreeMaskMode.FULL_MASK``, the DFLASH tree worker):
    request b's block starts at ``N * sum(p_<b) + N * N * b`` and holds N rows of ``p_b + N`` cells (prefix columns,
    then the tree); the buffer may be longer than the blocks (SGLang over-allocates it). The prefix cells are not
    read: every node sees the whole prefix, as SGLang's Triton verify kernels take it (``skip_prefix_custom_mask``),
    so a writer need not fill them.

    Rows past ``real`` are the ones attention data parallelism pads a batch with (KV written to the reserved slot
    0, outputs dropped): no cells in the mask, a causal tree.
    """
    bs = prefix_lens.shape[0]
    real = bs if real is None else real
    flat = custom_mask.reshape(-1).to(torch.bool)
    causal = torch.ones(n, n, dtype=torch.bool, device=flat.device).tril().expand(bs - real, n, n)  # padding rows
    if flat.numel() == real * n * n:
        return torch.cat([flat.view(real, n, n), causal])
    # cell (b, i, j) of the tree block: start_b + i * (p_b + N) + p_b + j, start_b = N * sum_{c<b} (p_c + N)
    prefix = prefix_lens[:real].to(device=flat.device, dtype=torch.long)  # [real]
    row_len = prefix + n  # [real]
    starts = n * (row_len.cumsum(0) - row_len)  # [real]
    nodes = torch.arange(n, device=flat.device)
    cells = (starts + prefix)[:, None, None] + nodes[None, :, None] * row_len[:, None, None] + nodes  # [real, N, N]
    return torch.cat([flat[cells], causal])
