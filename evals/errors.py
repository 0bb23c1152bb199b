"""The one error type of the eval and bench commands: bad input or an unusable server (exit code 2)."""


class EvalError(RuntimeError):
    """A problem the user must fix (unreachable server, not SGLang, different models, bad flags, missing data).

    The message is one line naming the problem and the fix; the CLI prints it and exits with code 2.
    """
