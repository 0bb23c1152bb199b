"""Custom logit processors whose decision depends on what the request generated so far, serialized for requests.

SGLang deserializes a ``custom_logit_processor`` with dill in the scheduler, which cannot import the test modules:
the classes are built from source in a namespace named ``__main__``, so dill carries them by value.
"""

from __future__ import annotations

import functools

SOURCE = '''
from sglang.srt.sampling.custom_logit_processor import CustomLogitProcessor


class ForceAfter(CustomLogitProcessor):
    """From output position custom_params["after"] on, only token custom_params["token"] (a thinking budget's rule)."""

    def __call__(self, logits, custom_param_list):
        for row, params in enumerate(custom_param_list):
            if len(params["__req__"].output_ids) >= params["after"]:
                logits[row, :] = -float("inf")
                logits[row, params["token"]] = 0.0
        return logits


class NoRepeat(CustomLogitProcessor):
    """Never the token just generated (the prompt's last token for the first one)."""

    def __call__(self, logits, custom_param_list):
        for row, params in enumerate(custom_param_list):
            req = params["__req__"]
            last = req.output_ids[-1] if req.output_ids else req.origin_input_ids[-1]
            logits[row, last] = -float("inf")
        return logits
'''


@functools.cache
def _classes() -> dict:
    namespace = {"__name__": "__main__"}
    exec(SOURCE, namespace)  # noqa: S102 - the fixed source above
    return namespace


def processor(name: str):
    """The class (``ForceAfter`` or ``NoRepeat``), to call in-process."""
    return _classes()[name]


@functools.cache
def serialized(name: str) -> str:
    """The class as a request's ``custom_logit_processor`` field."""
    return processor(name).to_str()
