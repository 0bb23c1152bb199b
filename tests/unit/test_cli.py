"""The CLI: help on every command, and one clear error line for each kind of bad input."""

import json
import os
import re
import socket
import subprocess
import sys
import tempfile
from types import SimpleNamespace

import pytest
from support.hub_cache import cache_snapshot

from sglang_kimi.cli import main as cli
from sglang_kimi.launcher import checks as launch_checks
from sglang_kimi.launcher import server

COMMANDS = ["serve", "demo", "doctor", "tune moe"]


def _sglang_kimi(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "sglang_kimi.cli.main", *args], capture_output=True, text=True, timeout=120, env=env
    )


def test_top_level_help_lists_commands():
    out = _sglang_kimi("--help")
    assert out.returncode == 0
    for command in COMMANDS:
        assert command.split()[0] in out.stdout


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help(command):
    out = _sglang_kimi(*command.split(), "--help")
    assert out.returncode == 0, out.stderr
    assert f"usage: sglang-kimi {command}" in out.stdout


def test_serve_help_explains_pass_through_and_cpu_defaults():
    text = _sglang_kimi("serve", "--help").stdout
    assert "sglang.launch_server" in text and "--attention-backend kimi_cpu" in text


def _error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_serve_missing_model_path(capsys, tmp_path):
    assert cli.main(["serve", "--model-path", str(tmp_path / "nope")]) == 2
    line = _error_line(capsys)
    assert "does not exist" in line and str(tmp_path / "nope") in line and "--model-path" in line


def test_serve_hub_id_offline(capsys, tmp_path, monkeypatch):
    """A hub id is SGLang's to download; with HF_HUB_OFFLINE set it must already be in the hub cache."""
    import huggingface_hub.constants

    # huggingface_hub reads HF_HUB_CACHE when it is first imported, which may have been earlier in this process
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert cli.main(["serve", "--model-path", "org/kimi-test"]) == 2
    line = _error_line(capsys)
    assert "org/kimi-test" in line and "HF_HUB_OFFLINE" in line and "hf download org/kimi-test" in line
    assert cli.main(["serve", "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "org/d"]) == 2
    line = _error_line(capsys)
    assert "--speculative-draft-model-path org/d is no local folder" in line and "HF_HUB_OFFLINE" in line
    (tmp_path / "config.json").write_text("{}")
    cache_snapshot(tmp_path / "hf" / "hub", "org/kimi-test", [tmp_path / "config.json"])
    launch_checks.check_model_path("org/kimi-test")  # cached: served offline
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")  # huggingface_hub reads "0" as online
    monkeypatch.setattr(launch_checks, "hub_problem", lambda repo_id, revision=None: None)  # a hub that has it
    launch_checks.check_model_path("org/other-model")


def test_serve_hub_id_the_hub_cannot_give(capsys, tmp_path, monkeypatch):
    """Online, a hub id not in the cache is asked for once: no answer, no such repository or a gated one is refused
    naming the fix (SGLang retried for about a minute, then ended with a traceback); other answers are SGLang's."""
    import huggingface_hub
    import huggingface_hub.constants
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv(launch_checks.MODELSCOPE_ENV, raising=False)
    asked = []

    def answer(outcome):
        def file_exists(repo_id, filename, revision=None):
            asked.append((repo_id, filename, revision))
            if isinstance(outcome, Exception):
                raise outcome
            return outcome

        monkeypatch.setattr(huggingface_hub, "file_exists", file_exists)

    answer(OSError("[Errno -2] Name or service not known"))
    assert cli.main(["serve", "--model-path", "org/kimi-test"]) == 2
    line = _error_line(capsys)
    assert "cannot be reached (OSError: [Errno -2]" in line and "hf download org/kimi-test" in line
    assert "HF_ENDPOINT" in line and asked == [("org/kimi-test", "config.json", None)]
    drafter = ["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", "org/drafter"]
    assert cli.main(["serve", *drafter, "--speculative-draft-model-revision", "v2"]) == 2
    assert "--speculative-draft-model-path org/drafter is not in the Hugging Face cache" in _error_line(capsys)
    assert asked[-1] == ("org/drafter", "config.json", "v2")
    answer(False)
    assert cli.main(["serve", "--model-path", "org/kimi-test", "--revision", "v9"]) == 2
    assert "no config.json there at revision v9" in _error_line(capsys)
    response = SimpleNamespace(headers={}, request=None)  # what the hub's errors read of an HTTP answer
    answer(GatedRepoError("gated", response=response))
    with pytest.raises(server.LaunchError, match="gated: accept its terms"):
        launch_checks.check_model_path("org/kimi-test")
    for outcome in (True, HfHubHTTPError("429 Too Many Requests", response=response)):  # it is there / SGLang's to say
        answer(outcome)
        launch_checks.check_model_path("org/kimi-test")
    answer(OSError("unreachable"))
    monkeypatch.setenv(launch_checks.MODELSCOPE_ENV, "true")  # SGLang downloads from ModelScope: the hub is not asked
    launch_checks.check_model_path("org/kimi-test")


def test_serve_model_folder_without_config(capsys, tmp_path):
    assert cli.main(["serve", "--model-path", str(tmp_path)]) == 2
    assert "no config.json" in _error_line(capsys)


def test_serve_port_in_use(capsys, tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        port = sock.getsockname()[1]
        assert cli.main(["serve", "--model-path", str(tmp_path), "--port", str(port)]) == 2
    line = _error_line(capsys)
    assert f"port {port}" in line and "already in use" in line and "--port" in line


def test_serve_port_whose_connections_linger_is_free(capsys, tmp_path):
    """A port whose last connections are in TIME_WAIT (a server stopped just now) binds for SGLang's server, which
    sets SO_REUSEADDR (as uvicorn's listener here): the launcher must not call it in use."""
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        accepted, _ = listener.accept()
        accepted.close()  # the server side closes first: its end of the connection lingers in TIME_WAIT
        client.close()
    launch_checks.check_port_free("127.0.0.1", port)


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--port", "70000"], "--port 70000 is outside 1..65535"),
        (["--port", "http"], "--port http is not a number"),
        (["--host", "no-such-host.invalid"], "--host no-such-host.invalid is not an address of this machine"),
        (["--host", "192.0.2.1"], "cannot listen on 192.0.2.1:"),  # TEST-NET-1: never this machine's
        (["--tp", "two"], "--tp two is not a positive number"),
        (["--dp-size", "0"], "--dp-size 0 is not a positive number"),
    ],
)
def test_serve_bad_network_and_parallel_flags(capsys, tmp_path, flags, message):
    (tmp_path / "config.json").write_text("{}")
    assert cli.main(["serve", "--model-path", str(tmp_path), *flags]) == 2
    assert message in _error_line(capsys)


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--questions", "0"], "argument --questions: 0: give 1 or more"),
        (["--questions", "-1"], "argument --questions: -1: give 1 or more"),
        (["--max-new-tokens", "0"], "argument --max-new-tokens: 0: give 1 or more"),
        (["--port", "0"], "argument --port: 0 is outside 1..65535"),
    ],
)
def test_demo_bad_numbers_are_refused_by_the_parser(capsys, flags, message):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["demo", *flags])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_demo_refuses_more_questions_than_it_has(capsys, monkeypatch):
    monkeypatch.setattr(server, "sglang_version", lambda: "0.5.23")
    assert cli.main(["demo", "--questions", "99"]) == 2
    assert "--questions 99: the demo has 5 questions" in _error_line(capsys)


def test_demo_refuses_a_log_dir_it_cannot_create(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(server, "sglang_version", lambda: "0.5.23")
    (tmp_path / "file").write_text("")
    assert cli.main(["demo", "--log-dir", str(tmp_path / "file" / "logs")]) == 2
    assert "--log-dir" in (line := _error_line(capsys)) and "cannot create it" in line


def test_demo_refuses_a_mode_given_twice(capsys, monkeypatch):
    monkeypatch.setattr(server, "sglang_version", lambda: "0.5.23")
    monkeypatch.setattr("sglang_kimi.cli.demo.run_mode", lambda *a: pytest.fail("a server was started"))
    assert cli.main(["demo", "--modes", "autoregressive", "dflash-tree", "dflash-tree"]) == 2
    assert "--modes names dflash-tree more than once" in _error_line(capsys)


def test_serve_unsupported_sglang_version(capsys, monkeypatch):
    monkeypatch.setattr(server, "sglang_version", lambda: "0.4.9")
    assert cli.main(["serve"]) == 2
    line = _error_line(capsys)
    assert "0.4.9" in line and "pip install sglang==0.5.23" in line and "--allow-untested-sglang" in line


@pytest.mark.parametrize("command", ["demo", "serve"])
def test_missing_sglang_names_the_install_command(capsys, monkeypatch, command):
    monkeypatch.setattr(server, "sglang_version", lambda: None)
    assert cli.main([command]) == 2
    line = _error_line(capsys)
    assert "SGLang is not installed" in line and "pip install 'sglang-kimi[sglang]'" in line and "make install" in line


def test_cpu_launch_command_applies_defaults_and_keeps_user_flags(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    spec = server.launch_command(
        ["--model-path", str(tmp_path), "--dtype", "bfloat16"], cpu=True, port=server.free_port()
    )
    argv = spec.argv
    assert argv[1:3] == ["-m", "sglang.launch_server"]
    assert argv[argv.index("--device") + 1] == "cpu"
    assert argv[argv.index("--attention-backend") + 1] == "kimi_cpu"  # serves every speculative mode
    assert argv.count("--dtype") == 1 and argv[argv.index("--dtype") + 1] == "bfloat16"
    assert spec.env["SGLANG_USE_CPU_ENGINE"] == "1"
    assert set(spec.shims) <= {"sgl_kernel", "torchvision"}
    assert (str(server.SHIMS_DIR) in spec.env.get("PYTHONPATH", "")) == bool(spec.shims)


def test_device_flag_decides_cpu_settings(tmp_path, monkeypatch):
    """--device cpu gets the CPU settings on a GPU machine too; --device cuda without a visible GPU is refused."""
    (tmp_path / "config.json").write_text("{}")
    model = ["--model-path", str(tmp_path)]
    monkeypatch.setattr(server, "has_gpu", lambda: True)
    spec = server.launch_command([*model, "--device", "cpu"], port=server.ANY_PORT)
    assert spec.cpu and spec.env["SGLANG_USE_CPU_ENGINE"] == "1"
    assert spec.argv[spec.argv.index("--attention-backend") + 1] == "kimi_cpu"
    assert not server.launch_command(model, port=server.ANY_PORT).cpu
    monkeypatch.setattr(server, "has_gpu", lambda: False)
    with pytest.raises(server.LaunchError, match="--device cuda, but torch sees no GPU.*drop --device"):
        server.launch_command([*model, "--device=cuda"], port=server.ANY_PORT)
    assert server.launch_command(model, port=server.ANY_PORT).cpu


def test_cpu_launch_stays_online_for_a_hub_id(tmp_path, monkeypatch):
    """Local checkpoints are served offline on CPU (no hub lookups); a hub id must be downloadable, unless the user
    set HF_HUB_OFFLINE themselves."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(launch_checks, "hub_problem", lambda repo_id, revision=None: None)  # a hub that has the drafter
    (tmp_path / "config.json").write_text("{}")
    local = server.launch_command(["--model-path", str(tmp_path)], cpu=True, port=server.ANY_PORT)
    assert local.env["HF_HUB_OFFLINE"] == "1"
    drafter = ["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", "org/drafter"]
    hub = server.launch_command(["--model-path", str(tmp_path), *drafter], cpu=True, port=server.ANY_PORT)
    assert "HF_HUB_OFFLINE" not in hub.env
    monkeypatch.setattr(launch_checks, "_in_hub_cache", lambda repo_id, revision=None: True)  # offline: cached
    for value in ("0", "1"):  # the user's own setting is kept, local folder or hub id
        monkeypatch.setenv("HF_HUB_OFFLINE", value)
        for args in (["--model-path", str(tmp_path)], ["--model-path", str(tmp_path), *drafter]):
            assert server.launch_command(args, cpu=True, port=server.ANY_PORT).env["HF_HUB_OFFLINE"] == value


SGLANG_PARSE = """
import argparse, json, sys
from sglang.srt.plugins import load_plugins
load_plugins()  # as sglang.launch_server does: the plugin registers its kimi_cpu backend
from sglang.srt.server_args import ServerArgs
parser = argparse.ArgumentParser()
ServerArgs.add_cli_args(parser)
deprecated = {s for a in parser._actions if "Deprecated" in type(a).__name__ for s in a.option_strings}
args = parser.parse_args(json.loads(sys.argv[1]))
print("RESULT=" + json.dumps({"deprecated": sorted(deprecated), "cuda_graph_config": str(args.cuda_graph_config),
                              "decode": args.cuda_graph_backend_decode, "prefill": args.cuda_graph_backend_prefill}))
"""


SGLANG_MERGE = """
import argparse, json, sys
from sglang.srt.plugins import load_plugins
load_plugins()
from sglang.srt.server_args import ServerArgs
from sglang.srt.utils.server_args_config_parser import ConfigArgumentMerger
parser = argparse.ArgumentParser()
ServerArgs.add_cli_args(parser)
args = parser.parse_args(ConfigArgumentMerger(parser).merge_config_with_args(json.loads(sys.argv[1])))
print("RESULT=" + json.dumps({k: getattr(args, k) for k in (
    "model_path", "port", "host", "attention_backend", "dtype", "skip_server_warmup", "tp_size")}))
"""


def test_flags_of_a_config_file_count_as_given(tmp_path, monkeypatch):
    """``serve --config kimi.yaml`` (SGLang's YAML config files): the launcher's defaults do not override what the file
    sets (SGLang puts the file's flags first, so a default on the command line would win: the embedded tiny model
    served instead of the file's), a relative path in it and the file's own path work from the server's working
    directory, and SGLang's own merge reads the result as the file says."""
    model = tmp_path / "ckpt"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (tmp_path / "kimi.yaml").write_text("model-path: ckpt\nport: 31313\ndtype: bfloat16\nskip-server-warmup: false\n")
    monkeypatch.chdir(tmp_path)
    spec = server.launch_command(["--config=kimi.yaml"], cpu=True)
    argv = spec.argv[spec.argv.index("sglang.launch_server") + 1 :]
    assert argv[argv.index("--config") + 1] == str(tmp_path / "kimi.yaml")
    assert str(server.TINY_MODEL) not in argv and argv[argv.index("--model-path") + 1] == str(model)
    assert "--port" not in argv and "--dtype" not in argv and "--skip-server-warmup" not in argv
    assert spec.port == 31313
    out = subprocess.run(
        [sys.executable, "-c", SGLANG_MERGE, json.dumps(argv)], env=spec.env, capture_output=True, text=True,
        timeout=300, cwd=tempfile.gettempdir(),  # another working directory: the paths are absolute
    )  # fmt: skip
    line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT=")), None)
    assert out.returncode == 0 and line, out.stderr[-3000:]
    assert json.loads(line[len("RESULT=") :]) == {
        "model_path": str(model), "port": 31313, "host": "127.0.0.1", "attention_backend": "kimi_cpu",
        "dtype": "bfloat16", "skip_server_warmup": False, "tp_size": 1,
    }  # fmt: skip
    # parallel sizes set in the file count for the CPU core binding too
    (tmp_path / "tp.yaml").write_text("tp-size: 2\n")
    assert server.parallel_ranks(server.config_file_args(["--config", "tp.yaml"])) == (2, "--tp-size 2")


def test_relative_paths_work_from_the_servers_working_directory(tmp_path, monkeypatch):
    """The server runs in a neutral working directory: paths the user names relative to theirs are made absolute,
    inputs where they exist (a hub id or a template name is kept), outputs always, and a KV scales file in
    SGLANG_KIMI_KV_SCALES too."""
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text("{}")
    (tmp_path / "kimi.jinja").write_text("{{ messages }}")
    (tmp_path / "scales.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SGLANG_KIMI_KV_SCALES", "scales.json")
    args = ["--model-path", "ckpt", "--chat-template=kimi.jinja", "--tokenizer-path", "org/tokenizer"]
    args += ["--speculative-kimi-adaptive-profile", "profiles/kimi.json", "--crash-dump-folder", "/abs/dumps"]
    args += ["--completion-template", "deepseek"]
    spec = server.launch_command(args, cpu=True, port=server.ANY_PORT)
    argv = spec.argv
    assert argv[argv.index("--model-path") + 1] == str(tmp_path / "ckpt")
    assert f"--chat-template={tmp_path / 'kimi.jinja'}" in argv
    assert argv[argv.index("--tokenizer-path") + 1] == "org/tokenizer"  # a hub id
    assert argv[argv.index("--completion-template") + 1] == "deepseek"  # a template name
    assert argv[argv.index("--speculative-kimi-adaptive-profile") + 1] == str(tmp_path / "profiles" / "kimi.json")
    assert argv[argv.index("--crash-dump-folder") + 1] == "/abs/dumps"
    assert spec.env["SGLANG_KIMI_KV_SCALES"] == str(tmp_path / "scales.json")
    monkeypatch.setenv("SGLANG_KIMI_KV_SCALES", "observe")
    assert server.launch_command(args, cpu=True, port=server.ANY_PORT).env["SGLANG_KIMI_KV_SCALES"] == "observe"


@pytest.mark.parametrize(
    "name, text, message",
    [
        ("kimi.json", "{}", "SGLang reads config files in YAML"),
        ("kimi.yaml", None, "does not exist"),
        ("kimi.yaml", "model-path: [unclosed", "is not readable YAML"),
        ("kimi.yaml", "- a list\n", "a mapping of flag names to values"),
    ],
)
def test_unusable_config_file_is_refused(tmp_path, name, text, message):
    if text is not None:
        (tmp_path / name).write_text(text)
    with pytest.raises(server.LaunchError, match=message):
        server.launch_command(["--config", str(tmp_path / name)], cpu=True, port=server.ANY_PORT)


def test_cpu_defaults_are_flags_sglang_does_not_deprecate():
    """Every flag the launcher adds on CPU parses in SGLang's own parser, none of them deprecated there (a deprecated
    spelling warns on every start, and is the next to be removed), and CUDA graphs are off in both phases."""
    spec = server.launch_command([], cpu=True, port=server.free_port())
    args = spec.argv[spec.argv.index("sglang.launch_server") + 1 :]
    out = subprocess.run(
        [sys.executable, "-c", SGLANG_PARSE, json.dumps(args)],
        env=spec.env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT=")), None)
    assert out.returncode == 0 and line, out.stderr[-3000:]
    result = json.loads(line[len("RESULT=") :])
    assert "--disable-cuda-graph" in result["deprecated"]  # what the check sees: the parser's deprecated spellings
    used = [a for a in args if a.split("=")[0] in result["deprecated"]]
    assert not used, f"the CPU launch passes SGLang flags it deprecates: {used}"
    assert result["decode"] == result["prefill"] == "disabled"


@pytest.mark.parametrize("dtype", ["fp8_e4m3", "fp8_e5m2", "mxfp8", "nvfp4"])
def test_cpu_launch_refuses_kv_cache_dtypes_sglang_cannot_serve_there(tmp_path, dtype):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(server.LaunchError, match=f"--kv-cache-dtype {dtype} is not served on CPU.*auto or bf16"):
        server.launch_command(
            ["--model-path", str(tmp_path), f"--kv-cache-dtype={dtype}"], cpu=True, port=server.free_port()
        )
    gpu = server.launch_command(
        ["--model-path", str(tmp_path), "--kv-cache-dtype", dtype], cpu=False, port=server.free_port()
    )
    assert gpu.argv[gpu.argv.index("--kv-cache-dtype") + 1] == dtype


@pytest.mark.parametrize(
    "flags",
    [
        ["--kv-cache-dtype", "bf16"],
        ["--kv-cache-dtype", "auto"],
        ["--kv-cache-dtype", "fp8_e4m3", "--attention-backend", "intel_amx"],
    ],
)
def test_cpu_launch_passes_kv_cache_dtypes_sglang_serves_there(tmp_path, flags):
    (tmp_path / "config.json").write_text("{}")
    spec = server.launch_command(["--model-path", str(tmp_path), *flags], cpu=True, port=server.free_port())
    assert spec.argv[spec.argv.index("--kv-cache-dtype") + 1] == flags[1]


@pytest.mark.parametrize(
    "flag, reason",
    [
        ("--enable-return-routed-experts", "pinned host memory"),
        ("--enable-hierarchical-cache", "cudaHostRegister"),
        ("--enable-deterministic-inference", "batch-invariant kernels run on CUDA and XPU"),
        ("--enable-memory-saver", "torch_memory_saver"),
        ("--enable-lora", "LoRA layers keep their buffers in pinned host memory"),
        ("--enable-two-batch-overlap", "CUDA streams"),
        ("--enable-watermark", "watermarking runs on CUDA devices only"),
        ("--speculative-use-block-verification", "CUDA and ROCm sampling kernel"),
    ],
)
def test_cpu_launch_refuses_flags_whose_machinery_needs_a_gpu(tmp_path, flag, reason):
    (tmp_path / "config.json").write_text("{}")
    args = ["--model-path", str(tmp_path), flag]
    with pytest.raises(server.LaunchError, match=f"{flag} is not served on CPU: .*{reason}.*drop the flag on CPU"):
        server.launch_command(args, cpu=True, port=server.free_port())
    config = tmp_path / "serve.yaml"  # set in a --config file, the same
    config.write_text(f"{flag.removeprefix('--')}: true\n")
    with pytest.raises(server.LaunchError, match=f"{flag} is not served on CPU"):
        server.launch_command(["--model-path", str(tmp_path), "--config", str(config)], cpu=True, port=server.ANY_PORT)
    config.write_text(f"{flag.removeprefix('--')}: false\n")  # switched off there: served
    server.launch_command(["--model-path", str(tmp_path), "--config", str(config)], cpu=True, port=server.ANY_PORT)
    assert flag in server.launch_command(args, cpu=False, port=server.free_port()).argv


def test_cpu_launch_refuses_torch_compile_where_sglang_s_cpu_graph_runner_cannot_run(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    model = ["--model-path", str(tmp_path), "--enable-torch-compile"]
    with pytest.raises(server.LaunchError, match="with --attention-backend kimi_cpu: .*only the intel_amx backend"):
        server.launch_command(model, cpu=True, port=server.ANY_PORT)
    with pytest.raises(server.LaunchError, match="with --attention-backend torch_native"):
        server.launch_command([*model, "--attention-backend", "torch_native"], cpu=True, port=server.ANY_PORT)
    dflash = ["--speculative-algorithm", "DFLASH", "--attention-backend", "intel_amx"]
    with pytest.raises(server.LaunchError, match="--speculative-algorithm DFLASH .*serves no speculative algorithm"):
        server.launch_command([*model, *dflash], cpu=True, port=server.ANY_PORT)
    amx = server.launch_command([*model, "--attention-backend", "intel_amx"], cpu=True, port=server.ANY_PORT)
    assert "--enable-torch-compile" in amx.argv
    assert "--enable-torch-compile" in server.launch_command(model, cpu=False, port=server.ANY_PORT).argv


def test_cpu_launch_refuses_lora_adapters_and_prefill_graphs(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    model = ["--model-path", str(tmp_path)]
    with pytest.raises(server.LaunchError, match="--lora-paths is not served on CPU: .*pinned host memory"):
        server.launch_command([*model, "--lora-paths", "a=/tmp/a"], cpu=True, port=server.ANY_PORT)
    with pytest.raises(server.LaunchError, match="--cuda-graph-backend-prefill full is not served on CPU.*disabled"):
        server.launch_command([*model, "--cuda-graph-backend-prefill", "full"], cpu=True, port=server.ANY_PORT)
    disabled = server.launch_command([*model, "--cuda-graph-backend-prefill=disabled"], cpu=True, port=server.ANY_PORT)
    assert "--cuda-graph-backend-prefill=disabled" in disabled.argv


def test_cpu_launch_refuses_pages_the_kimi_cpu_backend_does_not_serve(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(server.LaunchError, match="--page-size 16: the kimi_cpu attention backend keeps one token"):
        server.launch_command(["--model-path", str(tmp_path), "--page-size", "16"], cpu=True, port=server.free_port())
    one = server.launch_command(["--model-path", str(tmp_path), "--page-size=1"], cpu=True, port=server.free_port())
    assert "--page-size=1" in one.argv
    gpu = server.launch_command(
        ["--model-path", str(tmp_path), "--page-size", "16"], cpu=False, port=server.free_port()
    )
    assert gpu.argv[gpu.argv.index("--page-size") + 1] == "16"


def test_gpu_launch_command_adds_no_cpu_settings(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    spec = server.launch_command(["--model-path", str(tmp_path)], cpu=False, port=server.free_port())
    assert "--device" not in spec.argv and "--attention-backend" not in spec.argv
    assert spec.env == {**os.environ, "PYTHONSAFEPATH": "1"} and spec.shims == []


def test_gpu_launch_serves_a_checkpoint_without_image_processor_text_only(tmp_path):
    tiny = server.launch_command([], cpu=False, port=server.free_port())  # the embedded model: no image processor
    assert tiny.argv.count("--language-model-only") == 1
    (tmp_path / "config.json").write_text(json.dumps({"vision_config": {}, "text_config": {}}))
    spec = server.launch_command(["--model-path", str(tmp_path)], cpu=False, port=server.free_port())
    assert spec.argv.count("--language-model-only") == 1
    given = server.launch_command(
        ["--model-path", str(tmp_path), "--language-model-only"], cpu=False, port=server.free_port()
    )
    assert given.argv.count("--language-model-only") == 1
    (tmp_path / "preprocessor_config.json").write_text("{}")  # a processor ships: multimodal as the user asked
    with_processor = server.launch_command(["--model-path", str(tmp_path)], cpu=False, port=server.free_port())
    assert "--language-model-only" not in with_processor.argv


def test_disaggregated_servers_get_no_language_model_only(tmp_path):
    """SGLang refuses --language-model-only with --disaggregation-mode: a text-only checkpoint serves on CPU without
    the CPU default, and a multimodal one that SGLang could start only with the flag is refused naming the fix."""
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["DeepseekV3ForCausalLM"]}))
    for mode in ("prefill", "decode"):
        spec = server.launch_command(
            ["--model-path", str(tmp_path), "--disaggregation-mode", mode], cpu=True, port=server.free_port()
        )
        assert "--language-model-only" not in spec.argv and "--device" in spec.argv
    plain = server.launch_command(["--model-path", str(tmp_path)], cpu=True, port=server.free_port())
    assert "--language-model-only" in plain.argv  # the CPU default elsewhere
    with pytest.raises(server.LaunchError, match="refuses with --disaggregation-mode decode; serve a text-only"):
        server.launch_command(["--disaggregation-mode", "decode"], cpu=False, port=server.free_port())  # the tiny one


def test_gpu_launch_leaves_text_models_alone(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["DeepseekV3ForCausalLM"]}))
    spec = server.launch_command(["--model-path", str(tmp_path)], cpu=False, port=server.free_port())
    assert "--language-model-only" not in spec.argv


def test_tune_moe_refuses_without_gpu():
    no_gpu = dict(os.environ, CUDA_VISIBLE_DEVICES="", HIP_VISIBLE_DEVICES="")  # also on a machine that has one
    out = _sglang_kimi("tune", "moe", "--max-configs", "1", env=no_gpu)
    assert out.returncode != 0
    assert "needs a CUDA or ROCm GPU" in out.stderr


def test_demo_compares_answers_by_text_and_the_reference_tokens():
    from sglang_kimi.cli.demo import Answer, same_answer

    reference = Answer("q", "So 2 + 2 = 4.", [5, 6, 7], 1.0)
    assert same_answer(Answer("q", "So 2 + 2 = 4.", [5, 6, 7], 0.5), reference)
    # a speculative step accepted two tokens past the stop string: the text is trimmed, the ids are not
    assert same_answer(Answer("q", "So 2 + 2 = 4.", [5, 6, 7, 8, 9], 0.5), reference)
    assert not same_answer(Answer("q", "So 2 + 2 = 5.", [5, 6, 7], 0.5), reference)
    assert not same_answer(Answer("q", "So 2 + 2 = 4.", [5, 6, 8, 9], 0.5), reference)
    assert not same_answer(Answer("q", "So 2 + 2 = 4.", [5, 6], 0.5), reference)


def test_demo_exit_code_follows_the_table(capsys):
    """The table's "= autoregressive" column and the exit code come from one comparison: a speculative answer that
    overshoots a stop string in output_ids (same text) exits 0, a real difference or a failed registration exits 1."""
    from sglang_kimi.cli.demo import Answer, ModeResult, exit_code, print_summary

    ok_state = {"registrations": {"server-info": "ok"}, "failed": []}
    reference = ModeResult("autoregressive", [Answer("q", "So 4.", [5, 6, 7], 1.0)], ok_state)
    overshoot = ModeResult("dflash-tree", [Answer("q", "So 4.", [5, 6, 7, 8, 9], 0.5)], ok_state)
    print_summary([reference, overshoot])
    assert "reference" in capsys.readouterr().out
    assert exit_code([reference, overshoot]) == 0

    differs = ModeResult("dflash-chain", [Answer("q", "So 5.", [5, 6, 9], 0.5)], ok_state)
    print_summary([reference, overshoot, differs])
    table = capsys.readouterr().out
    assert " yes " in table and " NO " in table
    assert exit_code([reference, overshoot, differs]) == 1
    assert "dflash-chain: an answer differs" in capsys.readouterr().err

    failed = ModeResult("eagle3-tree", overshoot.answers, {"registrations": {"x": "failed: boom"}, "failed": ["x"]})
    assert exit_code([reference, failed]) == 1
    assert exit_code([reference, ModeResult("eagle3-tree", overshoot.answers, {})]) == 1
    assert exit_code([reference, ModeResult("eagle3-tree", [], ok_state)]) == 1  # a missing answer is a difference


def test_cpu_parallel_ranks_bind_one_core_group_each(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    assert server.cpu_threads_bind(2, [0, 1]) == "0|1"
    assert server.cpu_threads_bind(3, list(range(8))) == "0-2|3-5|6-7"
    assert server.cpu_threads_bind(2, [0, 2, 4, 6]) == "0,2|4,6"
    with pytest.raises(server.LaunchError, match="--dp 2 --tp 2 on CPU start 4 ranks, which need at least one core"):
        server.cpu_threads_bind(4, [0, 1], flags="--dp 2 --tp 2")
    # every scheduler process is a rank: data, tensor and pipeline parallel sizes multiply, in any spelling
    assert server.parallel_ranks(["--tp", "2"]) == (2, "--tp 2")
    assert server.parallel_ranks(["--dp-size=2", "--tensor-parallel-size", "3"]) == (
        6,
        "--tensor-parallel-size 3 --dp-size 2",
    )
    assert server.parallel_ranks(["--pp-size", "2", "--data-parallel-size", "2"]) == (
        4,
        "--data-parallel-size 2 --pp-size 2",
    )
    assert server.parallel_ranks([]) == (1, "")
    # attention data parallelism splits the TP ranks: no process of its own
    assert server.parallel_ranks(["--tp", "2", "--dp-size", "2", "--enable-dp-attention"]) == (2, "--tp 2")
    assert server.parallel_ranks(["--tp", "2", "--attn-dp-size", "2"]) == (2, "--tp 2")
    for bad in (["--tp", "two"], ["--dp-size", "0"]):
        with pytest.raises(server.LaunchError, match="is not a positive number"):
            server.parallel_ranks(bad)
    for flags in (["--tp", "2"], ["--dp-size", "2"]):
        spec = server.launch_command(["--model-path", str(tmp_path), *flags], cpu=True, port=server.free_port())
        if len(os.sched_getaffinity(0)) >= 2:
            assert spec.env["SGLANG_CPU_OMP_THREADS_BIND"].count("|") == 1
    single = server.launch_command(["--model-path", str(tmp_path)], cpu=True, port=server.free_port())
    assert "SGLANG_CPU_OMP_THREADS_BIND" not in single.env or "SGLANG_CPU_OMP_THREADS_BIND" in os.environ


def test_nodes_on_one_machine_bind_distinct_core_groups(tmp_path):
    """``--nnodes 2``: each node starts half the ranks and SGLang reads a rank's group at its index on its node, so
    the two nodes of one machine (a loopback --dist-init-addr) get the two halves of its cores, not both the first."""
    (tmp_path / "config.json").write_text("{}")
    one_host = server.Nodes(2, 1, one_host=True)
    assert server.cpu_threads_bind(2, [0, 1], nodes=server.Nodes(2, 0, one_host=True)) == "0"
    assert server.cpu_threads_bind(2, [0, 1], nodes=one_host) == "1"
    assert server.cpu_threads_bind(4, list(range(8)), nodes=one_host) == "4-5|6-7"
    assert server.cpu_threads_bind(4, list(range(8)), nodes=server.Nodes(2, 1)) == "0-3|4-7"  # a machine per node
    with pytest.raises(server.LaunchError, match="start 4 ranks on the 2 nodes of this machine"):
        server.cpu_threads_bind(4, [0, 1], nodes=one_host)

    assert server.node_layout([]) == server.Nodes()
    at = ["--dist-init-addr", "127.0.0.1:5757"]
    assert server.node_layout(["--nnodes", "2", "--node-rank", "1", *at], 2) == one_host
    assert server.node_layout(["--nnodes", "2", "--nccl-init-addr", "[::1]:5757"], 2) == server.Nodes(2, 0, True)
    assert server.node_layout(["--nnodes", "2", "--dist-init-addr", "10.0.0.1:5757"], 2) == server.Nodes(2, 0)
    for flags, message in [
        (["--nnodes", "2", "--node-rank", "2", *at], "--node-rank 2 is not one of 0..1"),
        (["--nnodes", "0", *at], "--nnodes 0 is not a positive number"),
        (["--nnodes", "2"], "--nnodes 2 needs --dist-init-addr HOST:PORT"),
        (["--nnodes", "2", "--tp", "3", *at], "the 3 ranks (dp x tp x pp) evenly over the nodes"),
    ]:
        with pytest.raises(server.LaunchError, match=re.escape(message)):
            server.launch_command(["--model-path", str(tmp_path), *flags], cpu=True, port=server.free_port())

    node = ["--model-path", str(tmp_path), "--tp", "2", "--nnodes", "2", *at]
    first = server.launch_command([*node, "--node-rank", "0"], cpu=True, port=server.free_port())
    with socket.socket() as taken:  # node 1 binds its --port too (SGLang's health-only server there)
        taken.bind(("127.0.0.1", first.port))
        with pytest.raises(server.LaunchError, match=f"port {first.port} on 127.0.0.1 is already in use"):
            server.launch_command([*node, "--node-rank", "1", "--port", str(first.port)], cpu=True)
    second = server.launch_command([*node, "--node-rank", "1"], cpu=True, port=server.free_port())
    assert second.nodes == one_host and first.nodes.rank == 0 and second.port != first.port
    if len(os.sched_getaffinity(0)) >= 2:
        bind = [spec.env["SGLANG_CPU_OMP_THREADS_BIND"] for spec in (first, second)]
        assert "|" not in bind[0] + bind[1] and bind[0] != bind[1], bind


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--tp", "3"], "--tp 3 does not divide --moe-intermediate 2048"),
        (["--ep", "5"], "--ep 5 does not divide --experts 384"),
        (["--topk", "400"], "--topk 400 is more than the 384 experts on one rank"),
        (["--batches", "4", "0"], "--batches 0: give 1 or more"),
        (["--draft-tokens", "-8"], "--draft-tokens -8: give 1 or more"),
        (["--iters", "0"], "--iters 0: give 1 or more"),
        (["--warmup", "-1"], "--warmup -1: give 0 or more"),
        (["--dtype", "int4_w4a16", "--group-size", "48"], "--hidden 7168 is not a multiple of --group-size 48"),
    ],
)
def test_tune_moe_refuses_flags_that_describe_no_moe_layer(capsys, flags, message):
    # checked before the GPU is looked for, so the same error on a machine with or without one
    assert cli.main(["tune", "moe", *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("sglang-kimi: error: ") and message in err[0], err


def test_cpu_launch_runs_sglang_s_compiled_helpers_eagerly(tmp_path, monkeypatch):
    """On CPU SGLang's torch.compile'd helpers run eagerly (TORCHDYNAMO_DISABLE=1), unless the user's environment
    sets the variable or --enable-torch-compile asks for compilation (served on intel_amx); a GPU launch keeps
    torch.compile."""
    monkeypatch.delenv(server.DYNAMO_DISABLE_ENV, raising=False)
    (tmp_path / "config.json").write_text("{}")
    model = ["--model-path", str(tmp_path)]
    assert server.launch_command(model, cpu=True, port=server.ANY_PORT).env[server.DYNAMO_DISABLE_ENV] == "1"
    amx = ["--enable-torch-compile", "--attention-backend", "intel_amx"]
    assert server.DYNAMO_DISABLE_ENV not in server.launch_command([*model, *amx], cpu=True, port=server.ANY_PORT).env
    assert server.DYNAMO_DISABLE_ENV not in server.launch_command(model, cpu=False, port=server.ANY_PORT).env
    monkeypatch.setenv(server.DYNAMO_DISABLE_ENV, "0")
    assert server.launch_command(model, cpu=True, port=server.ANY_PORT).env[server.DYNAMO_DISABLE_ENV] == "0"


@pytest.mark.parametrize(
    "flags, drafter",
    [
        (["--speculative-algorithm", "DFLASH", "--speculative-dflash-tree-budget", "16"], server.TINY_DFLASH),
        (["--speculative-algorithm=eagle3", "--speculative-num-steps", "3"], server.TINY_EAGLE3),
    ],
)
def test_serving_the_embedded_model_with_a_speculative_algorithm_takes_its_embedded_drafter(flags, drafter, tmp_path):
    """`sglang-kimi serve --speculative-algorithm DFLASH` with no model: the embedded model and the drafter trained
    for it (SGLang otherwise refuses the launch for want of a drafter). A drafter given, a config file's included,
    or a model of the user's, and nothing is added."""

    def draft_paths(args):
        argv = server.launch_command(args, cpu=True, port=server.ANY_PORT).argv
        return [argv[i + 1] for i, a in enumerate(argv) if a == "--speculative-draft-model-path"]

    assert draft_paths(flags) == [str(drafter)]
    other = tmp_path / "drafter"
    assert draft_paths([*flags, "--speculative-draft-model-path", str(other)]) == [str(other)]
    (tmp_path / "serve.yaml").write_text(f"speculative-draft-model-path: {other}\n")
    assert draft_paths([*flags, "--config", str(tmp_path / "serve.yaml")]) == []  # the file's, as SGLang merges it
    model = tmp_path / "ckpt"
    model.mkdir()
    (model / "config.json").write_text("{}")
    assert draft_paths(["--model-path", str(model), *flags]) == []  # the launch names the missing drafter
    assert draft_paths(["--speculative-algorithm", "NGRAM"]) == []  # NGRAM drafts from the prompt
