"""Install functions for the model entries (models/registrations.py; light: SGLang models are imported lazily)."""

from sglang_kimi.hooks import hook

KIMI_ARCH = "KimiK25ForConditionalGeneration"


def install_language_model_only_arch(target: str):
    """Let SGLang's ``--language-model-only`` accept Kimi-K2.5/K2.6 checkpoints."""
    from sglang.srt.server_args import ServerArgs

    if KIMI_ARCH not in ServerArgs.LANGUAGE_MODEL_ONLY_ARCHITECTURES:
        ServerArgs.LANGUAGE_MODEL_ONLY_ARCHITECTURES = (*ServerArgs.LANGUAGE_MODEL_ONLY_ARCHITECTURES, KIMI_ARCH)


def _text_only_kimi_class(original, model_config, *args, **kwargs):
    model_class, arch = original(model_config, *args, **kwargs)
    if arch == KIMI_ARCH and getattr(model_config.hf_config, "language_model_only", False):
        from sglang_kimi.models.kimi_k25 import KimiK25ForConditionalGeneration

        return KimiK25ForConditionalGeneration, arch
    return model_class, arch


def install_text_only_kimi_class(target: str):
    hook(target, _text_only_kimi_class, "AROUND")
