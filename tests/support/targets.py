"""Targets for the reference loop in tests: a transformers causal LM adapted to the loop's ``Target`` protocol, and a
small random pure-torch target whose outputs are exactly reproducible."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from sglang_kimi.speculators.reference.loop import Target, TargetOutput


def hf_target(model: torch.nn.Module, capture_layer_ids: Sequence[int] = ()) -> Target:
    """Adapt a transformers causal LM to the :class:`Target` protocol.

    The bool mask becomes HF's 4D additive mask [1, 1, T, T] (0 = attend, dtype min = masked), which HF passes
    through unchanged; ``capture_layer_ids`` l select ``hidden_states[l + 1]`` (output of decoder layer l).
    """
    dtype = next(model.parameters()).dtype
    device = next(model.parameters()).device

    def target(input_ids: torch.Tensor, position_ids: torch.Tensor, attention_mask: torch.Tensor) -> TargetOutput:
        additive = torch.zeros(attention_mask.shape, dtype=dtype, device=device)
        additive.masked_fill_(~attention_mask.to(device), torch.finfo(dtype).min)
        with torch.no_grad():
            out = model(
                input_ids=input_ids.to(device),
                position_ids=position_ids.to(device),
                attention_mask=additive[:, None],
                output_hidden_states=bool(capture_layer_ids),
                use_cache=False,
            )
        hidden = None
        if capture_layer_ids:
            hidden = torch.cat([out.hidden_states[layer + 1] for layer in capture_layer_ids], dim=-1)
        return TargetOutput(out.logits.to(input_ids.device), None if hidden is None else hidden.to(input_ids.device))

    return target


class TinyTarget(torch.nn.Module):
    """A random causal LM for tests whose tree-verify logits equal its token-by-token logits bit for bit.

    Absolute position embeddings, ``num_layers`` single-head attention + ReLU MLP blocks, an LM head. Every
    reduction is a sequential ``cumsum`` (on CPU: a left-to-right loop) and every nonlinearity uses only
    + - * / max, so a row's output depends only on the keys it sees, in position order: masked keys add exact
    zeros. This is what makes exact greedy equality testable in float32 (real models need a batch-invariant
    kernel for that). Accepts any batch size; ``capture_layer_ids`` as in :func:`hf_target`.
    """

    def __init__(
        self,
        vocab_size: int = 32,
        hidden_size: int = 16,
        num_layers: int = 2,
        max_positions: int = 512,
        capture_layer_ids: Sequence[int] = (),
        logit_scale: float = 0.5,
        seed: int = 0,
    ) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(seed)

        def param(*shape: int, scale: float) -> torch.nn.Parameter:
            return torch.nn.Parameter(torch.randn(*shape, generator=gen) * scale, requires_grad=False)

        h = hidden_size
        self.embed = param(vocab_size, h, scale=1.0)
        self.position = param(max_positions, h, scale=1.0)
        self.layers = torch.nn.ParameterList()
        for _ in range(num_layers):  # q, k, v, o, up, down
            self.layers.extend([param(h, h, scale=h**-0.5) for _ in range(4)])
            self.layers.extend([param(h, 2 * h, scale=h**-0.5), param(2 * h, h, scale=(2 * h) ** -0.5)])
        self.lm_head = param(h, vocab_size, scale=logit_scale * h**-0.5)
        self.num_layers = num_layers
        self.capture_layer_ids = tuple(capture_layer_ids)

    @staticmethod
    def _sum_last(x: torch.Tensor) -> torch.Tensor:
        return x.cumsum(dim=-1)[..., -1]

    def _linear(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return self._sum_last(x[..., None, :] * weight.T)  # [..., in] x [in, out] -> [..., out]

    def _attention(self, x: torch.Tensor, mask: torch.Tensor, wq, wk, wv, wo) -> torch.Tensor:
        q, k, v = self._linear(x, wq), self._linear(x, wk), self._linear(x, wv)  # [B, T, H]
        scores = self._sum_last(q[:, :, None, :] * k[:, None, :, :])  # [B, T, T]
        scores = scores.masked_fill(~mask, float("-inf"))
        centred = scores - scores.amax(dim=-1, keepdim=True)
        weights = torch.where(mask, 1.0 / (1.0 + centred * centred), 0.0)  # rational "softmax": exact ops only
        weights = weights / self._sum_last(weights)[..., None]
        mixed = self._sum_last(weights[:, :, None, :] * v.transpose(1, 2)[:, None, :, :])  # [B, T, H]
        return self._linear(mixed, wo)

    def forward(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> TargetOutput:
        x = self.embed[input_ids] + self.position[position_ids]  # [B, T, H]
        hidden_states = [x]
        for layer in range(self.num_layers):
            wq, wk, wv, wo, up, down = self.layers[6 * layer : 6 * layer + 6]
            x = x + self._attention(x, attention_mask, wq, wk, wv, wo)
            x = x + self._linear(torch.relu(self._linear(x, up)), down)
            hidden_states.append(x)
        logits = self._linear(x, self.lm_head)  # [B, T, V]
        captured = None
        if self.capture_layer_ids:
            captured = torch.cat([hidden_states[layer + 1] for layer in self.capture_layer_ids], dim=-1)
        return TargetOutput(logits, captured)
