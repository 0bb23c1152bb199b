"""``sglang-kimi eval gsm8k`` / ``bench``: help, and one clear error line with exit code 2 for each bad input."""

import json
import subprocess
import sys

import pytest
from support.fake_servers import serve, sglang_payloads

from sglang_kimi.cli import main as cli
from sglang_kimi.evals.errors import EvalError
from sglang_kimi.evals.servers import check_same_model, normalize_url, probe
from sglang_kimi.launcher.api_key import ENV, use_api_key
from sglang_kimi.launcher.checks import free_port


@pytest.fixture
def data_dir(tmp_path):
    """A minimal GSM8K-format folder: enough for the checks that run before any server is asked."""
    root = tmp_path / "gsm8k"
    root.mkdir()
    for split in ("train", "test"):
        (root / f"{split}.jsonl").write_text('{"question": "2 + 2?", "answer": "2 + 2 = 4\\n#### 4"}\n')
    return str(root)


def _run(capsys, *argv: str) -> tuple[int, str]:
    code = cli.main(list(argv))
    err = capsys.readouterr().err.strip()
    return code, err


def _one_error_line(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("sglang-kimi: error: ")
    return lines[0]


@pytest.mark.parametrize("command", [["eval", "gsm8k"], ["bench"]])
def test_help(command):
    out = subprocess.run(
        [sys.executable, "-m", "sglang_kimi.cli.main", *command, "--help"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert f"usage: sglang-kimi {' '.join(command)}" in out.stdout
    for flag in (
        [
            "--baseline",
            "--candidate",
            "--launch",
            "--num-fewshot",
            "--seeds",
            "--max-drop",
            "--require-identical",
            "--data-dir",
            "exit code 0 pass, 1 fail, 2 error",
        ]
        if command[0] == "eval"
        else [
            "--base-url",
            "--baseline-url",
            "--concurrency",
            "--dataset",
            "--input-len",
            "--output-len",
            "--preset",
            "--warmup-requests",
            "10240",
        ]
    ):
        assert flag in out.stdout


# -- eval ------------------------------------------------------------------------------------------------


def test_eval_unreachable_url(capsys, data_dir):
    port = free_port()
    with serve(sglang_payloads()) as good:
        code, err = _run(
            capsys,
            "eval",
            "gsm8k",
            "--baseline",
            good,
            "--candidate",
            f"http://127.0.0.1:{port}",
            "--data-dir",
            data_dir,
            "--limit",
            "2",
        )
    assert code == 2
    line = _one_error_line(err)
    assert f"cannot reach http://127.0.0.1:{port}" in line and "is the server running" in line


def test_eval_server_that_is_not_sglang(capsys, data_dir):
    with serve(None) as html, serve(sglang_payloads()) as good:
        code, err = _run(
            capsys, "eval", "gsm8k", "--baseline", good, "--candidate", html, "--data-dir", data_dir, "--limit", "2"
        )
    assert code == 2
    line = _one_error_line(err)
    assert f"{html} is not an SGLang server" in line and "HTTP 404" in line


def test_eval_servers_of_different_models(capsys, data_dir):
    with serve(sglang_payloads()) as a, serve(sglang_payloads(architecture="LlamaForCausalLM", tokens=(9, 9))) as b:
        code, err = _run(
            capsys, "eval", "gsm8k", "--baseline", a, "--candidate", b, "--data-dir", data_dir, "--limit", "2"
        )
    assert code == 2
    line = _one_error_line(err)
    assert "serve different models" in line and "LlamaForCausalLM" in line and "tokenizer" in line


def _checkpoint(root, layers: int):
    root.mkdir()
    config = {
        "architectures": ["KimiK25ForConditionalGeneration"],
        "model_type": "kimi_k25",
        "text_config": {"vocab_size": 4096, "hidden_size": 256, "num_hidden_layers": layers},
    }
    (root / "config.json").write_text(json.dumps(config))
    return str(root)


def test_different_checkpoints_readable_here_are_told_apart_by_their_config(tmp_path):
    six, four = _checkpoint(tmp_path / "six", 6), _checkpoint(tmp_path / "four", 4)
    with (
        serve(sglang_payloads(model_path=six)) as a,
        serve(sglang_payloads(model_path=four)) as b,
        serve(sglang_payloads(model_path=six)) as c,
    ):
        with pytest.raises(EvalError, match="num_hidden_layers 6 vs 4"):
            check_same_model(probe(a), probe(b))
        check_same_model(probe(a), probe(c))  # the same checkpoint: no error


def _running(pid: int, port: int = 30000, seed: int = 7) -> dict:
    payloads = sglang_payloads()
    payloads[("GET", "/server_info")].update(
        port=port, random_seed=seed, internal_states=[{"sglang_kimi": {"pid": pid}}]
    )
    return payloads


def test_a_server_is_not_compared_with_itself(capsys, data_dir):
    """The same URL twice, or two URLs of one server (its port, launch seed and scheduler pid): the gate would pass
    whatever the server does."""
    with serve(_running(pid=11)) as a, serve(_running(pid=11)) as a_again, serve(_running(pid=12)) as b:
        code, err = _run(
            capsys, "eval", "gsm8k", "--baseline", a, "--candidate", a + "/", "--data-dir", data_dir, "--limit", "2"
        )
        assert code == 2 and "are the same server" in _one_error_line(err)
        with pytest.raises(EvalError, match="are the same server"):
            check_same_model(probe(a), probe(a_again))
        check_same_model(probe(a), probe(b))  # another scheduler


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--limit", "0"], "--limit 0: give at least 1 question"),
        (["--seeds", "0"], "--seeds 0"),
        (["--seeds", "a,b"], "--seeds a,b"),
        (["--num-fewshot", "-1"], "--num-fewshot -1"),
        (["--temperature", "-0.5"], "--temperature -0.5"),
        (["--temperature", "nan"], "--temperature nan"),
        (["--temperature", "0.7", "--require-identical"], "--require-identical with --temperature 0.7"),
        (["--max-drop", "inf"], "--max-drop must be >= 0"),
        (["--launch-timeout", "inf"], "--launch-timeout inf: give a number of seconds above 0"),
        (["--request-timeout", "0"], "--request-timeout 0: give a number of seconds above 0"),
    ],
)
def test_eval_bad_numbers(capsys, extra, message):
    code, err = _run(
        capsys, "eval", "gsm8k", "--baseline", "http://127.0.0.1:1", "--candidate", "http://127.0.0.1:1", *extra
    )
    assert code == 2
    assert message in _one_error_line(err)


def test_eval_data_dir_without_the_files(capsys, tmp_path):
    (tmp_path / "train.jsonl").write_text('{"question": "q", "answer": "#### 1"}\n')
    code, err = _run(
        capsys,
        "eval",
        "gsm8k",
        "--baseline",
        "http://127.0.0.1:1",
        "--candidate",
        "http://127.0.0.1:1",
        "--data-dir",
        str(tmp_path),
        "--output-dir",
        str(tmp_path / "out"),
    )
    assert code == 2
    assert "has no test.jsonl" in _one_error_line(err)
    code, err = _run(
        capsys,
        "eval",
        "gsm8k",
        "--baseline",
        "http://127.0.0.1:1",
        "--candidate",
        "http://127.0.0.1:1",
        "--data-dir",
        str(tmp_path / "nowhere"),
    )
    assert code == 2
    assert "is not a folder" in _one_error_line(err)


def test_eval_launch_timeout_refused_before_the_servers_start(capsys, monkeypatch):
    from sglang_kimi.evals import servers

    monkeypatch.setattr(servers, "launch_pair", lambda *a, **k: pytest.fail("servers were started"))
    code, err = _run(capsys, "eval", "gsm8k", "--launch", "--launch-timeout", "-1")
    assert code == 2
    assert "--launch-timeout -1.0: give a number of seconds above 0" in _one_error_line(err)


def test_eval_launch_without_the_data_set_refused_before_the_servers_start(capsys, monkeypatch, tmp_path):
    """Offline and without --data-dir, lm-eval would fail once both (slow to start) servers are up."""
    import datasets

    from sglang_kimi.evals import hub_data, servers

    def offline(*args, **kwargs):
        raise ConnectionError("no route to the hub")

    monkeypatch.setattr(hub_data, "hub_reachable", lambda endpoint: True)  # the hub's host answers, its data does not
    monkeypatch.setattr(datasets, "load_dataset", offline)
    monkeypatch.setattr(servers, "launch_pair", lambda *a, **k: pytest.fail("servers were started"))
    code, err = _run(capsys, "eval", "gsm8k", "--launch", "--output-dir", str(tmp_path / "out"))
    assert code == 2
    assert "cannot load the gsm8k data set openai/gsm8k (ConnectionError)" in _one_error_line(err)
    assert "--data-dir" in _one_error_line(err)


def test_eval_needs_two_servers_or_launch(capsys):
    code, err = _run(capsys, "eval", "gsm8k", "--baseline", "http://127.0.0.1:1")
    assert code == 2 and "--candidate" in _one_error_line(err)
    code, err = _run(capsys, "eval", "gsm8k", "--launch", "--baseline", "http://127.0.0.1:1")
    assert code == 2 and "--launch starts both servers" in _one_error_line(err)
    code, err = _run(capsys, "eval")
    assert code == 2 and "eval gsm8k" in _one_error_line(err)
    servers = ["--baseline", "http://127.0.0.1:1", "--candidate", "http://127.0.0.1:2"]
    code, err = _run(capsys, "eval", "gsm8k", *servers, "--launch-timeout", "60")
    assert code == 2 and "--launch-timeout only apply with --launch" in _one_error_line(err)


def test_eval_launch_starts_both_servers_with_their_own_flags(capsys, data_dir, monkeypatch):
    """--launch: one launcher call with the model and each server's flags; the gate then probes what it started
    (here two fronts of different models: refused, and the launched servers are stopped with the stack)."""
    from sglang_kimi.evals import servers

    launched = {}

    def launch_pair(specs, stack, log_dir, timeout):
        launched.update(specs=specs, timeout=timeout)
        a = stack.enter_context(serve(sglang_payloads()))
        b = stack.enter_context(serve(sglang_payloads(architecture="LlamaForCausalLM")))
        return {"baseline": a, "candidate": b}

    monkeypatch.setattr(servers, "launch_pair", launch_pair)
    code, err = _run(
        capsys, "eval", "gsm8k", "--launch", "--model-path", "/m/kimi", "--baseline-args", "--enable-metrics",
        "--candidate-args", "--tp 8 --speculative-algorithm DFLASH --speculative-draft-model-path '/d/my drafter'",
        "--launch-timeout", "77", "--data-dir", data_dir, "--limit", "2",
    )  # fmt: skip
    assert launched["specs"] == {
        "baseline": ["--model-path", "/m/kimi", "--enable-metrics"],  # one flag, typed after a space
        "candidate": ["--model-path", "/m/kimi", "--tp", "8", "--speculative-algorithm", "DFLASH",
                      "--speculative-draft-model-path", "/d/my drafter"],
    }  # fmt: skip
    assert launched["timeout"] == 77
    assert code == 2 and "serve different models" in _one_error_line(err)


# -- bench -----------------------------------------------------------------------------------------------


def test_bench_unreachable_url(capsys, tmp_path):
    port = free_port()
    out_dir = tmp_path / "results"
    code, err = _run(capsys, "bench", "--base-url", f"127.0.0.1:{port}", "--output-dir", str(out_dir))
    assert code == 2
    assert f"cannot reach http://127.0.0.1:{port}" in _one_error_line(err)
    assert not out_dir.exists()  # nothing was measured: no empty results folder is left behind


def test_bench_server_that_is_not_sglang(capsys, tmp_path):
    with serve(None) as html:
        code, err = _run(capsys, "bench", "--base-url", html, "--output-dir", str(tmp_path))
    assert code == 2
    assert "is not an SGLang server" in _one_error_line(err)


def test_bench_baseline_of_a_different_model(capsys, tmp_path):
    with serve(sglang_payloads()) as a, serve(sglang_payloads(architecture="Qwen3ForCausalLM")) as b:
        code, err = _run(capsys, "bench", "--base-url", a, "--baseline-url", b, "--output-dir", str(tmp_path))
    assert code == 2
    assert "serve different models" in _one_error_line(err)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--base-url", "http://127.0.0.1:1", "--concurrency", "0,8"], "--concurrency 0,8"),
        (["--base-url", "http://127.0.0.1:1", "--concurrency", "one"], "--concurrency one"),
        (["--launch", "--concurrency", "1,8,1,8"], "--concurrency 1,8,1,8: 1, 8 given more than once"),
        ([], "give --base-url"),
        (["--launch", "--base-url", "http://127.0.0.1:1"], "--launch starts the server"),
        (["--launch", "--baseline-url", "http://127.0.0.1:1", "--baseline-args", ""], "give the baseline once"),
        (["--base-url", "http://127.0.0.1:1", "--server-args", "--tp 2"], "only apply with --launch"),
        (["--base-url", "http://127.0.0.1:1", "--server-args", "--enable-lora"], "only apply with --launch"),
        (["--base-url", "http://127.0.0.1:1", "--launch-timeout", "60"], "--launch-timeout only apply with --launch"),
        # load flags are refused before a launched server starts (launch_pair would fail this test: no SGLang here)
        (["--launch", "--output-len", "1"], "--output-len 1: TPOT needs at least 2 output tokens"),
        (["--launch", "--num-prompts", "0"], "--num-prompts 0: give 1 or more"),
        (["--launch", "--input-len", "0"], "--input-len 0: give 1 or more"),
        (["--launch", "--warmup-requests", "-1"], "--warmup-requests -1: give 0 or more"),
        (["--launch", "--launch-timeout", "0"], "--launch-timeout 0.0: give a number of seconds above 0"),
        (["--launch", "--launch-timeout", "nan"], "--launch-timeout nan: give a number of seconds above 0"),
        # a flag the chosen prompts would ignore
        (["--launch", "--input-len", "512"], "--input-len sets the length of random prompts"),
        (["--launch", "--preset", "gsm8k", "--input-len", "512"], "add --dataset random, or drop --input-len"),
        (["--launch", "--preset", "long", "--data-dir", "/d"], "--data-dir holds GSM8K questions"),
        (["--launch", "--dataset", "random", "--data-dir", "/d"], "--dataset random makes its own prompts"),
    ],
)
def test_bench_bad_flags(capsys, tmp_path, argv, message):
    code, err = _run(capsys, "bench", *argv, "--output-dir", str(tmp_path))
    assert code == 2
    assert message in _one_error_line(err)


def test_bench_prompts_that_cannot_load_are_refused_before_the_servers_start(capsys, monkeypatch, tmp_path):
    """A launched Kimi server takes many minutes to start: the GSM8K folder is checked first."""
    from sglang_kimi.evals import bench

    monkeypatch.setattr(bench, "launch_pair", lambda *a, **k: pytest.fail("servers were started"))
    (tmp_path / "gsm8k").mkdir()
    code, err = _run(capsys, "bench", "--launch", "--data-dir", str(tmp_path / "gsm8k"), "--output-dir", str(tmp_path))
    assert code == 2
    assert "has no test.jsonl" in _one_error_line(err)


def test_bench_output_len_and_context_checked_against_the_server(capsys, tmp_path):
    with serve(sglang_payloads()) as a:
        code, err = _run(
            capsys,
            "bench",
            "--base-url",
            a,
            "--dataset",
            "random",
            "--input-len",
            "5000",
            "--output-dir",
            str(tmp_path),
        )
        assert code == 2 and "exceed the model's context (4096 tokens)" in _one_error_line(err)
        code, err = _run(capsys, "bench", "--base-url", a, "--output-len", "1", "--output-dir", str(tmp_path))
        assert code == 2 and "--output-len 1" in _one_error_line(err)


def test_normalize_url():
    assert normalize_url("127.0.0.1:30000") == "http://127.0.0.1:30000"
    assert normalize_url("http://h:1/v1/") == "http://h:1"


@pytest.mark.parametrize("command", [["eval", "gsm8k", "--candidate"], ["bench", "--base-url"]])
def test_a_server_started_with_an_api_key(capsys, monkeypatch, data_dir, tmp_path, command):
    monkeypatch.setenv(ENV, "")  # no key; the variable is restored after the test, whatever --api-key set
    with serve(sglang_payloads(), api_key="k1") as keyed, serve(sglang_payloads()) as open_server:
        argv = [*command, keyed, "--data-dir", data_dir, "--output-dir", str(tmp_path)]
        if command[0] == "eval":
            argv += ["--baseline", open_server]
        code, err = _run(capsys, *argv)
        assert code == 2
        line = _one_error_line(err)
        assert "GET /model_info: the server wants an API key (HTTP 401" in line and "--api-key KEY" in line
        code, err = _run(capsys, *argv, "--api-key", "k2")
        assert code == 2 and "the server refused the API key" in _one_error_line(err)
        # the key given once reaches every request of the process: the probe now passes
        use_api_key("k1")
        assert probe(keyed).model_path == "/m/tiny"
        assert probe(open_server).model_path == "/m/tiny"  # a server without a key ignores the header


@pytest.mark.parametrize("command", ["eval", "bench"])
def test_unwritable_output_dir_refused_before_any_request(capsys, tmp_path, command):
    blocker = tmp_path / "file"
    blocker.write_text("")
    cases = [(blocker, "is a file: give a folder"), (blocker / "sub", "cannot create it")]
    for out_dir, message in cases:
        # unreachable servers: a check made after contacting them would report that instead
        argv = (
            ["eval", "gsm8k", "--baseline", "http://127.0.0.1:1", "--candidate", "http://127.0.0.1:1"]
            if command == "eval"
            else ["bench", "--base-url", "http://127.0.0.1:1"]
        )
        code, err = _run(capsys, *argv, "--output-dir", str(out_dir))
        assert code == 2 and message in _one_error_line(err), err
    fresh = tmp_path / "a" / "b"
    _run(capsys, *(["bench", "--base-url", "http://127.0.0.1:1"]), "--output-dir", str(fresh))
    assert not (tmp_path / "a").exists()  # the check's folders are removed again
