"""Starting real SGLang servers for the end-to-end tests.

- :func:`launch`: one server, started now and waited for, its log in the test's temporary folder.
- :class:`ServerPool`: the session's servers, one per configuration (:class:`ServerConfig`). Each e2e module lists
  the configurations it serves in its ``SERVERS``, in the order its tests use them; the session's plan is those
  lists in the order the selected modules run. A start-up (40-60 s here, mostly imports on one core) costs about as
  much as the tests run on it, so the pool starts the next ones before their first use, one at a time, while earlier
  tests run (the first ones while the unit tests do). A server is stopped by the fixture that used it, or,
  for one that several modules share, once the last module that lists it is done; idle servers sleep
  (``--sleep-on-idle``).
- :func:`cpu_args`: the launcher's CPU defaults (``CPU_DEFAULTS``) of the flags a test names, as arguments.
"""

from __future__ import annotations

import dataclasses
import threading
import time

from sglang_kimi.launcher.server import ANY_PORT, CPU_DEFAULTS, ServerProcess, group_alive, launch_command

START_TIMEOUT = 600.0
AHEAD = 2  # servers started before a test asks for them: each holds 1-3 GB while it waits
# The launcher's CPU defaults that SGLang's argument resolution acts on, for the tests that resolve arguments
# without starting a server (the KV pool, warm-up and idle flags matter only to a server; the attention backend is
# each case's own)
RESOLVE_CPU_FLAGS = (
    "--device", "--sampling-backend", "--cuda-graph-backend-decode", "--cuda-graph-backend-prefill", "--dtype",
    "--language-model-only",
)  # fmt: skip


def cpu_args(flags=RESOLVE_CPU_FLAGS) -> list[str]:
    """The launcher's CPU defaults (``CPU_DEFAULTS``) of ``flags`` as command-line arguments, in its order: each
    flag, then its value where it takes one."""
    unknown = set(flags) - set(CPU_DEFAULTS)
    assert not unknown, f"not among the launcher's CPU defaults: {sorted(unknown)}"
    args = []
    for flag, value in CPU_DEFAULTS.items():
        if flag in flags:
            args += [flag] if value is None else [flag, value]
    return args


def launch(tmp_path_factory, name: str, args: list[str] | None = None, env: dict[str, str] | None = None):
    """``sglang-kimi serve``'s launch of SGLang with ``args`` (plus ``env``), ready to serve; stopped on failure."""
    server = _start(tmp_path_factory.mktemp(name), list(args or []), env or {})
    return _ready(server)


def launch_nodes(folder, args: list[str], nodes: int = 2) -> list[ServerProcess]:
    """SGLang's multi-node launch on this machine: ``nodes`` processes of ``sglang-kimi serve``'s launch with
    ``args``, ``--nnodes`` and each its ``--node-rank``, meeting at a free loopback ``--dist-init-addr``, each with
    its own port (node 0 serves; the others answer ``/health`` once every node is up). All ready, node 0 first;
    all stopped if one fails."""
    from sglang_kimi.launcher.checks import free_port

    meet = ["--nnodes", str(nodes), "--dist-init-addr", f"127.0.0.1:{free_port()}"]
    started = []
    try:
        for rank in range(nodes):
            (node := folder / f"node{rank}").mkdir()
            started.append(_start(node, [*args, *meet, "--node-rank", str(rank)], {}))
        for server in started:  # node 0 answers once the others have joined it
            server.wait_ready(START_TIMEOUT)
    except BaseException:
        for server in started:
            server.stop()
        raise
    return started


def _start(folder, args: list[str], env: dict[str, str]) -> ServerProcess:
    spec = launch_command(args, port=ANY_PORT)
    spec.env.update(env)
    return ServerProcess(spec, folder / "server.log")


def _ready(server: ServerProcess) -> ServerProcess:
    try:
        server.wait_ready(START_TIMEOUT)
    except BaseException:
        server.stop()
        raise
    return server


@dataclasses.dataclass(frozen=True)
class ServerConfig:
    """A server the e2e tests start: ``sglang-kimi serve``'s launch with ``args`` and ``env``. ``files`` are written
    into the server's own folder before it starts, and ``{dir}`` in an argument or a variable's value is that
    folder."""

    name: str
    args: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    files: tuple[tuple[str, str], ...] = ()


def server_config(name: str, args: list[str], env: dict[str, str] | None = None, files: dict[str, str] | None = None):
    return ServerConfig(name, tuple(args), tuple(sorted((env or {}).items())), tuple(sorted((files or {}).items())))


def session_plan(items) -> tuple[list[ServerConfig], dict[ServerConfig, set[str]]]:
    """The selected items' modules' ``SERVERS``, in the order the modules run, each configuration once; and for each
    configuration the modules that list it."""
    plan: list[ServerConfig] = []
    users: dict[ServerConfig, set[str]] = {}
    seen_modules: set[str] = set()
    for item in items:
        module = getattr(item, "module", None)
        if module is None or module.__name__ in seen_modules:
            continue
        seen_modules.add(module.__name__)
        for config in getattr(module, "SERVERS", ()):
            if config not in users:
                plan.append(config)
                users[config] = set()
            users[config].add(module.__name__)
    return plan, users


class ServerPool:
    """The session's servers, started ahead of use in plan order (see the module's docstring): one at a time, by a
    background thread, while fewer than ``ahead`` started servers wait for their first use."""

    def __init__(self, tmp_path_factory, plan: list[ServerConfig] = (),
                 users: dict[ServerConfig, set[str]] | None = None, ahead: int = AHEAD):  # fmt: skip
        self._tmp_path_factory = tmp_path_factory
        self._plan: list[ServerConfig] = []
        self._listed: dict[ServerConfig, set[str]] = {}
        self._users: dict[ServerConfig, set[str]] = {}  # the modules still to finish
        self._ahead = ahead
        self._servers: dict[ServerConfig, ServerProcess] = {}
        self._asked: set[ServerConfig] = set()  # configurations a test asked for (started on time or ahead)
        self._done: set[ServerConfig] = set()  # stopped: a later request starts the configuration again
        self._changed = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._start_ahead, name="servers-ahead", daemon=True)
        self.add_plan(plan, users or {})

    def add_plan(self, plan: list[ServerConfig], users: dict[ServerConfig, set[str]]) -> None:
        """Plan more servers (:func:`session_plan` of tests that start running on this process: a lane of a
        ``pytest -n`` run), after those already planned; a configuration planned again that was stopped is started
        ahead again."""
        with self._changed:
            for config in plan:
                if config in self._done and config not in self._servers:  # stopped: planned again, in this order
                    self._plan = [c for c in self._plan if c != config]
                    self._done.discard(config)
                    self._asked.discard(config)
                if config not in self._plan:
                    self._plan.append(config)
            for config, modules in users.items():
                self._listed.setdefault(config, set()).update(modules)
                self._users.setdefault(config, set()).update(modules)
            self._changed.notify_all()
        if self._plan and not self._thread.is_alive():
            # pytest's base temporary folder, made here: two threads making it at once remove each other's folders
            self._tmp_path_factory.getbasetemp()
            self._thread.start()

    def get(self, config: ServerConfig, request) -> ServerProcess:
        """The configuration's server, ready to serve (started now when it was not started ahead), for the test or
        fixture ``request``, whose module must list the configuration in its ``SERVERS``."""
        module = request.module.__name__
        assert module in self._listed.get(config, ()), f"{module} uses the server {config.name}: list it in SERVERS"
        with self._changed:
            server = self._servers.get(config)
            if server is None:
                server = self._servers[config] = self._start(config)
            self._asked.add(config)
            self._changed.notify_all()
        try:
            return _ready(server)
        except BaseException:
            with self._changed:
                self._servers.pop(config, None)
            raise

    def stop(self, config: ServerConfig) -> None:
        """Stop the configuration's server; asserts it left no process behind."""
        with self._changed:
            server = self._servers.pop(config, None)
            self._done.add(config)
            self._changed.notify_all()
        if server is not None:
            server.stop()
            assert not group_alive(server.pgid), f"the server left processes behind: {server.log_path}"

    def module_done(self, module: str) -> None:
        """Stop the servers that no module still to run lists."""
        for config, modules in self._users.items():
            modules.discard(module)
            if not modules and config in self._servers:
                self.stop(config)

    def stop_all(self) -> None:
        with self._changed:
            self._closed = True
            servers, self._servers = list(self._servers.values()), {}
            self._changed.notify_all()
        for server in servers:
            server.stop()
        left = [server.log_path for server in servers if group_alive(server.pgid)]
        assert not left, f"servers left processes behind: {left}"

    def _next_ahead(self) -> ServerConfig | None:
        waiting = sum(1 for config in self._servers if config not in self._asked)
        if waiting >= self._ahead:
            return None
        fresh = (c for c in self._plan if c not in self._servers and c not in self._asked and c not in self._done)
        return next(fresh, None)

    def _start_ahead(self) -> None:
        while True:
            with self._changed:
                while not self._closed and (config := self._next_ahead()) is None:
                    self._changed.wait()
                if self._closed:
                    return
                server = self._servers[config] = self._start(config)
            _settle(server)  # one start-up at a time: the next waits for this one

    def _start(self, config: ServerConfig) -> ServerProcess:
        folder = self._tmp_path_factory.mktemp(config.name)
        for name, text in config.files:
            (folder / name).write_text(text)
        args = [a.replace("{dir}", str(folder)) for a in config.args]
        return _start(folder, args, {k: v.replace("{dir}", str(folder)) for k, v in config.env})


def _settle(server: ServerProcess) -> None:
    """Until the server answers ``/health``, or its process ends (its error is reported to the test that asks for
    it), or the start-up time limit passes."""
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline and server.proc.poll() is None and not server.answers_health():
        time.sleep(0.5)
