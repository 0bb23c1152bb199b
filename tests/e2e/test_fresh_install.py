"""The wheel in a fresh environment, installed the way the images install it.

A new virtual environment sees the CPU SGLang stack of the repo's venv (every package of it but sglang-kimi, through
a path file: it plays the SGLang image), then docker/install.sh (the script both Dockerfiles run) installs the wheel
and runs `sglang-kimi doctor --strict`. That
environment's own `sglang-kimi serve` then serves the embedded tiny model, from a working directory outside the
checkout; the plugin must come from the environment's site-packages. SGLANG_KIMI_WHEEL names a prebuilt wheel (or
the folder holding it), as the release workflow does; without it the wheel is built from this checkout.
"""

import os
import re
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import pytest
import requests
from support.paths import DOCKER
from support.processes import children
from support.wheel import build_wheel

from sglang_kimi.launcher.checks import free_port
from sglang_kimi.launcher.server import LaunchSpec, ServerProcess, fetch_plugin_state, group_alive

pytestmark = pytest.mark.e2e

INSTALL_SH = DOCKER / "install.sh"
WHEEL_ENV = "SGLANG_KIMI_WHEEL"
HOST = "127.0.0.1"
PROMPT = (
    "Question: Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May?\nAnswer:"
)


def run(argv, **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run([str(a) for a in argv], capture_output=True, text=True, **kwargs)
    command = " ".join(map(str, argv))
    output = f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    assert result.returncode == 0, f"{command} exited {result.returncode}:\n{output}"
    return result


def fresh_env(venv: Path) -> dict[str, str]:
    """The environment of a process of the fresh venv: nothing that could point back to the checkout."""
    dropped = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    env["PATH"] = os.pathsep.join([str(venv / "bin"), env.get("PATH", "")])
    env["VIRTUAL_ENV"] = str(venv)
    return env


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    given = os.environ.get(WHEEL_ENV)
    if given:
        path = Path(given).resolve()
        assert path.exists(), f"{WHEEL_ENV}={given} does not exist"
        return path
    return build_wheel(tmp_path_factory.mktemp("wheel"))


# Entries of the repo venv's site-packages that belong to sglang-kimi itself (its editable install), never shown to
# the fresh environment.
PLUGIN_ENTRIES = re.compile(r"^(__editable__[._]sglang_kimi|sglang_kimi)", re.IGNORECASE)


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    """A new venv that sees the repo venv's CPU SGLang stack without sglang-kimi: the SGLang image, in seconds.

    Every entry of the repo venv's site-packages but the plugin's is linked into one folder, which a path file puts on
    the new venv's ``sys.path`` after its own site-packages (so the wheel installed there wins)."""
    venv = tmp_path_factory.mktemp("fresh") / "venv"
    run([sys.executable, "-m", "venv", venv], timeout=300)
    image = venv.parent / "image-site-packages"
    image.mkdir()
    repo_site = Path(sysconfig.get_path("purelib"))
    for entry in repo_site.iterdir():
        if not PLUGIN_ENTRIES.match(entry.name) and not entry.name.endswith(".pth"):
            (image / entry.name).symlink_to(entry)
    probe = "import sysconfig; print(sysconfig.get_path('purelib'))"
    fresh_site = Path(run([venv / "bin" / "python", "-c", probe], env=fresh_env(venv)).stdout.strip())
    (fresh_site / "zz-sglang-image.pth").write_text(f"{image}\n")
    check = "import importlib.util as u, sglang; print(sglang.__file__, u.find_spec('sglang_kimi'))"
    out = run([venv / "bin" / "python", "-c", check], env=fresh_env(venv), cwd=tempfile.gettempdir()).stdout
    assert out.split()[0].startswith(str(image)) and out.split()[1] == "None", out  # SGLang there, the plugin not
    return venv


@pytest.fixture(scope="module")
def site_packages(venv) -> Path:
    probe = "import sysconfig; print(sysconfig.get_path('purelib'))"
    out = run([venv / "bin" / "python", "-c", probe], env=fresh_env(venv))
    return Path(out.stdout.strip())


@pytest.fixture(scope="module")
def install_output(venv, wheel) -> str:
    """docker/install.sh WHEEL in the fresh venv, from a neutral working directory: its whole output."""
    env = fresh_env(venv) | {"PYTHON": str(venv / "bin" / "python")}
    result = subprocess.run(
        ["bash", str(INSTALL_SH), str(wheel)],
        cwd=tempfile.gettempdir(),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, f"docker/install.sh exited {result.returncode}:\n{result.stdout}"
    return result.stdout


def test_install_script_installs_the_wheel_and_passes_the_strict_doctor(install_output, site_packages, capsys):
    with capsys.disabled():  # shown in CI logs also when the test passes
        print("\n---- docker/install.sh ----\n" + install_output + "---- end of docker/install.sh ----")
    assert f"imported from {site_packages}/sglang_kimi/__init__.py" in install_output
    audit = re.search(
        r"strict audit against sglang \S+: (\d+) SGLang names, (\d+) hook signatures, (\d+) serving modules: "
        r"0 problem\(s\)",
        install_output,
    )
    assert audit, "no clean strict audit in the output"
    names, signatures, modules = map(int, audit.groups())
    assert names >= 25 and signatures >= 15 and modules >= 20, "the audit checked too little"
    assert "no problems found" in install_output
    assert install_output.rstrip().endswith("passes the strict doctor")


def pid_alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_fresh_environment_serves_the_tiny_model_with_the_plugin(install_output, venv, site_packages, tmp_path):
    port = free_port(HOST)
    spec = LaunchSpec(
        argv=[str(venv / "bin" / "sglang-kimi"), "serve", "--port", str(port)],
        env=fresh_env(venv),
        host=HOST,
        port=port,
        cpu=True,
    )
    server = ServerProcess(spec, log_path=tmp_path / "serve.log")  # its own process group
    launcher_group = None
    try:
        server.wait_ready(timeout=600)
        # `sglang-kimi serve` runs SGLang in a process group of its own: remember it to check that it ends too.
        (launcher_group,) = children(server.proc.pid)
        url = server.base_url

        assert requests.get(url + "/health", timeout=30).status_code == 200
        body = {"text": PROMPT, "sampling_params": {"max_new_tokens": 16, "temperature": 0.0}}
        out = requests.post(url + "/generate", json=body, timeout=300).json()
        assert out["text"] and out["meta_info"]["completion_tokens"] > 0

        state = fetch_plugin_state(url)
        assert state["registrations"], "the scheduler reports no registration of the plugin"
        assert state["failed"] == [], state

        # The plugin and its data come from the fresh venv: the model the plugin chose is its packaged tiny model,
        # and nothing on the scheduler's path points into the checkout.
        info = requests.get(url + "/server_info", timeout=30).json()
        assert Path(info["model_path"]).is_relative_to(site_packages / "sglang_kimi" / "assets"), info["model_path"]
        scheduler = state["pid"]
        # SGLang's main process (the scheduler gets its environment and sys.path; the scheduler's own /proc environ
        # is overwritten by its process title)
        environ = dict(
            item.split("=", 1)
            for item in Path(f"/proc/{launcher_group}/environ").read_text().split("\0")
            if "=" in item
        )
        for entry in filter(None, environ.get("PYTHONPATH", "").split(os.pathsep)):
            assert Path(entry).is_relative_to(site_packages), f"SGLang's PYTHONPATH entry outside the venv: {entry}"
        # it runs where it was started (the checkout, here) without that directory on its path
        assert Path(os.readlink(f"/proc/{scheduler}/cwd")) == Path.cwd() and environ.get("PYTHONSAFEPATH") == "1"
    finally:
        server.stop()
        if launcher_group is not None and group_alive(launcher_group):
            os.killpg(launcher_group, 9)
            pytest.fail(f"`sglang-kimi serve` left SGLang's group {launcher_group} running:\n{server.log_tail()}")

    assert server.proc.returncode is not None
    assert not group_alive(server.pgid)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and pid_alive(scheduler):
        time.sleep(0.2)
    assert not pid_alive(scheduler), "the SGLang scheduler outlived the stop"
