"""The plugin's version and the SGLang releases it supports (a leaf module)."""

__version__ = "0.1.0"

# The SGLang releases this plugin is tested against (inclusive bounds).
SUPPORTED_SGLANG = ("0.5.20", "0.5.23")
