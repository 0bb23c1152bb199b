"""The GSM8K accuracy gate: lm-eval's ``gsm8k`` on a baseline and a candidate server, compared.

For each seed, lm-eval's own task (``lm_eval.simple_evaluate``, model ``local-completions`` against the server's
``/v1/completions``) runs once on the baseline and once on the candidate with the same seeds, so both see
identical prompts (checked through lm-eval's ``prompt_hash``). Scoring is lm-eval's: exact_match under the
``strict-match`` and ``flexible-extract`` filters. Seeds set lm-eval's ``random``/numpy/torch/few-shot seeds and
the request ``seed``: with greedy decoding they still change which few-shot examples precede each question. (SGLang
reads a request's seed only under ``--enable-deterministic-inference``; sampled runs of other servers differ from
run to run.)

Verdict (exit code 0 pass / 1 fail):

- **accuracy**: fails when, for either filter, the candidate's drop exceeds ``--max-drop`` percentage points
  and the paired one-sided test finds it significant at ``--alpha`` (:mod:`sglang_kimi.evals.stats`);
- **identical generations** (``--require-identical``, on by default with greedy decoding): fails when any
  candidate generation differs from the baseline's for the same prompt. A lossless speculative method under
  greedy decoding must reproduce the target's text exactly, so one differing answer is evidence of a bug
  even when accuracy cannot move, e.g. on the tiny CPU model whose GSM8K accuracy is near zero: there the
  accuracy criterion alone could never fire and the gate would be meaningless. Turn it off for sampled
  decoding (off by default there) or for a deliberately lossy candidate (quantized weights); on GPUs in
  bfloat16, batch-shape-dependent rounding can flip near-tie tokens, so inspect the listed differences before
  turning it off.
"""

from __future__ import annotations

import logging
import math
from dataclasses import asdict, dataclass, field

from tqdm.auto import tqdm

from sglang_kimi.evals.errors import EvalError
from sglang_kimi.evals.gsm8k_task import TaskSpec
from sglang_kimi.evals.servers import Server, check_generation_room
from sglang_kimi.evals.stats import Comparison, compare, significant_drop

FILTERS = ("flexible-extract", "strict-match")
DEFAULT_SEED = 1234  # lm-eval's default few-shot seed; seed i of a count is DEFAULT_SEED + i
PASS, FAIL = 0, 1


@dataclass
class GateConfig:
    num_fewshot: int = 5
    limit: int | None = None
    seeds: list[int] = field(default_factory=lambda: [DEFAULT_SEED + i for i in range(3)])
    num_concurrent: int = 16
    max_gen_toks: int = 256
    temperature: float = 0.0
    max_drop: float = 1.0  # percentage points
    alpha: float = 0.05
    require_identical: bool | None = None  # None: on for greedy decoding
    request_timeout: int = 600

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def identical_required(self) -> bool:
        return self.greedy if self.require_identical is None else self.require_identical


def parse_seeds(text: str) -> list[int]:
    """``"3"`` -> three seeds 1234, 1235, 1236; ``"1,7,42"`` -> those seeds."""
    try:
        if "," in text:
            seeds = [int(x) for x in text.split(",") if x.strip()]
        else:
            count = int(text)
            if count < 1:
                raise EvalError(f"--seeds {text}: give a count >= 1 or a comma-separated list of seeds")
            seeds = [DEFAULT_SEED + i for i in range(count)]
    except ValueError:
        raise EvalError(f"--seeds {text}: give a count (3) or a comma-separated list of integers (1,7,42)") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise EvalError(f"--seeds {text}: seeds must be distinct and at least one")
    return seeds


# -- running lm-eval ---------------------------------------------------------------------------------------


@dataclass
class Answer:
    """One generation of one (seed, question): lm-eval's raw text, its filtered answers and scores."""

    doc_id: int
    prompt_hash: str
    target: str
    generation: str
    extracted: dict[str, str]  # filter -> filtered answer
    correct: dict[str, float]  # filter -> exact_match (0.0 / 1.0)


@dataclass
class Run:
    role: str  # "baseline" | "candidate"
    seed: int
    accuracy: dict[str, float]  # filter -> exact_match
    stderr: dict[str, float]
    answers: dict[int, Answer]  # doc_id -> answer
    prompt_tokens_max: int | None = None


def _model_args(server: Server, cfg: GateConfig, seed: int) -> dict:
    return {
        "model": server.served_model_name,
        "base_url": server.url + "/v1/completions",
        "num_concurrent": cfg.num_concurrent,
        "max_retries": 2,
        "tokenized_requests": False,  # send text: no client-side tokenizer, nothing from the hub
        "tokenizer_backend": None,
        "max_gen_toks": cfg.max_gen_toks,
        "seed": seed,
        "timeout": cfg.request_timeout,
    }


def _gen_kwargs(cfg: GateConfig) -> dict | None:
    if cfg.greedy:
        return None  # the task's own: do_sample false, temperature 0
    return {"do_sample": True, "temperature": cfg.temperature}


def task_manager(task: TaskSpec):
    from lm_eval.tasks import TaskManager

    if task.include_path:
        # Index only our folder: the local task includes the stock YAML by absolute path (20 s saved).
        return TaskManager(include_path=task.include_path, include_defaults=False)
    return TaskManager()


def _arguments_prompt(sample: dict) -> str:
    args = sample["arguments"]
    first = args["gen_args_0"] if isinstance(args, dict) else args[0]
    return first["arg_0"] if isinstance(first, dict) else first[0]


def parse_samples(samples: list[dict]) -> dict[int, Answer]:
    """lm-eval's logged samples (one entry per question and filter) -> ``{doc_id: Answer}``."""
    answers: dict[int, Answer] = {}
    for sample in samples:
        doc_id = int(sample["doc_id"])
        answer = answers.get(doc_id)
        if answer is None:
            answer = Answer(
                doc_id=doc_id,
                prompt_hash=sample.get("prompt_hash") or str(hash(_arguments_prompt(sample))),
                target=str(sample.get("target", "")),
                generation=str(sample["resps"][0][0]),
                extracted={},
                correct={},
            )
            answers[doc_id] = answer
        name = sample.get("filter", "none")
        answer.extracted[name] = str(sample["filtered_resps"][0])
        answer.correct[name] = float(sample["exact_match"])
    return answers


def run_lm_eval(server: Server, role: str, seed: int, cfg: GateConfig, task: TaskSpec, manager) -> Run:
    """lm-eval's GSM8K task against one server with one seed."""
    import lm_eval

    try:
        result = lm_eval.simple_evaluate(
            model="local-completions",
            model_args=_model_args(server, cfg, seed),
            tasks=[task.name],
            num_fewshot=cfg.num_fewshot,
            limit=cfg.limit,
            log_samples=True,
            task_manager=manager,
            gen_kwargs=_gen_kwargs(cfg),
            random_seed=seed,
            numpy_random_seed=seed,
            torch_random_seed=seed,
            fewshot_random_seed=seed,
            verbosity="ERROR",
        )
    except EvalError:
        raise
    except Exception as exc:  # lm-eval raises many types: data, HTTP, parsing
        raise EvalError(_explain_lm_eval_failure(exc, server, task)) from exc
    if result is None or task.name not in result.get("results", {}):
        raise EvalError(f"lm-eval returned no {task.name} results for {server.url}")
    metrics = result["results"][task.name]
    accuracy = {f: float(metrics[f"exact_match,{f}"]) for f in FILTERS}
    stderr = {f: _float(metrics.get(f"exact_match_stderr,{f}")) for f in FILTERS}
    answers = parse_samples(result["samples"][task.name])
    return Run(role=role, seed=seed, accuracy=accuracy, stderr=stderr, answers=answers)


def _float(value) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return float("nan")


def _explain_lm_eval_failure(exc: Exception, server: Server, task: TaskSpec) -> str:
    text = f"{type(exc).__name__}: {exc}".replace("\n", " ")[:400]
    lowered = text.lower()
    if task.include_path is None and any(k in lowered for k in ("hub", "connection", "offline", "openai/gsm8k")):
        return (
            f"lm-eval could not load the gsm8k data set ({text}): on an offline machine pass --data-dir with "
            "GSM8K's train.jsonl and test.jsonl"
        )
    if "context length" in lowered or "maximum context" in lowered:
        return (
            f"{server.url}: prompts exceed the model's context ({server.max_model_len} tokens): lower "
            f"--num-fewshot or --max-gen-toks ({text})"
        )
    if "400" in text and "bad request" in lowered:  # lm-eval keeps the status, not the server's reason
        return (
            f"{server.url} refused a request with HTTP 400 (its log says why; usually a few-shot prompt plus "
            f"--max-gen-toks beyond the model's context of {server.max_model_len} tokens: lower --num-fewshot or "
            f"--max-gen-toks) ({text})"
        )
    return f"lm-eval failed against {server.url}: {text}"


def check_generation_fits(cfg: GateConfig, *servers: Server) -> None:
    """Refuse a --max-gen-toks that leaves no room for a prompt in a server's context, before lm-eval runs (the
    server would refuse every request with HTTP 400, after lm-eval's retries)."""
    for server in servers:
        check_generation_room("--max-gen-toks", cfg.max_gen_toks, server)


# -- the gate ----------------------------------------------------------------------------------------------


@dataclass
class Difference:
    seed: int
    doc_id: int
    baseline: str
    candidate: str
    baseline_answer: str
    candidate_answer: str


@dataclass
class GateResult:
    config: dict
    task: dict
    baseline: dict
    candidate: dict
    comparisons: dict[str, Comparison]  # filter -> comparison
    compared: int  # (seed, question) pairs compared
    differing: list[Difference]
    differing_answers: int  # pairs whose flexible-extract answers differ
    checks: dict[str, dict]  # name -> {"passed": bool, "required": bool, "detail": str}
    runs: list[Run]

    @property
    def passed(self) -> bool:
        return all(c["passed"] or not c["required"] for c in self.checks.values())

    @property
    def exit_code(self) -> int:
        return PASS if self.passed else FAIL

    def as_dict(self) -> dict:
        return {
            "verdict": "PASS" if self.passed else "FAIL",
            "exit_code": self.exit_code,
            "config": self.config,
            "task": self.task,
            "baseline": self.baseline,
            "candidate": self.candidate,
            "checks": self.checks,
            "comparisons": {f: c.as_dict() for f, c in self.comparisons.items()},
            "compared_generations": self.compared,
            "differing_generations": len(self.differing),
            "differing_answers": self.differing_answers,
            "differences": [asdict(d) for d in self.differing],
            "runs": [
                {
                    "role": r.role,
                    "seed": r.seed,
                    "accuracy": r.accuracy,
                    "stderr": r.stderr,
                    "answers": [asdict(a) for a in r.answers.values()],
                }
                for r in self.runs
            ],
        }


def pair_runs(runs: list[Run]) -> dict[int, tuple[Run, Run]]:
    """``{seed: (baseline run, candidate run)}`` after checking that both answered the same prompts."""
    by_seed: dict[int, dict[str, Run]] = {}
    for run in runs:
        by_seed.setdefault(run.seed, {})[run.role] = run
    pairs = {}
    for seed, roles in by_seed.items():
        base, cand = roles["baseline"], roles["candidate"]
        if set(base.answers) != set(cand.answers):
            raise EvalError(f"seed {seed}: baseline and candidate were asked different questions")
        mismatched = [d for d in base.answers if base.answers[d].prompt_hash != cand.answers[d].prompt_hash]
        if mismatched:
            raise EvalError(f"seed {seed}: lm-eval built different prompts for questions {mismatched[:5]}")
        pairs[seed] = (base, cand)
    return pairs


def judge(runs: list[Run], cfg: GateConfig) -> tuple[dict[str, Comparison], list[Difference], int, int, dict]:
    """Comparisons per filter, differing generations and the checks of the verdict."""
    pairs = pair_runs(runs)
    seeds = sorted(pairs)
    doc_ids = sorted(pairs[seeds[0]][0].answers)
    comparisons = {}
    for name in FILTERS:
        base = {d: [pairs[s][0].answers[d].correct[name] for s in seeds] for d in doc_ids}
        cand = {d: [pairs[s][1].answers[d].correct[name] for s in seeds] for d in doc_ids}
        comparisons[name] = compare(base, cand)

    differing, differing_answers = [], 0
    for seed in seeds:
        base_run, cand_run = pairs[seed]
        for d in doc_ids:
            b, c = base_run.answers[d], cand_run.answers[d]
            if b.extracted.get("flexible-extract") != c.extracted.get("flexible-extract"):
                differing_answers += 1
            if b.generation != c.generation:
                differing.append(
                    Difference(
                        seed,
                        d,
                        b.generation,
                        c.generation,
                        b.extracted.get("flexible-extract", ""),
                        c.extracted.get("flexible-extract", ""),
                    )
                )
    compared = len(seeds) * len(doc_ids)

    drops = {name: significant_drop(comp, cfg.max_drop, cfg.alpha) for name, comp in comparisons.items()}
    accuracy_detail = "; ".join(
        f"{name}: {100 * comp.delta:+.2f} pp (paired z {_fmt_z(comp.paired_z)}, p {comp.p_drop:.3g})"
        for name, comp in comparisons.items()
    )
    checks = {
        "accuracy": {
            "passed": not any(drops.values()),
            "required": True,
            "detail": f"drop must not exceed {cfg.max_drop:g} pp at significance {cfg.alpha:g}: {accuracy_detail}",
        },
        "identical_generations": {
            "passed": not differing,
            "required": cfg.identical_required,
            "detail": f"{len(differing)} of {compared} generations differ"
            + (
                ""
                if cfg.identical_required
                else " (not required: " + ("sampled decoding)" if not cfg.greedy else "--no-require-identical)")
            ),
        },
    }
    return comparisons, differing, differing_answers, compared, checks


def _fmt_z(z: float) -> str:
    return ("+inf" if z > 0 else "-inf") if math.isinf(z) else f"{z:+.2f}"


def run_gate(baseline: Server, candidate: Server, cfg: GateConfig, task: TaskSpec) -> GateResult:
    """Every seed on both servers, then the verdict."""
    logging.getLogger("lm_eval").setLevel(logging.ERROR)
    manager = task_manager(task)
    runs = []
    plan = [
        (seed, role, server)
        for seed in cfg.seeds
        for role, server in (("baseline", baseline), ("candidate", candidate))
    ]
    with tqdm(plan, desc="GSM8K runs (seed x server)", unit="run", position=0) as bar:
        for seed, role, server in bar:
            bar.set_postfix_str(f"seed {seed} {role}")
            run = run_lm_eval(server, role, seed, cfg, task, manager)
            runs.append(run)
            bar.write(
                f"  seed {seed} {role:<9} flexible-extract {100 * run.accuracy['flexible-extract']:.1f}%  "
                f"strict-match {100 * run.accuracy['strict-match']:.1f}%  ({len(run.answers)} questions)"
            )
    comparisons, differing, differing_answers, compared, checks = judge(runs, cfg)
    config = asdict(cfg) | {"identical_required": cfg.identical_required, "greedy": cfg.greedy}
    return GateResult(
        config=config,
        task=asdict(task) | {"lm_eval_version": _lm_eval_version()},
        baseline=baseline.summary(),
        candidate=candidate.summary(),
        comparisons=comparisons,
        compared=compared,
        differing=differing,
        differing_answers=differing_answers,
        checks=checks,
        runs=runs,
    )


def _lm_eval_version() -> str:
    from importlib.metadata import version

    return version("lm_eval")
