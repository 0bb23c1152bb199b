"""Registering the ``kimi_cpu`` attention backend with SGLang: its factory, the CLI choices, the DeepSeek MLA
method, and the EAGLE draft backends (see ``attention_backend.py`` for the backend itself)."""

from __future__ import annotations

from sglang_kimi.platform.cpu import KIMI_CPU_BACKEND as BACKEND_NAME


def _create_backend(runner):
    from sglang_kimi.platform.cpu.attention_backend import KimiCpuAttnBackend

    return KimiCpuAttnBackend(runner)


def install_attention_backend(target: str):
    """``--attention-backend kimi_cpu`` (and ``--speculative-draft-attention-backend kimi_cpu``): SGLang's
    attention registry plus both CLI choice lists, which argparse reads after the plugins load. The DeepSeek
    attention-method registry maps it to absorbed MLA in every mode, as for torch_native (``fixes.py``)."""
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS, register_attention_backend
    from sglang.srt.models.deepseek_common.attention_backend_handler import AttentionBackendRegistry
    from sglang.srt.server_args import (
        ATTENTION_BACKEND_CHOICES,
        DRAFT_ATTENTION_BACKEND_CHOICES,
        add_attention_backend_choices,
        add_draft_attention_backend_choices,
    )

    from sglang_kimi.platform.cpu.cpu_path_fixes import _absorbed_mla

    if BACKEND_NAME in ATTENTION_BACKENDS:
        return f"SGLang already has an attention backend named {BACKEND_NAME}"
    register_attention_backend(BACKEND_NAME)(_create_backend)
    if BACKEND_NAME not in ATTENTION_BACKEND_CHOICES:
        add_attention_backend_choices([BACKEND_NAME])
    if BACKEND_NAME not in DRAFT_ATTENTION_BACKEND_CHOICES:
        add_draft_attention_backend_choices([BACKEND_NAME])
    AttentionBackendRegistry.register(BACKEND_NAME, _absorbed_mla)
    return None


def _create_draft_backend_with_kimi_cpu(
    original, self, backend_name, backend_map, error_template, stamps_children=False
):
    """``DraftBackendFactory._create_backend`` with ``kimi_cpu`` in its backend map: the multi-step draft decode
    backend when it builds one (``stamps_children``), the plain backend for EAGLE's draft extend."""
    from sglang_kimi.platform.cpu.attention_backend import KimiCpuAttnBackend, KimiCpuMultiStepDraftBackend

    if stamps_children:

        def create():
            return BACKEND_NAME, KimiCpuMultiStepDraftBackend(
                self.draft_model_runner, self.topk, self.speculative_num_steps
            )
    else:

        def create():
            return BACKEND_NAME, KimiCpuAttnBackend(self.draft_model_runner)

    return original(self, backend_name, {**backend_map, BACKEND_NAME: create}, error_template, stamps_children)


def install_draft_backends(target: str):
    """SGLang's ``DraftBackendFactory`` maps backend names to EAGLE draft backends and refuses any other name
    ("EAGLE is not supported in decode attention backend kimi_cpu"); add ours."""
    from sglang_kimi.hooks import hook

    hook(target, _create_draft_backend_with_kimi_cpu, "AROUND")
