"""The layout's rules: no import cycle among the package's modules (function-level imports included), the algorithms
(``speculators/``) import no SGLang and nothing of the plugin but the kernels they dispatch to, and the reference code
is not imported by serving."""

import ast
import collections
from pathlib import Path

from support.paths import REPO

ROOTS = {
    "sglang_kimi": REPO / "sglang_kimi",
    "sglang_kimi.speculators": REPO / "speculators",
    "sglang_kimi.kernels": REPO / "kernels",
    "sglang_kimi.evals": REPO / "evals",
}


def modules() -> dict[str, Path]:
    found = {}
    for package, folder in ROOTS.items():
        for path in folder.rglob("*.py"):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if "shims" in parts:
                continue  # import shims: top-level sgl_kernel / torchvision on a CPU server's path
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join([package, *parts])] = path
    return found


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Every module of ``known`` that ``name`` imports, at module level or inside functions."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - (node.level - 1)] if node.level else []
            module = ".".join(base + ([node.module] if node.module else [])) if node.level else (node.module or "")
            candidates = [module] + [f"{module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        else:
            continue
        out |= {c for c in candidates if c in known and c != name}
    return out


def graph() -> dict[str, set[str]]:
    found = modules()
    return {name: imports(name, path, set(found)) for name, path in found.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in edges:
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    assert cycles(graph()) == []


def test_the_cycle_check_finds_a_cycle():
    assert cycles(collections.defaultdict(set, {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}})) == [["a", "b", "c"]]


def test_speculators_import_no_sglang_and_only_the_kernels():
    edges = graph()
    for name, path in modules().items():
        if not name.startswith("sglang_kimi.speculators"):
            continue
        tree = ast.parse(path.read_text())
        roots = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        roots |= {
            n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module and not n.level
        }
        assert "sglang" not in roots, name
        outside = {m for m in edges[name] if not m.startswith(("sglang_kimi.speculators", "sglang_kimi.kernels"))}
        assert not outside, (name, outside)


def test_serving_does_not_import_the_reference_code():
    edges = graph()
    serving = [m for m in edges if not m.startswith(("sglang_kimi.speculators.reference", "sglang_kimi.evals"))]
    serving = [m for m in serving if m != "sglang_kimi.kernels.resource_report"]
    for name in serving:
        assert not any(m.startswith("sglang_kimi.speculators.reference") for m in edges[name]), name


# The package grouped by concern: a handful of plugin-level modules at the top, everything else in its area's folder.
PLUGIN_LEVEL = {
    "__init__", "plugin", "hooks", "settings", "parser_flags", "errors", "version", "server_info", "environment_check",
    "log",
}  # fmt: skip
AREAS = {"speculative", "models", "platform", "hardening", "launcher", "drafters", "cli"}
SERVING_AREAS = AREAS - {"launcher", "drafters", "cli"}  # each with its table of registrations (registrations.py)
DATA_FOLDERS = {"assets"}  # package data, and (__init__.py) the one place their paths are written


def test_only_the_plugin_level_modules_sit_at_the_top():
    top = REPO / "sglang_kimi"
    modules_at_top = {p.stem for p in top.glob("*.py")}
    assert modules_at_top == PLUGIN_LEVEL
    folders = {p.name for p in top.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders == AREAS | DATA_FOLDERS
    for area in AREAS:
        assert (top / area / "__init__.py").is_file(), area


def test_each_area_owns_its_table_entries_in_a_data_only_module():
    """``plugin.py`` concatenates the areas' tables; each ``registrations.py`` imports nothing but the entry type."""
    from sglang_kimi import plugin

    for area in SERVING_AREAS:
        path = REPO / "sglang_kimi" / area / "registrations.py"
        tree = ast.parse(path.read_text())
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        assert imported == {"sglang_kimi.hooks"}, (area, imported)
        assert not [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))], area
        assert plugin.AREAS[area], area
    for entry in plugin.REGISTRATIONS:
        module = entry.install.partition(":")[0]
        area = plugin.AREA_OF[entry.name]
        if (
            area != "plugin"
            and module.startswith("sglang_kimi.")
            and not module.startswith(("sglang_kimi.kernels.", "sglang_kimi.speculators."))
        ):
            assert module.startswith(f"sglang_kimi.{area}."), (entry.name, module)


def test_each_sglang_name_is_written_once_in_the_table():
    from sglang_kimi import plugin

    for entry in plugin.REGISTRATIONS:
        names = (entry.target, *entry.hooks, *entry.reads)
        assert len(names) == len(set(names)), entry.name
        assert len(entry.why) <= 2 * 120, entry.name  # one or two lines: the module docstring has the detail


def test_nothing_but_the_table_imports_the_hardening_group():
    """Turning the group off (SGLANG_KIMI_HARDENING=0) leaves nothing of it in use: only plugin.py reaches it."""
    for name, targets in graph().items():
        if name.startswith("sglang_kimi.hardening") or name == "sglang_kimi.plugin":
            continue
        assert not [t for t in targets if t.startswith("sglang_kimi.hardening")], name


def top_folder(name: str) -> str:
    """The folder a module belongs to: ``sglang_kimi.speculative.workers.x`` -> ``speculative``, a plugin-level module
    -> ``plugin``, the packages installed under ``sglang_kimi`` from the repository root -> their own name."""
    parts = name.split(".")
    if len(parts) == 1:
        return "plugin"
    if parts[1] in ("speculators", "kernels", "evals") or parts[1] in AREAS | DATA_FOLDERS:
        return parts[1]
    return "plugin"


def layering_violations(edges: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(importer, imported) pairs that break the folder-level layering: nothing outside ``cli/`` imports ``cli/``, which
    sits on top of every area (what an area shares with the command line lives in ``launcher/`` or at the plugin
    level)."""
    out = []
    for name, targets in edges.items():
        for target in targets:
            if top_folder(target) == "cli" and top_folder(name) != "cli":
                out.append((name, target))
    return sorted(out)


def test_no_area_imports_the_command_line():
    assert layering_violations(graph()) == []


def test_the_layering_check_finds_an_area_that_imports_the_command_line():
    edges = {
        "sglang_kimi.cli.main": {"sglang_kimi.launcher.server", "sglang_kimi.evals.parsers"},
        "sglang_kimi.hardening.gc_freeze": {"sglang_kimi.cli.main"},
        "sglang_kimi.evals.bench": {"sglang_kimi.cli.demo"},
        "sglang_kimi.settings": {"sglang_kimi.cli.doctor"},
    }
    assert layering_violations(edges) == [
        ("sglang_kimi.evals.bench", "sglang_kimi.cli.demo"),
        ("sglang_kimi.hardening.gc_freeze", "sglang_kimi.cli.main"),
        ("sglang_kimi.settings", "sglang_kimi.cli.doctor"),
    ]
