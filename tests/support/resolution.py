"""SGLang's argument resolution with the plugin loaded, on the tiny model with the CPU settings, for the tests that
check which launches are refused (and in what words) without starting a server."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from sglang_kimi.assets import TINY_MODEL
from sglang_kimi.launcher.server import sglang_env
from support.servers import cpu_args

CPU_ARGS = cpu_args()

RESOLVE = """
import json, sys
from sglang.srt.plugins import load_plugins
load_plugins()
from sglang.srt.server_args import prepare_server_args
outcomes = []
for argv in json.loads(sys.argv[1]):
    try:
        prepare_server_args(argv).resolve_once()
        outcomes.append(None)
    except Exception as exc:
        outcomes.append(f"{type(exc).__name__}: {exc}")
print("OUTCOMES=" + json.dumps(outcomes))
"""


def _cpu_args(argv: list[str]) -> list[str]:
    """CPU_ARGS, without --language-model-only for a target of its own with no vision tower (SGLang refuses the flag
    for a text-only model, as ``sglang-kimi serve`` leaves it out for one)."""
    if "--model-path" not in argv:
        return CPU_ARGS
    config = json.loads((Path(argv[argv.index("--model-path") + 1]) / "config.json").read_text())
    return CPU_ARGS if "vision_config" in config else [a for a in CPU_ARGS if a != "--language-model-only"]


def resolve_all(settings: list[list[str]], env: dict[str, str] | None = None) -> list[str | None]:
    """SGLang's argument resolution of every setting (on the tiny model, CPU) in one subprocess with the plugin
    loaded, with ``env`` added: None where it resolves, else the error."""
    argvs = [["--model-path", str(TINY_MODEL), *_cpu_args(argv), *argv] for argv in settings]
    env = {**sglang_env(cpu=True)[0], **(env or {})}
    out = subprocess.run(
        [sys.executable, "-c", RESOLVE, json.dumps(argvs)], env=env, capture_output=True, text=True, timeout=600
    )
    line = [x for x in out.stdout.splitlines() if x.startswith("OUTCOMES=")]
    assert line, out.stderr[-3000:]
    return json.loads(line[0][len("OUTCOMES=") :])
