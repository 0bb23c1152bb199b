"""A served model's greedy log-probabilities against a transformers reference of the same weights."""

from __future__ import annotations

from dataclasses import dataclass

import requests
import torch


@dataclass
class LogprobComparison:
    prompt_ids: list[int]
    output_ids: list[int]  # the server's greedy tokens
    served: torch.Tensor  # [T - 1] the server's log-probability of every token after the first
    reference: torch.Tensor  # [T - 1] the reference's, teacher-forced on the same tokens
    reference_logprobs: torch.Tensor  # [T, vocab] the reference's log-softmax at every position
    num_prefill: int  # how many of the compared tokens are the prompt's

    def error(self, part: slice = slice(None)) -> float:
        return (self.served[part] - self.reference[part]).abs().max().item()

    def reference_greedy(self) -> list[int]:
        """The reference's argmax after each prompt and output position (teacher-forced greedy)."""
        return self.reference_logprobs[len(self.prompt_ids) - 1 : -1].argmax(-1).tolist()


def compare_logprobs(base_url: str, model, tokenizer, prompt: str, max_new_tokens: int = 16, timeout: float = 300):
    """Generate greedily with prompt and output log-probabilities, then score the same tokens with ``model``."""
    ids = tokenizer(prompt)["input_ids"]
    out = requests.post(
        base_url + "/generate",
        json={
            "input_ids": ids,
            "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0.0},
            "return_logprob": True,
            "logprob_start_len": 0,
        },
        timeout=timeout,
    ).json()
    prefill = [lp for lp, _, _ in out["meta_info"]["input_token_logprobs"]][1:]  # the first token has none
    decode = [lp for lp, _, _ in out["meta_info"]["output_token_logprobs"]]
    tokens = torch.tensor([ids + out["output_ids"]])  # [1, T]
    with torch.no_grad():
        reference = torch.log_softmax(model(tokens).logits.float(), dim=-1)[0]  # [T, vocab]
    expected = reference[:-1].gather(1, tokens[0, 1:, None])[:, 0]  # [T - 1]
    return LogprobComparison(ids, out["output_ids"], torch.tensor(prefill + decode), expected, reference, len(prefill))
