"""A DFLASH draft block's input embeddings in the model's dtype.

``ModelRunner._extend_forward_kwargs`` casts ``forward_batch.input_embeds`` to bfloat16 whatever the model dtype: a
float32 server fails (``expected m1 and m2 to have the same dtype ... BFloat16 != float``) on every extend that passes
embeddings, which DFLASH's draft block does at every step, and float16 servers round through bf16. An AROUND hook
passes the embeddings in the model dtype (unchanged for bf16 models), re-applying the replacement scatter.
"""

from __future__ import annotations

from sglang_kimi.hooks import hook


def _extend_kwargs_in_model_dtype(original, self, forward_batch, *args, **kw):
    kwargs = original(self, forward_batch, *args, **kw)
    dtype = self.model_config.dtype
    if forward_batch.input_embeds is None or dtype == kwargs["input_embeds"].dtype:
        return kwargs
    embeds = forward_batch.input_embeds.to(dtype)
    if forward_batch.replace_embeds is not None and forward_batch.replace_positions is not None:
        embeds[forward_batch.replace_positions] = forward_batch.replace_embeds.to(dtype)
    kwargs["input_embeds"] = embeds
    return kwargs


def install_input_embeds_dtype(target: str):
    """``ModelRunner._extend_forward_kwargs`` casts ``forward_batch.input_embeds.bfloat16()`` whatever the model
    dtype: a float32 server fails (``expected m1 and m2 to have the same dtype ... BFloat16 != float``) on every
    extend that passes embeddings (DFLASH's draft block), and float16 servers silently round through bf16. Pass
    the embeddings in the model dtype (unchanged for bf16 models), re-applying the replacement scatter."""
    hook(target, _extend_kwargs_in_model_dtype, "AROUND")
