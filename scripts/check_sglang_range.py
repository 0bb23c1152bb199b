#!/usr/bin/env python
"""Check sglang-kimi against a range of SGLang releases without touching the repo's virtual environment.

For every version X (default 0.5.20 ... 0.5.23) SGLang X is installed with ``pip install --no-deps --no-compile
--target <scratch>/sglang-X`` (the wheel from --wheels or from PyPI, kept in <scratch>/wheels; no bytecode compiled
up front: compiling all of SGLang takes longer than the audit, which imports a fraction of it) and every step runs in
a child process with that folder first on ``PYTHONPATH``, so SGLang X shadows the venv's:

1. audit: ``sglang-kimi doctor --strict --json``; the version-range line ("sglang X is outside the supported range")
   is dropped from its problem list, every other problem fails the step;
2. tests: ``pytest tests/unit/test_plugin.py`` (the registration tests);
3. serve: the embedded tiny model served on CPU through ``sglang_kimi.launcher.server.start_server`` with
   ``--attention-backend kimi_cpu``, one server at a time: autoregressive, DFLASH chain, DFLASH tree (budget 16),
   EAGLE3 tree (4 steps, top-k 4, 12 draft tokens); 3 GSM8K prompts x 32 greedy tokens each. Every speculative
   output must equal the autoregressive one token for token, and ``/server_info``
   ``internal_states[0]["sglang_kimi"]`` must report no failed registration. The autoregressive server must also
   answer HTTP 400 to ``/generate`` bodies with keys SGLang would not read (``STRAY_GENERATE_BODIES``).

Every Python process a step starts (the doctor's probe, pytest's probes, SGLang's launcher, scheduler and
detokenizer) records where it imported ``sglang`` from and ``importlib.metadata.version("sglang")`` through a
``sitecustomize`` put first on ``PYTHONPATH``; a step fails if any of them did not get SGLang X (the CPU launcher's
shims come before it on the path). For the servers, the scheduler's pid reported in ``/server_info`` must be among
the recorded processes.

The sglang-kimi checked is the editable install (this working tree), or with ``--plugin`` a commit of this repo or a
source folder, copied to the scratch folder and put on ``PYTHONPATH`` ahead of the editable install (every process
must then import sglang_kimi from that copy, checked the same way): a fixed tree while the working tree changes,
or a candidate patch checked without touching the checkout.

Prints progress lines, then a table (version x step: pass, or the first problem) and writes the full results to
bench/results/sglang_range.json. Not part of CI's default run (minutes per version on CPU).

    .venv/bin/python scripts/check_sglang_range.py                       # 0.5.20 .. 0.5.23
    .venv/bin/python scripts/check_sglang_range.py --versions 0.5.22 --keep
    .venv/bin/python scripts/check_sglang_range.py --keep --plugin HEAD --out /tmp/range.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from sglang_kimi.cli.demo import mode_args as demo_mode_args

REPO = Path(__file__).resolve().parents[1]
DEFAULT_VERSIONS = ("0.5.20", "0.5.21", "0.5.22", "0.5.23")
DEFAULT_SCRATCH = Path("/tmp/sglang_range")
DEFAULT_WHEELS = (Path("/tmp/sgl/w"),)
DEFAULT_OUT = REPO / "bench" / "results" / "sglang_range.json"
IMPORT_LOG_ENV = "SGLANG_RANGE_IMPORT_LOG"

NUM_PROMPTS = 3
MAX_NEW_TOKENS = 32
SERVER_START_TIMEOUT = 600.0


def mode_args(plugin_root: Path) -> dict[str, list[str]]:
    """The server arguments of every serve mode: the demo's, with the drafters of the checked tree's assets."""
    return demo_mode_args(plugin_root / "sglang_kimi" / "assets")


MODES = tuple(mode_args(REPO))
TREE_REFUSAL = "--speculative-dflash-tree-budget needs SGLang 0.5.22 or later"
# /generate bodies with keys GenerateReqInput or SamplingParams would not read: HTTP 400 on every release (the
# plugin's generate-body-keys check; SGLang's API contract, from 0.5.22 on, also refuses the second), checked on the
# autoregressive server
STRAY_GENERATE_BODIES = (
    {"text": "hi", "max_new_tokens": 4},
    {"text": "hi", "sampling_params": {"max_new_tokens": 4, "temprature": 0}},
)


def release(version: str) -> tuple[int, ...]:
    from packaging.version import Version

    return Version(version).release[:3]


STEPS = ("audit", "tests", "serve")

# Put first on every child's PYTHONPATH: records, once per process, where `import sglang` resolves and the
# version importlib.metadata reports, then lets the import go on with exactly that spec.
SITECUSTOMIZE = """\
# Written by sglang-kimi scripts/check_sglang_range.py: records where this process imports sglang and sglang_kimi
# from (resolved by the finders after this one, exactly as the import itself would be), then imports that spec.
import os as _os
import sys as _sys

if _os.environ.get("%(env)s"):

    class _ImportRecorder:
        pending = {"sglang", "sglang_kimi"}

        @classmethod
        def find_spec(cls, name, path=None, target=None):
            if name not in cls.pending:
                return None
            cls.pending.discard(name)
            import json

            spec = None
            for finder in _sys.meta_path:
                if finder is cls or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(name, path, target)
                if spec is not None:
                    break
            found = None
            if name == "sglang":
                try:
                    from importlib.metadata import version

                    found = version("sglang")
                except Exception as exc:
                    found = "error: %%s" %% exc
            try:
                with open("/proc/self/cmdline", "rb") as f:
                    cmdline = f.read().replace(b"\\0", b" ").decode(errors="replace").strip()
            except OSError:
                cmdline = " ".join(_sys.argv)
            record = {"module": name, "pid": _os.getpid(), "ppid": _os.getppid(), "cmdline": cmdline[:300],
                      "origin": spec.origin if spec else None, "version": found}
            with open(_os.environ["%(env)s"], "a") as f:
                f.write(json.dumps(record) + "\\n")
            return spec

    _sys.meta_path.insert(0, _ImportRecorder)
""" % {"env": IMPORT_LOG_ENV}


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def short(text: str, width: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[: width - 3] + "..."


# -- what is checked: SGLang X from a scratch folder, the plugin from this checkout or a snapshot of a commit ------


def find_wheel(version: str, dirs: list[Path]) -> Path | None:
    for folder in dirs:
        found = sorted(folder.glob(f"sglang-{version}-*.whl")) if folder.is_dir() else []
        if found:
            return found[0]
    return None


def install(version: str, scratch: Path, wheel_dirs: list[Path], keep: bool) -> dict:
    target = scratch / f"sglang-{version}"
    dist_info = target / f"sglang-{version}.dist-info"
    if keep and dist_info.is_dir() and (target / "sglang" / "__init__.py").exists():
        return {"status": "pass", "target": str(target), "reused": True}
    cache = scratch / "wheels"
    cache.mkdir(parents=True, exist_ok=True)
    wheel = find_wheel(version, [*wheel_dirs, cache])
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--cache-dir", str(scratch / "pip-cache")]
    if wheel is None:
        out = subprocess.run(
            pip + ["download", "--no-deps", "--only-binary=:all:", "-d", str(cache), f"sglang=={version}"],
            capture_output=True,
            text=True,
        )
        wheel = find_wheel(version, [cache])
        if wheel is None:
            return {"status": "fail", "problems": [f"pip download sglang=={version}: {out.stderr.strip()[-500:]}"]}
    shutil.rmtree(target, ignore_errors=True)
    out = subprocess.run(
        pip + ["install", "--quiet", "--no-compile", "--no-deps", "--target", str(target), str(wheel)],
        capture_output=True,
        text=True,
    )
    if out.returncode != 0 or not dist_info.is_dir():
        return {"status": "fail", "problems": [f"pip install --target {target} {wheel.name}: {out.stderr[-500:]}"]}
    return {"status": "pass", "target": str(target), "wheel": str(wheel), "reused": False}


def snapshot_plugin(plugin: str, scratch: Path) -> tuple[Path, str]:
    """A copy of sglang-kimi under the scratch folder: ``git archive`` of a commit of this repo, or a copy of a
    source folder. Laid out as the installed package (the ``package-dir`` folders of pyproject.toml linked into
    ``sglang_kimi/``), so that it shadows the editable install from ``PYTHONPATH``: what is checked stays fixed
    whatever the working tree holds meanwhile. Returns the copy and what it was made from."""
    import hashlib

    import tomllib

    source = Path(plugin).expanduser()
    if source.is_dir():
        source = source.resolve()
        root = scratch / f"plugin-dir-{hashlib.sha1(str(source).encode()).hexdigest()[:12]}"
        shutil.rmtree(root, ignore_errors=True)  # a folder may have changed since the last run: copy it again
        shutil.copytree(
            source,
            root,
            symlinks=True,
            ignore=shutil.ignore_patterns(
                ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache", ".hypothesis"
            ),
        )
        origin = str(source)
    else:
        sha = subprocess.run(
            ["git", "rev-parse", "--verify", f"{plugin}^{{commit}}"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        root = scratch / f"plugin-{sha[:12]}"
        origin = f"commit {sha}"
        if not (root / "sglang_kimi" / "__init__.py").exists():
            shutil.rmtree(root, ignore_errors=True)
            root.mkdir(parents=True)
            archive = subprocess.run(["git", "archive", sha], cwd=REPO, capture_output=True, check=True).stdout
            subprocess.run(["tar", "-x", "-C", str(root)], input=archive, check=True)
    package_dir = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"].get("package-dir", {})
    for package, folder in package_dir.items():
        link = root / package.replace(".", "/")
        if package.startswith("sglang_kimi.") and not link.exists() and (root / folder).is_dir():
            link.symlink_to(root / folder, target_is_directory=True)
    return root, origin


def child_env(version_dir: Path, probe_dir: Path, import_log: Path, plugin_path: Path | None) -> dict[str, str]:
    env = dict(os.environ)
    first = [str(probe_dir), str(version_dir)] + ([str(plugin_path)] if plugin_path else [])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [*first, env.get("PYTHONPATH")]))
    env[IMPORT_LOG_ENV] = str(import_log)
    env.pop("SGLANG_PLUGINS", None)  # the plugin must be loaded by SGLang's own loader, as in production
    return env


def check_imports(import_log: Path, version: str, target: Path, plugin_root: Path) -> tuple[list[dict], list[str]]:
    """The processes that imported sglang (and sglang_kimi) during a step, and one problem per process that did not
    get sglang ``version`` from ``target`` or sglang_kimi from ``plugin_root``."""
    records = []
    if import_log.exists():
        records = [json.loads(line) for line in import_log.read_text().splitlines() if line.strip()]
    problems = []
    for rec in records:
        origin = rec.get("origin") or ""
        if rec["module"] == "sglang":
            if rec.get("version") != version or not origin.startswith(str(target) + os.sep):
                problems.append(
                    f"process {rec['pid']} ({short(rec['cmdline'], 80)}) imported sglang "
                    f"{rec.get('version')} from {origin or 'nowhere'}, not {version} from {target}"
                )
        elif not origin.startswith(str(plugin_root) + os.sep):
            problems.append(
                f"process {rec['pid']} ({short(rec['cmdline'], 80)}) imported sglang_kimi from "
                f"{origin or 'nowhere'}, not from {plugin_root}"
            )
    sglang_records = [r for r in records if r["module"] == "sglang"]
    if not sglang_records:
        problems.append("no process recorded an import of sglang (the sitecustomize probe did not run)")
    return sglang_records, problems


# -- the three steps ---------------------------------------------------------------------------------------------


def sglang_kimi_command() -> list[str]:
    script = Path(sys.executable).parent / "sglang-kimi"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "import sys; from sglang_kimi.cli.main import main; sys.exit(main())"]


def run_child(argv: list[str], timeout: float, **kwargs) -> subprocess.CompletedProcess:
    """subprocess.run that ends the child with SIGTERM (so it stops its servers) on a timeout or an interrupt."""
    proc = subprocess.Popen(argv, **kwargs)
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        raise
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def step_audit(version: str, env: dict[str, str], logs: Path, cwd: Path) -> dict:
    out = run_child(
        sglang_kimi_command() + ["doctor", "--strict", "--json"],
        1800,
        env=env,
        cwd=str(cwd),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    (logs / "doctor.stdout").write_text(out.stdout)
    (logs / "doctor.stderr").write_text(out.stderr)
    start = out.stdout.find("{")
    try:
        report = json.loads(out.stdout[start:]) if start >= 0 else None
    except json.JSONDecodeError:
        report = None
    if report is None:
        return {
            "status": "fail",
            "problems": [f"doctor printed no JSON (rc {out.returncode}): {out.stderr.strip()[-800:]}"],
        }
    version_line = f"sglang {version} is outside the supported range"
    dropped = [p for p in report["problems"] if p.startswith(version_line)]
    problems = [p for p in report["problems"] if not p.startswith(version_line)]
    if report["versions"].get("sglang") != version:
        problems.insert(0, f"doctor saw sglang {report['versions'].get('sglang')}, not {version}")
    audit = report.get("audit") or {}
    return {
        "status": "fail" if problems else "pass",
        "doctor_rc": out.returncode,
        "problems": problems,
        "dropped": dropped,
        "checked": audit.get("checked"),
        "registrations": (report.get("plugin") or {}).get("registrations"),
    }


def step_tests(version: str, env: dict[str, str], logs: Path, cwd: Path) -> dict:
    junit = logs / "test_plugin.xml"
    argv = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-ra",
        "-p",
        "no:cacheprovider",
        f"--junitxml={junit}",
        "tests/unit/test_plugin.py",
    ]
    from sglang_kimi.launcher.server import SHIMS_DIR, shims_needed

    if "torchvision" in shims_needed():  # SGLang 0.5.20 imports torchvision with the package itself
        env = dict(env, PYTHONPATH=os.pathsep.join([env["PYTHONPATH"], str(SHIMS_DIR)]))  # after: a real one wins
    out = run_child(argv, 1800, env=env, cwd=str(cwd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    (logs / "pytest.log").write_text(out.stdout)
    if not junit.exists():
        return {"status": "fail", "problems": [f"pytest did not run (rc {out.returncode}): {out.stdout[-800:]}"]}
    cases, failures = 0, []
    for case in ET.parse(junit).getroot().iter("testcase"):
        cases += 1
        for tag in ("failure", "error"):
            bad = case.find(tag)
            if bad is not None:
                message = (bad.get("message") or bad.text or "").strip()
                failures.append({"test": case.get("name"), "kind": tag, "message": message[:4000]})
    problems = [f"{f['test']}: {short(f['message'], 600)}" for f in failures]
    if out.returncode not in (0, 1) and not failures:
        problems.append(f"pytest exited with code {out.returncode}")
    return {"status": "fail" if problems else "pass", "tests": cases, "failed": failures, "problems": problems}


def step_serve(version: str, env: dict[str, str], logs: Path, modes: list[str], plugin_root: Path) -> dict:
    result_path = logs / "serve.json"
    result_path.unlink(missing_ok=True)
    argv = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--serve-child",
        "--child-version",
        version,
        "--child-logs",
        str(logs),
        "--child-result",
        str(result_path),
        "--modes",
        ",".join(modes),
        "--child-plugin-root",
        str(plugin_root),
    ]
    # The child prints its own progress lines; it runs the servers one after another.
    proc = run_child(argv, len(modes) * 1500, env=env, cwd=str(plugin_root))
    if not result_path.exists():
        return {"status": "fail", "problems": [f"the serve child exited with code {proc.returncode} and no result"]}
    res = json.loads(result_path.read_text())
    res["status"] = "pass" if all(r["status"] in ("pass", "refused") for r in res["modes"].values()) else "fail"
    res["problems"] = [f"{m}: {p}" for m, r in res["modes"].items() for p in r.get("problems", [])]
    return res


# -- the serve child: runs inside the environment of SGLang X ---------------------------------------------------


def gsm8k_prompts(plugin_root: Path, n: int) -> list[str]:
    path = plugin_root / "sglang_kimi" / "assets" / "gsm8k_demo.jsonl"
    questions = [json.loads(line)["question"] for line in path.read_text().splitlines() if line.strip()][:n]
    return [f"Question: {q}\nAnswer:" for q in questions]


EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*(Error|Exception|Interrupt)\b.*)$")
# Lines that report that something else failed, not what.
WRAPPER_ERRORS = ("scheduler died during initialization", "EOFError")


def log_errors(log_path: Path) -> list[str]:
    """The distinct exception lines of a server log, in order (import noise and wrappers left out)."""
    if not log_path.exists():
        return []
    found: list[str] = []
    for line in log_path.read_text(errors="replace").splitlines():
        m = EXCEPTION_LINE.match(line.strip())
        if m and "Ignore import error" not in line and not line.startswith(WRAPPER_ERRORS[1]):
            if WRAPPER_ERRORS[0] not in line and m.group(1) not in found:
                found.append(m.group(1))
    return found


def serve_one(mode: str, args: list[str], version: str, logs: Path, prompts: list[str]) -> dict:
    import requests

    from sglang_kimi.launcher.server import ANY_PORT, LaunchError, start_server

    log_path = logs / f"serve-{mode}.log"
    problems: list[str] = []
    result: dict = {"args": args, "log": str(log_path)}
    started = time.monotonic()
    try:
        server = start_server(
            ["--attention-backend", "kimi_cpu", *args],
            port=ANY_PORT,
            log_path=log_path,
            timeout=SERVER_START_TIMEOUT,
        )
    except LaunchError as exc:
        errors = log_errors(log_path)
        first = str(exc).splitlines()[0].split(";")[0]
        if (
            mode == "dflash-tree"
            and release(version) < (0, 5, 22)
            and TREE_REFUSAL in log_path.read_text(errors="replace")
        ):
            # documented: DFLASH draft trees need SGLang 0.5.22+ (KVLocPlan); a clear start-up refusal is the result
            result.update(status="refused", problems=[], start_s=round(time.monotonic() - started, 1))
            return result
        result.update(
            status="fail",
            problems=[f"{first}: {errors[-1]}" if errors else first],
            log_errors=errors,
            start_s=round(time.monotonic() - started, 1),
        )
        return result
    result["start_s"] = round(time.monotonic() - started, 1)
    try:
        info = requests.get(server.base_url + "/server_info", timeout=60).json()
        result["server_info_version"] = info.get("version")
        if info.get("version") != version:
            problems.append(f"/server_info reports sglang {info.get('version')}, not {version}")
        states = info.get("internal_states") or [{}]
        state = (states[0] or {}).get("sglang_kimi")
        if not state:
            problems.append(
                '/server_info internal_states[0] has no "sglang_kimi" entry (the server-info hook did '
                "not run in the scheduler)"
            )
        else:
            result["scheduler_pid"] = state.get("pid")
            result["failed_registrations"] = {n: state["registrations"][n] for n in state.get("failed", [])}
            result["not_ok"] = {n: v for n, v in state.get("registrations", {}).items() if v != "ok"}
            if state.get("failed"):
                problems.append(
                    "failed registrations: " + "; ".join(f"{n}: {v}" for n, v in result["failed_registrations"].items())
                )
        t0 = time.monotonic()
        outputs, verify_steps = [], 0
        for prompt in prompts:
            body = {"text": prompt, "sampling_params": {"max_new_tokens": MAX_NEW_TOKENS, "temperature": 0.0}}
            response = requests.post(server.base_url + "/generate", json=body, timeout=1200)
            if response.status_code != 200:
                problems.append(f"/generate answered {response.status_code}: {short(response.text, 300)}")
                break
            out = response.json()
            outputs.append(out["output_ids"])
            verify_steps += out["meta_info"].get("spec_verify_ct", 0) or 0
        result["generate_s"] = round(time.monotonic() - t0, 1)
        for stray in STRAY_GENERATE_BODIES if mode == "autoregressive" else ():
            response = requests.post(server.base_url + "/generate", json=stray, timeout=120)
            result.setdefault("stray_keys", []).append([response.status_code, short(response.text, 200)])
            if response.status_code != 400:
                problems.append(f"/generate {json.dumps(stray)} answered {response.status_code}, not 400")
        result["output_ids"] = outputs
        tokens = sum(len(o) for o in outputs)
        result["tokens"] = tokens
        if verify_steps:
            result["tokens_per_verify"] = round(tokens / verify_steps, 3)
            # The plugin's acceptance counters (spec-acceptance-metrics) count exactly the verify steps SGLang reports.
            after = requests.get(server.base_url + "/server_info", timeout=60).json()
            spec = ((after.get("internal_states") or [{}])[0].get("sglang_kimi") or {}).get("spec_metrics") or {}
            result["spec_metrics"] = {"steps": spec.get("steps"), "tau": spec.get("tau"), "verify_ct": verify_steps}
            if state and spec.get("steps") != verify_steps:
                problems.append(
                    f"the plugin's spec_metrics count {spec.get('steps')} verify steps, SGLang's "
                    f"spec_verify_ct {verify_steps}"
                )
    except Exception as exc:  # a server that died mid-request: report it with its log's last error
        errors = log_errors(log_path)
        problems.append(f"{type(exc).__name__}: {short(exc, 300)}" + (f"; log: {errors[-1]}" if errors else ""))
    finally:
        server.stop()
    result["log_errors"] = log_errors(log_path)
    result["problems"] = problems
    result["status"] = "fail" if problems else "pass"
    return result


def serve_child(version: str, logs: Path, result_path: Path, modes: list[str], plugin_root: Path) -> int:
    # SIGTERM from the parent (timeout, Ctrl-C): unwind, so that start_server / serve_one stop the running server.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    prompts = gsm8k_prompts(plugin_root, NUM_PROMPTS)
    all_args = mode_args(plugin_root)
    results: dict = {"modes": {}}
    reference = None
    for mode in modes:
        log(f"{version} serve {mode}: starting")
        r = serve_one(mode, all_args[mode], version, logs, prompts)
        if mode == "autoregressive":
            reference = r.get("output_ids") if r.get("output_ids") and len(r["output_ids"]) == len(prompts) else None
        elif r.get("output_ids") is not None:
            if reference is None:
                r["problems"].append("no autoregressive output to compare with")
            else:
                for i, (got, ref) in enumerate(zip(r["output_ids"], reference)):
                    if got != ref:
                        j = next((k for k, (a, b) in enumerate(zip(got, ref)) if a != b), min(len(got), len(ref)))
                        r["problems"].append(
                            f"prompt {i}: differs from autoregressive at token {j}: "
                            f"{got[j : j + 4]} vs {ref[j : j + 4]}"
                        )
                        break
                else:
                    r["matches_autoregressive"] = True
            r["status"] = "fail" if r["problems"] else "pass"
        results["modes"][mode] = r
        log(
            f"{version} serve {mode}: {r['status']}"
            + (f": {short(r['problems'][0], 200)}" if r["problems"] else "")
            + f" (start {r.get('start_s')} s, generate {r.get('generate_s')} s)"
        )
    result_path.write_text(json.dumps(results, indent=1))
    return 0


# -- driver ------------------------------------------------------------------------------------------------------


def run_version(version: str, args: argparse.Namespace, probe_dir: Path, plugin_root: Path) -> dict:
    scratch: Path = args.scratch
    logs = scratch / "logs" / version
    shutil.rmtree(logs, ignore_errors=True)
    logs.mkdir(parents=True)
    out: dict = {"logs": str(logs)}
    t0 = time.monotonic()
    inst = install(version, scratch, args.wheels, args.keep)
    inst["seconds"] = round(time.monotonic() - t0, 1)
    out["install"] = inst
    log(f"{version} install: {inst['status']}{' (reused)' if inst.get('reused') else ''} ({inst['seconds']} s)")
    if inst["status"] != "pass":
        return out
    target = Path(inst["target"])
    for step in args.steps:
        import_log = logs / f"{step}.imports.jsonl"
        env = child_env(target, probe_dir, import_log, plugin_root if args.plugin else None)
        log(f"{version} {step}: running")
        t0 = time.monotonic()
        try:
            if step == "audit":
                res = step_audit(version, env, logs, plugin_root)
            elif step == "tests":
                res = step_tests(version, env, logs, plugin_root)
            else:
                res = step_serve(version, env, logs, args.modes, plugin_root)
        except subprocess.TimeoutExpired as exc:
            res = {"status": "fail", "problems": [f"timed out after {exc.timeout:.0f} s"]}
        res["seconds"] = round(time.monotonic() - t0, 1)
        records, import_problems = check_imports(import_log, version, target, plugin_root)
        res["sglang_imports"] = {"processes": len(records), "problems": import_problems}
        if step == "serve":
            pids = {rec["pid"] for rec in records}
            for mode, r in res.get("modes", {}).items():
                pid = r.get("scheduler_pid")
                if pid is not None and pid not in pids:
                    r["problems"].append(f"the scheduler (pid {pid}) left no record of its sglang import")
                    r["status"] = "fail"
        if import_problems:
            res.setdefault("problems", [])[:0] = import_problems
            res["status"] = "fail"
        out[step] = res
        first = (res.get("problems") or [""])[0]
        log(
            f"{version} {step}: {res.get('status')} ({res['seconds']} s; {len(records)} processes imported sglang "
            f"{version} from {target})" + (f": {short(first, 200)}" if first else "")
        )
    return out


def cell(res: dict | None, width: int) -> str:
    if res is None:
        return "-"
    seconds = res.get("seconds")
    if seconds is None and "start_s" in res:
        seconds = round((res.get("start_s") or 0) + (res.get("generate_s") or 0), 1)
    timing = f" {seconds:.0f}s" if seconds is not None else ""
    if res.get("status") == "pass":
        return f"pass{timing}"
    if res.get("status") == "refused":
        return "refused (needs 0.5.22+)"
    first = (res.get("problems") or ["fail"])[0]
    return short(f"FAIL{timing}: {first}", width)


def print_table(results: dict, modes: list[str], steps: list[str], width: int = 46) -> None:
    cols = [s for s in steps if s != "serve"] + ([*modes] if "serve" in steps else [])
    rows = []
    for version, r in results.items():
        row = [version]
        for col in cols:
            if col in STEPS:
                res = r.get(col)
                if res is None and r["install"]["status"] != "pass":
                    row.append(short("FAIL install: " + r["install"]["problems"][0], width))
                elif col == "tests" and res and res.get("tests") is not None:
                    n, bad = res["tests"], len(res.get("failed", []))
                    row.append(
                        cell(res, width).replace("pass", f"pass {n}/{n}", 1)
                        if not res["problems"]
                        else short(f"FAIL {bad}/{n} {res['seconds']:.0f}s: {res['problems'][0]}", width)
                    )
                else:
                    row.append(cell(res, width))
            else:
                row.append(cell((r.get("serve") or {}).get("modes", {}).get(col), width))
        rows.append(row)
    header = ["sglang", *cols]
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header)]
    line = lambda cells: " | ".join(c.ljust(w) for c, w in zip(cells, widths))  # noqa: E731
    print()
    print(line(header))
    print("-+-".join("-" * w for w in widths))
    for row in rows:
        print(line(row))
    print()
    for version, r in results.items():
        for col in cols:
            res = r.get(col) if col in STEPS else (r.get("serve") or {}).get("modes", {}).get(col)
            if col == "serve":
                continue
            for problem in (res or {}).get("problems", []):
                print(f"{version} {col}: {problem}")


def parse_list(text: str) -> list[str]:
    return [x for x in re.split(r"[,\s]+", text) if x]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--versions",
        type=parse_list,
        default=list(DEFAULT_VERSIONS),
        help="SGLang releases to check, comma-separated (default: %(default)s)",
    )
    p.add_argument("--keep", action="store_true", help="reuse the scratch installs of earlier runs")
    p.add_argument("--scratch", type=Path, default=DEFAULT_SCRATCH, help="scratch folder (default: %(default)s)")
    p.add_argument(
        "--wheels",
        type=lambda s: [Path(x) for x in parse_list(s)],
        default=list(DEFAULT_WHEELS),
        help="folders searched for sglang-X-*.whl before PyPI (default: /tmp/sgl/w)",
    )
    p.add_argument("--steps", type=parse_list, default=list(STEPS), help="subset of audit,tests,serve")
    p.add_argument("--modes", type=parse_list, default=list(MODES), help="serve modes (default: all four)")
    p.add_argument(
        "--plugin",
        help="the sglang-kimi to check instead of the editable install (this working tree): "
        "a commit of this repo (git archive) or a source folder, copied to the scratch folder and put on "
        "PYTHONPATH ahead of the editable install",
    )
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON results (default: %(default)s)")
    p.add_argument("--serve-child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--child-version", help=argparse.SUPPRESS)
    p.add_argument("--child-logs", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--child-result", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--child-plugin-root", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if unknown := [s for s in args.steps if s not in STEPS] + [m for m in args.modes if m not in MODES]:
        p.error(f"unknown steps/modes: {unknown}")
    if args.serve_child:
        return serve_child(args.child_version, args.child_logs, args.child_result, args.modes, args.child_plugin_root)
    if "autoregressive" not in args.modes and len(args.modes) > 0:
        args.modes = ["autoregressive", *args.modes]  # the reference of every speculative mode

    args.scratch.mkdir(parents=True, exist_ok=True)
    probe_dir = args.scratch / "probe"
    probe_dir.mkdir(exist_ok=True)
    (probe_dir / "sitecustomize.py").write_text(SITECUSTOMIZE)
    if args.plugin:
        plugin_root, origin = snapshot_plugin(args.plugin, args.scratch)
    else:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=REPO, capture_output=True, text=True).stdout
        plugin_root = REPO
        origin = f"working tree at commit {commit.strip()}" + (" with uncommitted changes" if dirty.strip() else "")
    log(f"sglang-kimi from {plugin_root} ({origin})")

    results: dict = {}
    started = time.monotonic()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: run_child ends the running child
    for version in args.versions:
        t0 = time.monotonic()
        results[version] = run_version(version, args, probe_dir, plugin_root)
        results[version]["seconds"] = round(time.monotonic() - t0, 1)
        log(f"{version}: done in {results[version]['seconds']} s")
    all_args = mode_args(plugin_root)
    report = {
        "generated": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "plugin": {"root": str(plugin_root), "from": origin},
        "python": sys.version.split()[0],
        "steps": args.steps,
        "modes": {m: all_args[m] for m in args.modes},
        "prompts": NUM_PROMPTS,
        "max_new_tokens": MAX_NEW_TOKENS,
        "seconds": round(time.monotonic() - started, 1),
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print_table(results, args.modes, args.steps)
    print(f"results: {args.out}")
    ok = all(r.get(s, {}).get("status") == "pass" for r in results.values() for s in args.steps)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
