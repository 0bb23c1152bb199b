"""The plugin's policy in the shape SGLang's adaptive EAGLE runtime asks for (``AdaptiveSpecPolicy`` in
``sglang/srt/speculative/adaptive_runtime_state.py``): ``AdaptiveController`` calls ``get_steps_for_batch`` before
every decode step and switches to that step count's prebuilt state. No SGLang import: the protocol is duck-typed.
"""

from __future__ import annotations

from sglang_kimi.speculative.adaptive.runtime import AdaptiveRuntime


class EagleStepsPolicy:
    """SGLang's ``AdaptiveSpecPolicy`` protocol (``speculative/adaptive_runtime_state.py``) answered by the plugin's
    runtime. Every bucket may run every candidate, so every captured batch size keeps every step's graphs."""

    def __init__(self, runtime: AdaptiveRuntime, candidate_steps, cuda_graph_bs=None):
        self.runtime = runtime
        self._candidate_steps = sorted(int(s) for s in candidate_steps)
        self._cuda_graph_bs = sorted(cuda_graph_bs) if cuda_graph_bs else None

    @property
    def candidate_steps(self) -> list[int]:
        return list(self._candidate_steps)

    def set_cuda_graph_bs(self, cuda_graph_bs) -> None:
        self._cuda_graph_bs = sorted(cuda_graph_bs) if cuda_graph_bs else None

    def cuda_graph_bs_for_step(self, step: int):
        return None if self._cuda_graph_bs is None else list(self._cuda_graph_bs)

    def get_steps_for_batch(self, batch_size: int) -> int:
        return self.runtime.choose(batch_size)

    def on_verify_complete(self, num_correct_drafts_per_req, batch_size: int):
        return None  # outcomes reach the policy with the step's timing (record_step); switches happen per batch
