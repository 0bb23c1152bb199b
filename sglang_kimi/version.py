"""The plugin's version, the SGLang releases it supports, and how the installed SGLang compares (a leaf module)."""

__version__ = "0.1.0"

# The SGLang releases this plugin is tested against (inclusive bounds).
SUPPORTED_SGLANG = ("0.5.20", "0.5.23")


def version_in_range(version: str, supported: tuple[str, str]) -> bool:
    """Compare release numbers only: 0.5.23.post1 and 0.5.23+rocm count as 0.5.23."""
    from packaging.version import Version

    def release(v: str) -> tuple[int, ...]:
        return Version(v).release[:3]

    return release(supported[0]) <= release(version) <= release(supported[1])


def sglang_at_least(release: tuple[int, int, int]) -> tuple[bool, str]:
    """Whether the installed SGLang is ``release`` or later (release numbers only, as :func:`version_in_range`
    compares them), and its version string."""
    from packaging.version import Version
    from sglang.version import __version__ as sglang_version

    return Version(sglang_version).release[:3] >= release, sglang_version
