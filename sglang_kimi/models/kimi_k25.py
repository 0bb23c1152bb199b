"""Text-only serving of Kimi-K2.6's ``KimiK25ForConditionalGeneration`` wrapper.

SGLang's ``--language-model-only`` skips the multimodal processor and marks ``hf_config.language_model_only``,
but SGLang 0.5.23 refuses the flag for Kimi and its Kimi class always builds and loads the MoonViT tower. With the
plugin, the flag is accepted for Kimi and :class:`KimiK25ForConditionalGeneration` builds only the language model
when it is set, dropping the tower's weights while loading. Without the flag the class is SGLang's own.

SGLang's Kimi class takes token ids only: its ``forward`` has no ``input_embeds``, so a request carrying
``input_embeds`` (served with ``--disable-radix-cache``) ended the scheduler with a ``TypeError``. The text-only class
passes them to the language model, as SGLang's DeepSeek-V3 class does; with the vision tower such requests are
refused before they reach the scheduler (``request_validation``).
"""

from __future__ import annotations

from typing import Iterable, Tuple

import torch
from sglang.srt.models.kimi_k25 import KimiK25ForConditionalGeneration as _UpstreamKimiK25
from torch import nn

ARCH = "KimiK25ForConditionalGeneration"
VISION_PREFIXES = ("vision_tower.", "mm_projector.")


def is_text_only(config) -> bool:
    return bool(getattr(config, "language_model_only", False))


class KimiK25ForConditionalGeneration(_UpstreamKimiK25):
    """SGLang's Kimi-K2.5/K2.6 class; with ``--language-model-only`` the vision tower is never built."""

    def __init__(self, config, quant_config=None, prefix: str = "", **kwargs) -> None:
        if not is_text_only(config):
            super().__init__(config, quant_config, prefix=prefix, **kwargs)
            return
        from sglang.srt.layers.quantization.modelslim.modelslim import ModelSlimConfig
        from sglang.srt.layers.quantization.quark.quark import QuarkConfig
        from sglang.srt.models.deepseek_v2 import DeepseekV3ForCausalLM

        nn.Module.__init__(self)
        self.config = config
        self.quant_config = quant_config
        self.use_data_parallel = False
        self.vision_tower = None
        self.mm_projector = None
        self.language_model = DeepseekV3ForCausalLM(
            config.text_config,
            quant_config,
            prefix="language_model" if isinstance(quant_config, (ModelSlimConfig, QuarkConfig)) else "",
        )

    # pp_proxy_tensors is named, not left to **kwargs: SGLang's ModelRunner enables pipeline parallelism only for a
    # model whose forward signature has it (``support_pp``)
    def forward(
        self,
        input_ids,
        positions,
        forward_batch,
        input_embeds=None,
        get_embedding=False,
        pp_proxy_tensors=None,
        **kwargs,
    ):
        if input_embeds is None:
            return super().forward(
                input_ids,
                positions,
                forward_batch,
                get_embedding=get_embedding,
                pp_proxy_tensors=pp_proxy_tensors,
                **kwargs,
            )
        # [num_tokens, hidden] embeddings in place of the token ids' rows
        return self.language_model(
            input_ids, positions, forward_batch, input_embeds=input_embeds, pp_proxy_tensors=pp_proxy_tensors, **kwargs
        )

    def load_weights(self, weights: Iterable[Tuple[str, torch.Tensor]]):
        if self.vision_tower is not None:
            return super().load_weights(weights)
        weights = self.hf_to_sglang_mapper.apply(weights)
        self.language_model.load_weights(
            (name.replace("language_model.", "", 1), tensor)
            for name, tensor in weights
            if not name.startswith(VISION_PREFIXES)
        )
