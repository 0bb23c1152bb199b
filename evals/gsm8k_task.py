"""The lm-eval task the gate runs: the stock ``gsm8k``, or the same definition on local JSONL files.

``--data-dir DIR`` renders ``tasks/gsm8k_local.yaml`` (package data) into a fresh folder that lm-eval indexes
through ``include_path``. The template ``include``s the installed lm-eval's own ``gsm8k.yaml`` and replaces
only the data source (``dataset_path: json`` + ``data_files``), so prompt format, few-shot split, stop
sequences, filters and metric stay the stock ones by construction (the stock task reaches the Hugging Face
hub, which an offline machine cannot).
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

from sglang_kimi.evals.errors import EvalError
from sglang_kimi.evals.hub_data import load_gsm8k, why_not_loaded

TEMPLATE = Path(__file__).parent / "tasks" / "gsm8k_local.yaml"
STOCK_TASK = "gsm8k"
LOCAL_TASK = "gsm8k_local"
SPLITS = ("train", "test")  # few-shot examples come from train, questions from test (stock gsm8k.yaml)
FIELDS = ("question", "answer")


@dataclass(frozen=True)
class TaskSpec:
    """What ``lm_eval.simple_evaluate`` is given: a task name and the folder to index (None: stock tasks)."""

    name: str
    include_path: str | None
    data_dir: str | None = None
    yaml: str | None = None  # the rendered task file


def stock_gsm8k_yaml() -> Path:
    """The installed lm-eval's ``tasks/gsm8k/gsm8k.yaml``."""
    import lm_eval

    path = Path(lm_eval.__file__).parent / "tasks" / "gsm8k" / "gsm8k.yaml"
    if not path.exists():
        raise EvalError(
            f"lm-eval at {path.parents[2]} has no tasks/gsm8k/gsm8k.yaml: pip install 'lm-eval[api]==0.4.13'"
        )
    return path


def check_data_dir(data_dir: str | Path) -> dict[str, Path]:
    """``{"train": path, "test": path}`` after checking that both files exist and hold GSM8K records."""
    root = Path(data_dir).expanduser()
    if not root.is_dir():
        raise EvalError(f"--data-dir {data_dir} is not a folder: point it at a folder with train.jsonl and test.jsonl")
    files = {split: (root / f"{split}.jsonl").resolve() for split in SPLITS}
    missing = [p.name for p in files.values() if not p.is_file()]
    if missing:
        raise EvalError(
            f"--data-dir {data_dir} has no {' or '.join(missing)}: it needs GSM8K's train.jsonl and test.jsonl "
            '(one {"question": ..., "answer": ...} object per line)'
        )
    for split, path in files.items():
        with path.open(encoding="utf-8") as fh:
            first = fh.readline()
        try:
            record = json.loads(first)
        except json.JSONDecodeError:
            record = None
        if not isinstance(record, dict) or not all(key in record for key in FIELDS):
            raise EvalError(f'{path} does not look like GSM8K JSONL: each line needs "question" and "answer"')
    return files


def render_local_task(data_dir: str | Path, out_dir: str | Path | None = None) -> TaskSpec:
    """Write ``gsm8k_local.yaml`` for ``data_dir`` into ``out_dir`` (default: a new temporary folder)."""
    files = check_data_dir(data_dir)
    out = Path(out_dir) if out_dir else Path(tempfile.mkdtemp(prefix="sglang-kimi-gsm8k-task-"))
    out.mkdir(parents=True, exist_ok=True)
    text = TEMPLATE.read_text()
    # JSON strings are valid YAML scalars: any path (spaces, quotes, colons) survives.
    for placeholder, value in {
        "@STOCK_GSM8K_YAML@": stock_gsm8k_yaml(),
        "@TRAIN_JSONL@": files["train"],
        "@TEST_JSONL@": files["test"],
    }.items():
        text = text.replace(placeholder, json.dumps(str(value)))
    (out / TEMPLATE.name).write_text(text)
    return TaskSpec(name=LOCAL_TASK, include_path=str(out), data_dir=str(Path(data_dir).resolve()), yaml=text)


def task_spec(data_dir: str | Path | None, out_dir: str | Path | None = None) -> TaskSpec:
    """The stock task (``data_dir`` None) or its local-data twin."""
    if data_dir is None:
        return TaskSpec(name=STOCK_TASK, include_path=None)
    return render_local_task(data_dir, out_dir)


def check_stock_data() -> None:
    """The stock task's data set (lm-eval's ``openai/gsm8k``, ``main``) loads here: asked before servers start."""
    try:
        load_gsm8k()
    except Exception as exc:
        raise EvalError(
            f"cannot load the gsm8k data set openai/gsm8k ({why_not_loaded(exc)}): on an offline machine pass "
            "--data-dir with GSM8K's train.jsonl and test.jsonl"
        ) from None
