"""DFLASH with DDTree draft trees: one DFlash pass, a best-first tree of its per-position marginals, one tree verify.

SGLang's ``DFlashWorkerV2`` drafts a block and verifies it as a chain. :class:`DFlashTreeWorker` keeps its prefill,
its draft forward and its draft-KV bookkeeping, and replaces the decode step:

1. draft: the block ``[bonus, mask x (B-1)]`` through the DFlash drafter (non-causal, context = the drafter's KV of
   the committed tokens), then the target's LM head ranks each position's best K = budget tokens (tensor-parallel:
   each rank ranks its vocabulary shard; the shards' candidates and log-sum-exps are gathered in one all-gather);
2. tree: DDTree (``speculators.ddtree.build_ddtree_ranked``; the Triton ``kernels.ddtree_build`` on a GPU) with
   ``budget`` nodes below the root, padded to the N = budget + 1 slots of the verify window;
3. verify: the target over the N nodes at positions ``prefix + depth`` with the ancestor mask (``DFlashVerifyInput``
   with a FULL_MASK custom mask); greedy or target-only sampled tree verification (``speculators.verify``);
4. commit: the accepted path moves to the front of the window by permuting the request's ``req_to_token`` slots
   (its KV was written at the final positions already), so the rest of SGLang, the drafter's KV append included,
   sees a chain of ``accepted + 1`` committed tokens.

The ranking, the tree and the commit are ``speculators.tree_step``'s static-shape functions: nothing in the step
outside SGLang's own calls reads the device on the host (``docs/ddtree.md``, "The step without host
synchronisation"); the tree mask's blocks are written in place (``tree_verify_inputs.write_tree_mask``).

With CUDA graphs the verify of the full window replays SGLang's target graph, captured with the tree mask
(``tree_verify_graphs.py``), and the drafter replays its own graphs, captured at the block's width with the ranking
and the tree build as their captured tail (``drafter_graph.py``; at TP > 1 with the candidates' all-gather in the
graph); narrower windows and larger batches run eager.

Under DP attention (``--enable-dp-lm-head``) each attention group drafts, ranks and verifies its own requests as
SGLang's DFLASH chain worker does: the drafter embeds with SGLang's whole DP table, the ranking gathers over the
group the LM head is split over (the attention-TP group), the verify is planned after SGLang's DP padding and runs
eager in rounds where a group idles or prefills, and a group without requests runs SGLang's empty verify at the
tree's window (:meth:`DFlashTreeWorker._idle_step`). Every step verifies the full window there (``docs/scale-out.md``).

With ``--speculative-kimi-adaptive`` the same worker serves DFLASH chains too, and each step runs the width ``w``
the policy chose for its batch (``speculative/adaptive/runtime.py``): w drafts of a chain or a tree of w nodes, a
verify window of w + 1 tokens (the verify forward really shrinks; SGLang keeps reserving the widest window, so
nothing is freed or re-planned), or with w = 0 no draft at all (a one-token verify: a plain decode step that still
feeds the drafter's context). A chain of the block's full width is SGLang's own DFLASH chain step
(:meth:`DFlashTreeWorker._chain_step`: its drafter graph with the in-graph argmax, its causal verify graph), so
adaptive chains never cost more than SGLang's chain where the policy settles on it; a narrower chain is the path
tree of the block's first w argmax drafts.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from sglang.kernels.ops.speculative.cache_locs import assign_extend_cache_locs_func
from sglang.srt.layers.logprob_processor import compute_spec_logprobs
from sglang.srt.lora.layers import unwrap_lora_layer
from sglang.srt.managers.scheduler import GenerationBatchResult
from sglang.srt.model_executor.forward_batch_info import (
    CaptureHiddenMode,
    ForwardBatch,
    ForwardMode,
    enable_num_token_non_padded,
)
from sglang.srt.runtime_context import get_parallel
from sglang.srt.speculative.dflash_info import DFlashVerifyInput
from sglang.srt.speculative.dflash_info_v2 import DFlashDraftInputV2
from sglang.srt.speculative.dflash_utils import apply_dflash_verify_logits_adjustments, is_dense_head_weight
from sglang.srt.speculative.dflash_worker_v2 import (
    DFlashWorkerV2,
    _resolve_dflash_embedding_module,
    _selector_lattice,
)
from sglang.srt.speculative.draft_worker_common import build_block_pos_offsets, make_draft_block_spec_info
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
from sglang.srt.speculative.spec_utils import (
    GrammarTree,
    build_grammar_vocab_mask,
    draft_tp_context,
    record_stream_each,
)

try:  # return_sampling_mask for speculative decoding (a release without it has no such request option)
    from sglang.srt.speculative.spec_sampling_mask import SpeculativeSamplingMaskCapture
except ImportError:
    SpeculativeSamplingMaskCapture = None

from sglang_kimi.settings import DRAFT_GRAPHS_ENV, debug_greedy_verify, plugin_args
from sglang_kimi.speculative.acceptance_trace import append_paths, trace_file
from sglang_kimi.speculative.metrics import draft_health
from sglang_kimi.speculative.step_phases import NO_PHASES, StepPhases, step_clock, step_phases
from sglang_kimi.speculative.workers.custom_processors import apply_processors, exact_step
from sglang_kimi.speculative.workers.drafter_graph import (
    DraftTail,
    block_width,
    check_replays,
    draft_graphs,
    same_draft,
)
from sglang_kimi.speculative.workers.penalty_hooks import apply_exact_penalties, verify_penalties
from sglang_kimi.speculative.workers.sampled_verify import sampled_result_from_rank0
from sglang_kimi.speculative.workers.tree_attention import prepare_tree_verify
from sglang_kimi.speculative.workers.tree_verify_graphs import check_target_graphs, mark_tree_verify
from sglang_kimi.speculative.workers.tree_verify_inputs import (
    requests_max_top_k,
    tree_mask_capacity,
    verify_coins,
    verify_probs,
    write_tree_mask,
)
from sglang_kimi.speculators.tree_step import (
    CommitLayout,
    chain_window,
    commit_layout,
    rank_draft_hidden,
    rank_draft_hidden_sharded,
    tree_from_ranked,
)
from sglang_kimi.speculators.trees import DraftTree, build_chain
from sglang_kimi.speculators.verify import VerifyResult, verify_tree
from sglang_kimi.speculators.window import gather_rows

logger = logging.getLogger(__name__)


def _attn_dp_enabled(parallel) -> bool:
    """SGLang 0.5.22+ publishes ``attn_dp_enabled``; 0.5.20-0.5.21 publish the flag ``enable_dp_attention``."""
    try:
        return bool(parallel.attn_dp_enabled)
    except AttributeError:
        return bool(parallel.enable_dp_attention)


def _dp_round_runs_eager(batch, verify_batch) -> bool:
    """Under DP attention the verify runs eager, as SGLang's DFLASH verify does, in a round where another attention
    group is idle (it runs an eager empty verify with raw token counts, a replay assumes the padded bucket) or
    prefills (its raw counts disagree with the window-scaled ones): otherwise the ranks' DP-gather offsets differ."""
    counts = verify_batch.original_global_num_tokens_cpu  # requests of each attention group this round
    return bool(batch.is_extend_in_batch) or (counts is not None and min(counts) == 0)


# The batch's tensors a tree step records on its forward stream (:func:`_record_scheduler_tensors`): what SGLang's
# DFLASH chain records (``seq_lens``) and what its EAGLE verify records (``record_stream_for_v2_verify``), since the
# step rebinds ``input_ids`` and ``out_cache_loc`` as that verify does.
RECORDED_BATCH_TENSORS = ("seq_lens", "req_pool_indices", "input_ids", "out_cache_loc")


def _record_scheduler_tensors(batch, stream=None):
    """Under SGLang's overlap scheduler a decode step's batch tensors come from the previous iteration, produced on
    another stream, and the step drops the batch's only reference to some of them: the caching allocator must not
    hand their memory to the next iteration while this step's kernels still read it. Records
    :data:`RECORDED_BATCH_TENSORS` and the draft state's bonus tokens (the drafter's block reads them) on ``stream``
    (the current stream of the batch's device when None), CUDA tensors only (SGLang's ``record_stream_each``; on a
    CPU nothing is recorded). The tree step rebinds ``batch.out_cache_loc`` (the verify's slots) and
    ``batch.input_ids`` (the tree's tokens, in ``prepare_for_verify``) without restoring them, so it calls this
    again after the rebind; ``seq_lens_cpu`` and ``seq_lens_sum`` (host values) it restores. Returns the stream."""
    if stream is None:
        if batch.seq_lens.device.type == "cpu":
            return None
        stream = torch.get_device_module(batch.seq_lens.device).current_stream()
    tensors = [getattr(batch, name, None) for name in RECORDED_BATCH_TENSORS]
    record_stream_each([*tensors, getattr(batch.spec_info, "bonus_tokens", None)], stream)
    return stream


@dataclass(frozen=True)
class HeadShard:
    """This rank's part of the target's LM head, as the draft ranking (eager and the drafter graphs' tail) uses it."""

    weight: torch.Tensor  # [rows, H]: this rank's vocabulary rows, padding cut
    vocab_start: int  # token id of the first row
    group: object | None  # the group the rows are split over; None: the whole vocabulary is here


def _head_shard(lm_head, vocab: int) -> HeadShard:
    """``lm_head``'s rows on this rank (``vocab``: the served vocabulary), split over the TP group, or with
    ``--enable-dp-lm-head`` under DP attention over the attention-TP group (``ParallelLMHead.use_attn_tp_group``)."""
    shard = getattr(lm_head, "shard_indices", None)
    if shard is not None:  # an unsharded head: no group to ask
        parallel = get_parallel()
        group = parallel.attn_tp_group if getattr(lm_head, "use_attn_tp_group", False) else parallel.tp_group
        if int(group.world_size) > 1:
            rows = int(shard.num_org_elements)
            return HeadShard(lm_head.weight[:rows], int(shard.org_vocab_start_index), group)
    return HeadShard(lm_head.weight[:vocab], 0, None)


def _draft_tp_scope(worker):
    """The TP scope DFlashWorkerV2 enters around its own draft forwards; how it is entered changed in each release:
    0.5.23 ``draft_tp_context(self.draft_parallel_layout)``, 0.5.22 ``draft_tp_context(self.draft_owns_attention)``,
    0.5.21 ``self.draft_tp_context(tp_group, owns_attention=...)``, 0.5.20 ``self.draft_tp_context(tp_group)``."""
    own = vars(worker)  # DFlashWorkerV2.__getattr__ falls back to the target worker: read the worker's own attributes
    if "draft_parallel_layout" in own:
        return draft_tp_context(own["draft_parallel_layout"])
    if "draft_tp_context" not in own:
        return draft_tp_context(own["draft_owns_attention"])
    group = worker.draft_model_runner.tp_group
    if "draft_owns_attention" in own:
        return worker.draft_tp_context(group, owns_attention=own["draft_owns_attention"])
    return worker.draft_tp_context(group)


@dataclass
class StepPlan:
    """A decode step's width and KV slots (:meth:`DFlashTreeWorker._plan_step`)."""

    draft_input: DFlashDraftInputV2  # the batch's draft state as the step found it (the verify replaces spec_info)
    bs: int
    width: int  # w: drafts of a chain or nodes of a tree, 0 for none
    window: int  # N = w + 1 verify slots a request
    started: object  # the adaptive policy's clock of this step, None without adaptive
    prefix_lens: torch.Tensor  # [bs]: committed lengths
    seq_lens_cpu: torch.Tensor  # [>= bs] host lengths (or SGLang's reserved bound under overlap)
    window_slots: torch.Tensor  # [bs, max(N, B)]: the slots SGLang reserved from the prefix on
    verify_slots: torch.Tensor  # [bs, N]: the verify's, node i in column i
    kv_loc_plan: object  # the verify's KV plan


@dataclass
class WindowDraft:
    """The step's draft padded to the window (:meth:`DFlashTreeWorker._draft_window`)."""

    tree: DraftTree  # N slots a request
    positions: torch.Tensor  # [bs, N]: prefix + depth
    ancestor: torch.Tensor  # [bs, N, N] bool


class DFlashTreeWorker(DFlashWorkerV2):
    """``--speculative-algorithm DFLASH --speculative-dflash-tree-budget N``: DFlash with DDTree draft trees."""

    def __init__(self, server_args, *args, **kwargs):  # SGLang 0.5.20 also passes ps (its ParallelState)
        super().__init__(server_args, *args, **kwargs)
        args = plugin_args(server_args)
        # None: adaptive DFLASH chains (path trees of the block's argmax drafts)
        self.tree_budget = None if args.dflash_tree_budget is None else int(args.dflash_tree_budget)
        # SGLang sized every per-step buffer and KV reservation by the widest verify window (set at start-up); the
        # drafter runs the (not longer) block.
        self.num_verify_tokens = int(self.block_size)
        self.block_size = int(args.dflash_tree_block)
        self.max_width = self.tree_budget if self.tree_budget is not None else self.block_size - 1
        mode = "DFLASH draft trees" if self.tree_budget is not None else "adaptive DFLASH chains"
        self.speculative_num_draft_tokens = self.num_verify_tokens
        self.draft_model.set_block_size(self.block_size)
        self._block_pos_offsets = build_block_pos_offsets(length=self.block_size, device=self.device)
        self._draft_block_spec_info = make_draft_block_spec_info(draft_token_num=self.block_size, device=self.device)
        self._use_triton_ddtree = torch.device(self.device).type == "cuda"  # CUDA and ROCm builds
        self._dp_attention = _attn_dp_enabled(get_parallel())  # each attention group serves its own requests
        for unsupported, what in (
            (self.use_compact_draft_cache, "--speculative-draft-window-size"),
            (self.selector is not None and self.tree_budget is not None, "a DFlash2 drafter (candidate selector)"),
            (self.lilicorr is not None, "a DFlash drafter with a LiLiCorr head"),
            (self._is_domino, "a Domino DFlash drafter"),
            (args.adaptive and self._dp_attention, "adaptive widths under DP attention"),
        ):
            if unsupported:
                raise ValueError(f"{mode} do not support {what}")
        lm_head = unwrap_lora_layer(getattr(self.target_worker.model_runner.model, "lm_head", None))
        if lm_head is None or not is_dense_head_weight(getattr(lm_head, "weight", None)):
            raise ValueError(f"{mode} need the target's LM head as a dense (unquantized) weight")
        if self.selector is not None:  # DFlash2 chains: its candidates come from the target's head
            self.draft_model.lm_head = lm_head
        logger.info(
            "%s: up to %d %s, draft block %d, verify window up to %d",
            mode,
            self.max_width,
            "nodes" if self.tree_budget is not None else "drafts",
            self.block_size,
            self.num_verify_tokens,
        )
        self._mode = mode
        self.adaptive = None
        self._mask_buffer: torch.Tensor | None = None  # the tree mask's buffer when the target backend has none
        self._tail: DraftTail | None = None  # the drafter graphs' captured draft side (trees, graphs captured)
        self._trace_file = trace_file()  # recording the accepted paths (acceptance_trace.py)
        self._adaptive_pending = bool(args.adaptive)  # started once the KV pools exist (its profile runs forwards)
        if self.tree_budget is not None:
            mark_tree_verify()  # the target's verify graphs, captured after this, take the tree mask
        # else SGLang's chain verify graphs, causal, for the block-wide chain step that is SGLang's own

    def init_attention_backends(self):
        """SGLang's DFLASH set-up, at the block's width: the drafter's attention metadata sized for the block it
        runs, not for the verify window ``speculative_num_draft_tokens`` holds on a tree server. Then the target's
        verify attention is checked (``tree_attention.py``)."""
        with block_width(self.block_size):
            super().init_attention_backends()
        # the backend SGLang chose for the target's verify (built by now) must apply the tree mask at the widths
        # this server verifies (fa3: its tree path, switched on before the target's graphs are captured)
        any_width = self.tree_budget is None or self._adaptive_pending
        verify_attention = prepare_tree_verify(self.target_worker.model_runner, self._mode, any_width)
        logger.info("%s: the target's verify attention is %s", self._mode, verify_attention)

    def init_cuda_graphs(self):
        """SGLang's DFLASH set-up, with the drafter's graphs captured at the block's width (as SGLang captures a
        chain's drafter whose block is this block). Trees: the draft side is their captured tail (under tensor
        parallelism with its one all-gather; built by :meth:`_maybe_build_draft_sampler`, which SGLang calls inside
        the drafter's TP context right before it captures), and the target's verify graphs must carry the tree mask.
        Adaptive chains: the tail is SGLang's own in-graph argmax and the target's graphs its causal chain verify,
        both SGLang's chain's."""
        self._tail = None
        if not draft_graphs():
            self._eager_drafter()
        else:
            try:
                with block_width(self.block_size):
                    super().init_cuda_graphs()
            except Exception as e:
                raise RuntimeError(
                    f"capturing the DFlash drafter's CUDA graphs at the block's width ({self.block_size} tokens a "
                    f"request) failed: {type(e).__name__}: {e}. Start with {DRAFT_GRAPHS_ENV}=0 to run the drafter "
                    f"eager (the target keeps its graphs)"
                ) from e
            tail = self._tail
            self._tail = tail if tail is not None and tail.captured_bs else None
        if self._tail is not None:
            logger.info(
                "DFlash drafter graphs at the block's width %d for batches %s, the draft side of width %d captured",
                self.block_size,
                sorted(self._tail.captured_bs),
                self._tail.width,
            )
        if self.tree_budget is not None:
            check_target_graphs(self.target_worker.model_runner)
        self._start_adaptive()

    def _eager_drafter(self):
        """SGLang's DFLASH set-up with its drafter capture off (as SGLang does when graphs are off)."""
        draft_worker = self._draft_worker
        capture = draft_worker.init_cuda_graphs

        def without_draft_graphs(capture_decode_cuda_graph: bool = True):
            return capture(capture_decode_cuda_graph=False)

        draft_worker.init_cuda_graphs = without_draft_graphs  # this worker's drafter only, for this call
        try:
            with block_width(self.block_size):
                super().init_cuda_graphs()
        finally:
            del draft_worker.init_cuda_graphs

    def _new_draft_tail(self) -> DraftTail:
        """The draft side as the drafter graphs' tail; under tensor parallelism with this rank's shard of the LM
        head and the group the head is split over (the ranks' candidates gathered inside the graph, as SGLang's
        chain gathers its argmax)."""
        head = self._head_shard()
        runner = self.target_worker.model_runner
        target_graphs = getattr(runner, "decode_cuda_graph_runner", None)  # captured before the drafter's
        return DraftTail(
            head.weight,
            vocab_start=head.vocab_start,
            tp_group=head.group,
            block=self.block_size,
            width=self.max_width,
            use_kernel=self._use_triton_ddtree,
            max_bs=max(int(runner.req_to_token_pool.size), int(getattr(target_graphs, "max_bs", 0) or 0)),
        )

    def _maybe_build_draft_sampler(self):
        """What SGLang folds into the drafter's graphs, called by its ``init_cuda_graphs`` inside the drafter's TP
        context just before the capture (and only when it captures). Adaptive chains: SGLang's in-graph argmax of
        the block's drafts, as its chain server captures it (the block-wide step is SGLang's chain step; a narrower
        chain takes the first drafts). Trees: no sampler of SGLang's; the draft side (:class:`DraftTail`) joins the
        capture tail hooks instead, its LM-head shard and group read here, in the same TP context as SGLang reads
        its sampler's. The hook is kept, as SGLang keeps its chain's: a later re-capture folds it in again (a
        re-capture builds a new tail, which replaces the old one)."""
        if self.tree_budget is None:
            return super()._maybe_build_draft_sampler()
        hooks = self.draft_model_runner.capture_tail_hooks
        hooks[:] = [hook for hook in hooks if not isinstance(hook, DraftTail)]
        if draft_graphs():  # with SGLANG_KIMI_DRAFT_GRAPHS=0 SGLang still asks, but the drafter is not captured
            self._tail = self._new_draft_tail()
            hooks.append(self._tail)
        return None

    def _start_adaptive(self):
        if self._adaptive_pending:
            from sglang_kimi.speculative.adaptive.dflash import start_adaptive

            self._adaptive_pending = False
            self.adaptive = start_adaptive(self, plugin_args(self.server_args))

    # ------------------------------------------------------------------------------------------------------------

    def forward_batch_generation(self, batch, on_publish=None, grammar_barrier=None, pp_proxy_tensors=None):
        if batch.forward_mode.is_extend() or batch.is_extend_in_batch:
            return super().forward_batch_generation(batch, on_publish, grammar_barrier, pp_proxy_tensors)
        if batch.forward_mode.is_idle():
            return self._idle_step(batch, on_publish, grammar_barrier, pp_proxy_tensors)
        if not isinstance(batch.spec_info, DFlashDraftInputV2):
            raise RuntimeError("DFLASH tree decode expected DFlashDraftInputV2 state on the running batch")
        width = self._step_width(len(batch.seq_lens))
        if self.tree_budget is None and width == self.block_size - 1:
            return self._chain_step(batch, on_publish, grammar_barrier, pp_proxy_tensors)
        with verify_penalties(batch), exact_step(), step_phases() as phases:
            return self._tree_decode_step(batch, width, on_publish, grammar_barrier, phases)

    def _idle_step(self, batch, on_publish, grammar_barrier, pp_proxy_tensors) -> GenerationBatchResult:
        """An attention group with no requests under DP attention: SGLang's idle DFLASH step, whose empty verify
        keeps this rank in the other groups' collectives. That verify scales the groups' request counts by its
        ``block_size``, which must be the verify window the busy groups scale by (a tree's window, not the
        drafter's block)."""
        block = self.block_size
        self.block_size = self.num_verify_tokens
        try:
            return super().forward_batch_generation(batch, on_publish, grammar_barrier, pp_proxy_tensors)
        finally:
            self.block_size = block

    def _step_width(self, bs: int) -> int:
        """The step's width: the adaptive policy's for this batch, else the widest."""
        self._start_adaptive()  # a release whose scheduler does not call init_cuda_graphs on the draft worker
        return self.adaptive.choose(bs) if self.adaptive is not None else self.max_width

    def _chain_step(self, batch, on_publish, grammar_barrier, pp_proxy_tensors) -> GenerationBatchResult:
        """Adaptive chains at the block's width: SGLang's own DFLASH chain step (its drafter graph with the in-graph
        argmax, its causal verify graph, its accept), so a server whose policy settles on the full chain costs what
        SGLang's chain server costs. The plugin's exact-penalty and sampling registrations apply to it as to
        SGLang's chain server."""
        started = self.adaptive.start()
        step_clock.drafted("sglang_chain_step")
        result = super().forward_batch_generation(batch, on_publish, grammar_barrier, pp_proxy_tensors)
        num_accepted = result.accept_lens.to(torch.int64) - 1  # [bs]: commit lengths are accepted + 1
        self.adaptive.finish(started, len(batch.seq_lens), self.block_size - 1, num_accepted, None)
        return result

    def _tree_decode_step(
        self, batch, width: int, on_publish, grammar_barrier, phases: StepPhases
    ) -> GenerationBatchResult:
        """One decode step, phase by phase (each a method below, named as its profiler range):
        plan -> draft (forward, rank, tree build) -> verify inputs -> target verify -> accept -> commit -> draft KV."""
        phases.enter("plan")
        stream = _record_scheduler_tensors(batch)  # before the step rebinds any of them
        plan = self._plan_step(batch, width)
        draft = self._draft_window(batch, plan, phases)  # module docstring 1-2: drafter, ranking, tree
        phases.enter("verify_prepare")
        verify_batch, grammar_tree = self._verify_inputs(batch, plan, draft)  # 3: the window's tokens, positions, mask
        if stream is not None:  # the rebound input ids and slots, as SGLang's EAGLE verify records them
            _record_scheduler_tensors(batch, stream)
        phases.enter("target_forward")
        target_out = self._target_verify(verify_batch)  # 3: the target over every window
        phases.enter("verify_accept")
        logits = self._verify_logits(batch, target_out, draft.tree, grammar_tree, grammar_barrier, plan.window)
        result = self._accept(batch, plan, draft, logits)  # 3: the accepted path and the bonus
        layout = self._commit(batch, plan, result, target_out.logits_output, logits)  # 4: the path as a chain
        if on_publish is not None:
            on_publish(layout.new_seq_lens)
        phases.enter("draft_kv_append")
        self._append_draft_kv(target_out.logits_output, layout)  # 4: the drafter's context
        self._record(batch, plan, result)
        return GenerationBatchResult(
            logits_output=target_out.logits_output,
            next_token_ids=layout.out_tokens.reshape(-1),
            accept_lens=layout.commit_lens,
            can_run_cuda_graph=target_out.can_run_cuda_graph,
            next_draft_input=self._make_next_draft_input_decode(
                bonus_tokens=layout.bonus, new_seq_lens=layout.new_seq_lens
            ),
            speculative_num_draft_tokens=plan.window,
            new_seq_lens=layout.new_seq_lens,
            routed_experts_output=target_out.routed_experts_output,
            indexer_topk_output=target_out.indexer_topk_output,
        )

    def _plan_step(self, batch, width: int) -> StepPlan:
        """The step's KV slots at its width: reserved by SGLang for the widest window from position prefix on; the
        verify writes the first w + 1 of them, the drafter's scratch block the first B."""
        draft_input = batch.spec_info
        bs = len(batch.seq_lens)
        started = self.adaptive.start() if self.adaptive is not None else None
        block, window = self.block_size, width + 1
        prefix_lens = batch.seq_lens  # [bs]
        seq_lens_cpu = batch.seq_lens_cpu if batch.seq_lens_cpu is not None else draft_input.nxt_kv_lens_cpu
        req_to_token = self.target_worker.model_runner.req_to_token_pool.req_to_token
        span = max(window, block) if width > 0 else window
        window_slots = assign_extend_cache_locs_func(
            req_pool_indices=batch.req_pool_indices,
            req_to_token=req_to_token,
            start_offset=prefix_lens,
            end_offset=prefix_lens + span,
            batch_size=bs,
            draft_token_num=span,
            device=self.device,
        ).view(bs, span)  # [bs, span]
        verify_slots = window_slots[:, :window].contiguous()  # [bs, w+1]
        return StepPlan(
            draft_input=draft_input,
            bs=bs,
            width=width,
            window=window,
            started=started,
            prefix_lens=prefix_lens,
            seq_lens_cpu=seq_lens_cpu,
            window_slots=window_slots,
            verify_slots=verify_slots,
            kv_loc_plan=self._plan(batch, seq_lens_cpu, verify_slots),
        )

    def _draft_window(self, batch, plan: StepPlan, phases: StepPhases) -> WindowDraft:
        """One DFlash pass over [bonus, mask x (B-1)], ranked per position by the target's LM head, and the tree
        (or chain) padded to the window, with its positions and ancestor mask; width 0: the root alone."""
        root = plan.draft_input.bonus_tokens.view(-1).long()  # [bs]
        if plan.width == 0:
            tree = build_chain(root, root.new_empty((plan.bs, 0)))
            return WindowDraft(tree, tree.positions(plan.prefix_lens), tree.ancestor_mask())
        # the drafter's scratch block takes the window's first B columns; a narrower window needs its own plan
        block = self.block_size
        draft_plan = (
            plan.kv_loc_plan
            if plan.window >= block
            else self._plan(batch, plan.seq_lens_cpu, plan.window_slots[:, :block])
        )
        return WindowDraft(
            *self._draft_tree(batch, root, plan.prefix_lens, plan.seq_lens_cpu, draft_plan, plan.width, phases)
        )

    def _verify_inputs(self, batch, plan: StepPlan, draft: WindowDraft):
        """The verify's batch: the tree's tokens and positions, its mask's blocks written in place; and the grammar's
        view of the tree when the batch is constrained. Returns (verify ForwardBatch, GrammarTree or None)."""
        bs, window, tree = plan.bs, plan.window, draft.tree
        grammar_tree = (
            GrammarTree.from_device(tree.retrieve_next_token(), tree.retrieve_next_sibling(), tree.tokens)
            if batch.has_grammar
            else None
        )
        # seq_lens_cpu: the host lengths, or SGLang's reserved upper bound when the host has none (overlap)
        host_sum = int(plan.seq_lens_cpu[:bs].sum())
        context_len = self.target_worker.model_runner.model_config.context_len
        capacity = tree_mask_capacity(host_sum, bs, window, context_len)
        verify_input = DFlashVerifyInput(
            draft_token=tree.tokens.reshape(-1),
            positions=draft.positions.reshape(-1),  # [bs*N]
            draft_token_num=window,
            custom_mask=self._tree_mask(draft.ancestor, plan.prefix_lens, capacity),
            capture_hidden_mode=CaptureHiddenMode.FULL,
            kv_loc_plan=plan.kv_loc_plan,
        )
        batch.out_cache_loc = plan.verify_slots.reshape(-1)
        saved_cpu, saved_sum = batch.seq_lens_cpu, batch.seq_lens_sum
        if saved_cpu is not None:  # then seq_lens_cpu is saved_cpu, and host_sum its sum
            batch.seq_lens_cpu = saved_cpu + window  # host bound: committed prefix + the window
            batch.seq_lens_sum = host_sum + bs * window
        # under DP attention the model runner plans the attention after SGLang's DP padding
        verify_batch, _ = verify_input.prepare_for_verify(
            batch, self.target_worker, defer_metadata_init=self._dp_attention
        )
        batch.seq_lens_cpu, batch.seq_lens_sum = saved_cpu, saved_sum
        if self._dp_attention and _dp_round_runs_eager(batch, verify_batch):
            verify_batch.can_run_decode_cuda_graph = False
        return verify_batch, grammar_tree

    def _target_verify(self, verify_batch):
        """The target's forward over every request's window (its verify graph when one was captured)."""
        return self.target_worker.forward_batch_generation(
            batch=None,
            forward_batch=verify_batch,
            is_verify=True,
            skip_attn_backend_init=None if self._dp_attention else True,
        )

    @staticmethod
    def _verify_logits(batch, target_out, tree: DraftTree, grammar_tree, grammar_barrier, window: int):
        """The target's logits [bs*N, V] at every node, processed as the non-speculative sampler processes a row:
        SGLang's adjustments, each node's own penalties, the logit bias, the grammar's mask, custom processors."""
        logits = target_out.logits_output.next_token_logits  # [bs*N, V]
        sampling_info = batch.sampling_info
        if sampling_info is not None:
            apply_dflash_verify_logits_adjustments(
                next_token_logits=logits, sampling_info=sampling_info, draft_token_num=window
            )
            apply_exact_penalties(logits, tree)  # a penalised step: each node's own penalties, then the logit bias
        if grammar_tree is not None:
            build_grammar_vocab_mask(
                reqs=batch.reqs,
                tree=grammar_tree,
                sampling_info=sampling_info,
                device=logits.device,
                barrier=grammar_barrier,
            ).apply(logits)
        apply_processors(logits, sampling_info, tree)  # custom logit processors last, each node seeing its own path
        return logits

    @staticmethod
    def _accept(batch, plan: StepPlan, draft: WindowDraft, logits: torch.Tensor) -> VerifyResult:
        """Tree verification (``speculators.verify``; static shapes, nothing read on the host): greedy on the
        argmax ids, or sampled from the processed probabilities with each request's coins (rank 0's under TP)."""
        bs, window, sampling_info = plan.bs, plan.window, batch.sampling_info
        if sampling_info is None or sampling_info.is_all_greedy or debug_greedy_verify():
            return verify_tree(draft.tree, target_logits=logits.view(bs, window, -1), ancestor=draft.ancestor)
        max_top_k = requests_max_top_k(getattr(batch, "reqs", None))  # host: the selection then takes no full sort
        probs = verify_probs(logits, sampling_info, window, max_top_k).view(bs, window, -1)  # [bs, N, V]
        coins = verify_coins(sampling_info, plan.prefix_lens, bs, window)  # per-request seeds when SGLang has them
        return sampled_result_from_rank0(
            verify_tree(draft.tree, target_probs=probs, coins=coins, ancestor=draft.ancestor)
        )

    def _commit(self, batch, plan: StepPlan, result: VerifyResult, logits_output, logits) -> CommitLayout:
        """The accepted path moved to the front of the window in ``req_to_token`` (its KV is at its final positions
        already), and the committed rows' logprobs and sampling masks where the requests ask for them."""
        draft_rows = self._draft_write_ids(plan.kv_loc_plan).view(plan.bs, plan.window)  # [bs, N]: drafter KV rows
        layout = commit_layout(result, plan.verify_slots, draft_rows, plan.prefix_lens)
        req_to_token = self.target_worker.model_runner.req_to_token_pool.req_to_token
        req_to_token[batch.req_pool_indices.long()[:, None], layout.columns] = layout.committed_slots.to(
            req_to_token.dtype
        )
        sampling_info = batch.sampling_info
        wants_masks = getattr(sampling_info, "sampling_mask_batch_indices", None) is not None
        if batch.return_logprob or wants_masks:  # they read the committed rows: the full-vocabulary copy only then
            logits_output.next_token_logits = gather_rows(logits, layout.order)  # [bs*N, V], row j: out_tokens[:, j]
            self._capture_sampling_mask(
                logits_output, sampling_info, plan.draft_input, layout.out_tokens, layout.commit_lens, plan.window
            )
            if batch.return_logprob:
                compute_spec_logprobs(batch, logits_output, layout.out_tokens.reshape(-1), chain_stride=plan.window)
        return layout

    def _append_draft_kv(self, logits_output, layout: CommitLayout) -> None:
        """The drafter's context: the committed tokens' target features, at their positions and slots."""
        hidden = logits_output.hidden_states
        if hidden is None:
            raise RuntimeError("DFLASH tree verify requires target hidden states, but got None.")
        self._append_target_hidden_to_draft_kv_by_loc(
            target_hidden=gather_rows(hidden, layout.order),
            cache_loc=layout.draft_rows.reshape(-1),
            cache_loc_2d=layout.draft_rows,
            positions=layout.columns.reshape(-1),
            commit_lens=layout.commit_lens,
        )
        logits_output.hidden_states = None

    def _record(self, batch, plan: StepPlan, result: VerifyResult) -> None:
        """The adaptive policy's measurement of the step, and the accepted paths' trace when one is recorded."""
        if self.adaptive is not None:
            # a tree's path measures every narrower budget on the same requests; a chain's depth already does
            paths = result.accepted_nodes if self.tree_budget is not None else None
            self.adaptive.finish(plan.started, plan.bs, plan.width, result.num_accepted, paths)
        if self._trace_file is not None and self.tree_budget is not None:
            parallel = get_parallel()  # the first rank of each group that serves its own requests writes them
            rank = int(parallel.attn_tp_rank if self._dp_attention else parallel.tp_group.rank_in_group)
            append_paths(self._trace_file, [req.rid for req in batch.reqs], plan.width, result.accepted_nodes, rank)

    def _tree_mask(self, ancestor: torch.Tensor, prefix_lens: torch.Tensor, capacity: int) -> torch.Tensor:
        """The step's FULL_MASK: its tree blocks written in place (``write_tree_mask``) into a buffer kept across
        steps, the target backend's verify-mask buffer when CUDA graphs made one (a graph replay's copy of the mask
        into that buffer is then a copy onto itself, which torch skips). No clearing, no copy of the buffer."""
        backend_mask = getattr(self.target_worker.model_runner.attn_backend, "verify_mask", None)
        buffer = getattr(backend_mask, "buffer", None)
        if buffer is None or buffer.numel() < capacity:
            if self._mask_buffer is None or self._mask_buffer.numel() < capacity:
                self._mask_buffer = torch.empty(2 * capacity, dtype=torch.bool, device=self.device)  # grows rarely
            buffer = self._mask_buffer
        mask = buffer[:capacity]
        write_tree_mask(mask, ancestor, prefix_lens)
        return mask

    @staticmethod
    def _capture_sampling_mask(logits_output, sampling_info, draft_input, out_tokens, commit_lens, window: int):
        """``return_sampling_mask``: each committed token's sampling support and log-probability, as SGLang's DFLASH
        chain reports them. The path-first logits are a chain's layout (row j: the law out_tokens[:, j] was drawn
        from), so SGLang's own capture applies unchanged; without it the scheduler aborts such requests."""
        if SpeculativeSamplingMaskCapture is None:
            return
        capture = SpeculativeSamplingMaskCapture.from_logits(
            sampling_info,
            next_token_logits=logits_output.next_token_logits,
            draft_input=draft_input,
            draft_token_num=window,
            bs=len(commit_lens),
        )
        if capture is not None:
            logits_output.sampling_mask_output = capture.build_output(out_tokens=out_tokens, commit_lens=commit_lens)

    # ------------------------------------------------------------------------------------------------------------

    def _draft_tree(
        self, batch, root, prefix_lens, seq_lens_cpu, draft_plan, width: int, phases: StepPhases | None = None
    ) -> tuple[DraftTree, torch.Tensor, torch.Tensor]:
        """The step's draft of width >= 1 (``speculators.tree_step``): the drafter's block, ranked by the target's LM
        head, as a chain of the argmax drafts (chain mode) or a DDTree of ``width`` nodes, padded to the window.
        Returns (tree, positions [bs, N], ancestor mask [bs, N, N])."""
        phases = phases or NO_PHASES
        phases.enter("draft_forward")
        draft_hidden, replayed = self._draft_block(batch, root, prefix_lens, seq_lens_cpu, draft_plan)  # [bs, B, H]
        is_tree = self.tree_budget is not None
        if replayed and self._draft_sampler is not None:  # adaptive chains: SGLang's in-graph argmax drafted them
            bs, block = len(root), self.block_size
            drafts = self._draft_sampler.out[: bs * (block - 1)].view(bs, block - 1)[:, :width]  # [bs, w]
            draft = chain_window(root, drafts, prefix_lens, width + 1)
            step_clock.drafted("captured_argmax")
            if check_replays():
                same_draft(draft, chain_window(root, self._chain_drafts(draft_hidden, root, width), prefix_lens,
                                               width + 1))  # fmt: skip
            return draft
        if replayed and self._tail is not None and width == self._tail.width:
            draft = self._tail.result(len(root))  # the graph's tail ranked and built it
            step_clock.drafted("captured_tail")
            if check_replays():
                same_draft(draft, self._tail.draft(draft_hidden, root, prefix_lens))
            tree, positions, ancestor, nonfinite = draft
            draft_health.add(nonfinite)
            return tree, positions, ancestor
        phases.enter("draft_rank")
        if self.selector is not None:  # DFlash2 (chains only): the selector's walk over the first w positions
            step_clock.drafted("selector_walk")
            return chain_window(root, self._chain_drafts(draft_hidden, root, width), prefix_lens, width + 1)
        step_clock.drafted("eager")
        hidden = draft_hidden[:, 1 : min(width, self.block_size - 1) + 1]  # [bs, D, H]: the draft positions
        ranked_lp, ranked_ids = self._ranked_draft_logprobs(hidden, width if is_tree else 1)  # [bs, D, K]
        phases.enter("tree_build")
        tree, positions, ancestor, nonfinite = tree_from_ranked(
            root, ranked_lp, ranked_ids, prefix_lens, width=width, tree=is_tree, use_kernel=self._use_triton_ddtree
        )
        draft_health.add(nonfinite)  # NaN / +inf drafts: ranked last, counted on the device, logged once
        return tree, positions, ancestor

    def _chain_drafts(self, draft_hidden: torch.Tensor, root: torch.Tensor, width: int) -> torch.Tensor:
        """The first ``width`` drafts of the block's chain [bs, w], greedy: each position's argmax under the
        target's LM head, or a DFlash2 drafter's selector walk (SGLang's lattice and walk; the walk is sequential,
        so its first w steps are the block-wide walk's, the chain SGLang's DFlash2 step drafts for greedy requests).
        Any draft verifies losslessly: sampled requests are verified against the target alone."""
        hidden = draft_hidden[:, 1 : width + 1]  # [bs, w, H]: the draft positions
        if self.selector is None:
            return self._ranked_draft_logprobs(hidden, 1)[1][:, :, 0]
        bs = hidden.shape[0]
        with torch.inference_mode(), _draft_tp_scope(self):
            candidate_ids, scores = _selector_lattice(self.draft_model, hidden, root)  # [bs, w, K], [bs, w, K, K]
            tokens, _ = self.selector.sample_path(
                candidate_ids=candidate_ids,
                scores=scores,
                uniforms=torch.zeros(bs, width, dtype=torch.float32, device=hidden.device),
                temperatures=torch.ones(bs, dtype=torch.float32, device=hidden.device),
                greedy_mask=torch.ones(bs, dtype=torch.bool, device=hidden.device),
            )
        return tokens.view(bs, width)

    def _plan(self, batch, seq_lens_cpu, slots: torch.Tensor):
        """The KV plan of a forward writing ``slots`` [bs, n] from the committed prefix on."""
        return self.target_worker.model_runner.kv_index_translator.plan(
            req_pool_indices=batch.req_pool_indices,
            seq_lens=batch.seq_lens,
            seq_lens_cpu=seq_lens_cpu,
            write_virtual=slots.reshape(-1),
            read_extent=slots.shape[1],
        )

    def _draft_block(self, batch, root, prefix_lens, seq_lens_cpu, kv_loc_plan) -> tuple[torch.Tensor, bool]:
        """Hidden states [bs, B, H] of the DFlash drafter over the block [root, mask x (B-1)], and whether the
        forward replayed a captured graph (the batch as SGLang's chain hands its drafter one)."""
        bs, block = root.shape[0], self.block_size
        block_ids = torch.full((bs, block), int(self._mask_token_id), dtype=torch.long, device=self.device)
        block_ids[:, 0] = root
        positions = (prefix_lens[:, None] + self._block_pos_offsets).reshape(-1)  # [bs*B]
        if self._full_embed_gpu is not None:  # DP attention: the whole table, no collective beside idle peers
            input_embeds = torch.nn.functional.embedding(block_ids, self._full_embed_gpu)
        else:
            target_model = self.target_worker.model_runner.model
            embed = unwrap_lora_layer(_resolve_dflash_embedding_module(self.draft_model, target_model))
            input_embeds = embed(block_ids)
        if self._noise_embed_scale != 1.0:
            input_embeds = input_embeds * self._noise_embed_scale
        host_lens = seq_lens_cpu[:bs] + block  # host bound: committed prefix + the block
        forward_batch = ForwardBatch(
            forward_mode=ForwardMode.TARGET_VERIFY,
            batch_size=bs,
            input_ids=block_ids.reshape(-1),
            req_pool_indices=batch.req_pool_indices,
            seq_lens=prefix_lens,
            out_cache_loc=None,
            seq_lens_sum=int(host_lens.sum()),
            seq_lens_cpu=host_lens,
            positions=positions,
            input_embeds=input_embeds.reshape(bs * block, -1),
            spec_algorithm=SpeculativeAlgorithm.DFLASH,
            spec_info=self._draft_block_spec_info,
            capture_hidden_mode=CaptureHiddenMode.NULL,
            num_token_non_padded=(
                torch.full((), bs * block, dtype=torch.int32, device=self.device)
                if enable_num_token_non_padded()
                else None
            ),
            global_num_token_non_padded_cpu=bs * block,
            can_run_decode_cuda_graph=batch.can_run_decode_cuda_graph,
        )
        stage = getattr(self._draft_sampler, "stage_sampling_params", None)
        if stage is not None:  # DFlash2's walk in SGLang's drafter graph: greedy, as _chain_drafts walks it
            stage(bs=bs, sampling_info=None)
        # The block's scratch KV goes to the first B slots of the window; the verify rewrites them.
        kv_loc_plan.bind(forward_batch, self.draft_model_runner.kv_index_translator, cols=slice(0, block))
        with torch.inference_mode(), _draft_tp_scope(self):
            out = self.draft_model_runner.forward(forward_batch)
        hidden = out.logits_output.hidden_states
        if hidden is None:
            raise RuntimeError("DFLASH draft model returned no hidden states.")
        return hidden[: bs * block].view(bs, block, -1), bool(getattr(out, "can_run_graph", False))

    def _ranked_draft_logprobs(self, hidden: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Each draft position's best min(k, V) tokens under the target's LM head: hidden [bs, D, H] -> (log-probs
        [bs, D, K] float32 over the full vocabulary, token ids [bs, D, K]), ranked by log-prob then id.
        Tensor-parallel: every rank ranks its shard; candidates and log-sum-exps are gathered, so all ranks build the
        same tree. The shard's group is read inside the drafter's TP context, where the captured tail reads it
        (:meth:`_maybe_build_draft_sampler`); under DP attention outside it, as the head is split over the target's
        attention-TP group, which that context replaces (the drafter runs eager there)."""
        k = min(k, int(self.model_runner.model_config.vocab_size))
        if not self._dp_attention:
            with _draft_tp_scope(self):
                return self._rank_on_shard(self._head_shard(), hidden, k)
        head = self._head_shard()
        if head.group is None:
            with _draft_tp_scope(self):
                return self._rank_on_shard(head, hidden, k)
        return self._rank_on_shard(head, hidden, k)

    @staticmethod
    def _rank_on_shard(head: HeadShard, hidden: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`_ranked_draft_logprobs` on this rank's part of the head (the whole head, or a shard and its group)."""
        if head.group is None:
            return rank_draft_hidden(hidden, head.weight, k)
        group, tp_size = head.group, int(head.group.world_size)

        def gather(packed: torch.Tensor) -> torch.Tensor:  # [n, C] -> [tp, n, C]: rank order
            return group.all_gather(packed.contiguous(), dim=0).view(tp_size, *packed.shape)

        return rank_draft_hidden_sharded(hidden, head.weight, k, head.vocab_start, gather)

    def _head_shard(self) -> HeadShard:
        """This rank's rows of the target's LM head and the group they are split over (:func:`_head_shard`)."""
        lm_head = unwrap_lora_layer(self.target_worker.model_runner.model.lm_head)
        return _head_shard(lm_head, int(self.model_runner.model_config.vocab_size))
