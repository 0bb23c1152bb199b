"""Running this package's Triton kernels on CPU tensors, through Triton's interpreter.

The ``*_ref`` twins are the CPU backend. The Triton kernels themselves run on CPU only for tests, under Triton's
interpreter, in float32 (the interpreter's bf16 arithmetic is not faithful).

How Triton 3.x decides (checked against triton 3.9, ``triton/runtime/jit.py`` and ``triton/knobs.py``):

- ``@triton.jit`` reads ``TRITON_INTERPRET`` when it *decorates*: with it set it builds an ``InterpretedFunction``,
  otherwise a ``JITFunction``. Triton's own standard library (``tl.zeros``, ``tl.sum``, ``tl.cumsum``, ...) is
  decorated when ``triton.language`` is first imported, so the variable must be set before that first import, in
  this process. An ``InterpretedFunction`` whose body calls a ``JITFunction`` fails ("Cannot call @triton.jit'd
  outside of the scope of a kernel").
- A few places read the variable again at launch (``triton.experimental.gluon`` import asserts on it, constexpr
  functions), so it must also be set while an interpreted kernel runs.

So: :func:`interpreter_imports` sets the variable around the first import of ``triton.language`` and of the kernel
modules, then restores it (so server subprocesses started later by other tests do not inherit it);
:func:`launch` sets it around each CPU launch and, when a kernel module was decorated without it (imported before),
wraps the kernel's Python function in an ``InterpretedFunction`` on the fly (our kernels call no ``@triton.jit``
helpers, which is what makes that possible). :func:`interpreter_active` says whether Triton's standard library
in this process is the interpreted one; if it is not (something imported Triton first without the variable), CPU
launches are impossible in this process (the tests then run their module in a fresh process).
"""

from __future__ import annotations

import contextlib
import os
import sys

ENV = "TRITON_INTERPRET"


@contextlib.contextmanager
def interpret_env(enabled: bool = True):
    """Set (or clear) ``TRITON_INTERPRET`` for the duration of the block, then restore the previous value."""
    old = os.environ.get(ENV)
    if enabled:
        os.environ[ENV] = "1"
    else:
        os.environ.pop(ENV, None)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = old


def interpreter_requested() -> bool:
    """Whether Triton processes started from this environment would decorate their kernels for the interpreter
    (``TRITON_INTERPRET``, read as Triton reads it); False without Triton."""
    try:
        from triton import knobs
    except ImportError:
        return False
    return bool(knobs.runtime.interpret)


def interpreter_active() -> bool:
    """True when Triton's standard library in this process was built for the interpreter."""
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(tl.zeros, InterpretedFunction)


@contextlib.contextmanager
def interpreter_imports():
    """Import Triton (and, inside the block, kernel modules) in interpreter mode if Triton is not loaded yet.

    Yields nothing; check :func:`interpreter_active` afterwards. Example::

        with interpreter_imports():
            from sglang_kimi.kernels import tree_verify
        IN_PROCESS = interpreter_active()
    """
    first_import = "triton.language" not in sys.modules
    with interpret_env(first_import or interpreter_active()):
        import triton.language  # noqa: F401

        if first_import:
            # gluon asserts on the variable at import; load it while the variable is set.
            import triton.experimental.gluon  # noqa: F401
        yield


def launch(kernel, grid, *args, **kwargs):
    """``kernel[grid](*args, **kwargs)``; on CPU tensors through the interpreter (see the module docstring)."""
    on_cpu = _first_tensor_device(args, kwargs) == "cpu"
    if not on_cpu:
        return kernel[grid](*args, **kwargs)
    from triton.runtime.interpreter import InterpretedFunction

    if not interpreter_active():
        raise RuntimeError(
            "Triton kernels run on CPU tensors only under Triton's interpreter, and this process imported "
            f"Triton without {ENV}=1. Set {ENV}=1 before anything imports triton, or use the *_ref twin "
            "(the CPU implementation)."
        )
    if not isinstance(kernel, InterpretedFunction):
        kernel = _interpreted(kernel)
    with interpret_env(True):
        return kernel[grid](*args, **kwargs)


_INTERPRETED: dict = {}


def _interpreted(jit_fn):
    from triton.runtime.interpreter import InterpretedFunction

    key = id(jit_fn)
    if key not in _INTERPRETED:
        _INTERPRETED[key] = (jit_fn, InterpretedFunction(jit_fn.fn))
    return _INTERPRETED[key][1]


def _first_tensor_device(args, kwargs) -> str | None:
    import torch

    for value in list(args) + list(kwargs.values()):
        if isinstance(value, torch.Tensor):
            return value.device.type
    return None
