"""Arrows point down only (ARCHITECTURE.md): every `specdeploy.*` import in a package, lazy ones included,
read from the source with ast, against the rules written there."""

from __future__ import annotations

import ast
from pathlib import Path

import specdeploy

ROOT = Path(specdeploy.__file__).parent

# What each package must never import, from ARCHITECTURE.md's rules: the engine imports nothing above it, plan
# nothing from deploy (nor the lock resolver, which reaches the network), bench talks HTTP only.
FORBIDDEN = {
    "recipes": {"plan", "lock", "deploy", "engine", "server", "bench", "campaign", "report", "zoo"},
    "plan": {"lock", "deploy", "engine", "server", "bench", "campaign", "report", "zoo", "demo", "lab"},
    "engine": {
        "recipes",
        "plan",
        "lock",
        "deploy",
        "server",
        "bench",
        "campaign",
        "report",
        "zoo",
        "demo",
        "lab",
        "perf",
        "generate",
    },  # fmt: skip
    "server": {"deploy", "bench", "campaign", "report", "demo", "lab"},
    "bench": {"engine", "server", "deploy", "campaign", "plan", "demo", "lab", "perf"},
    "report": {"engine", "server", "deploy", "campaign", "plan", "zoo"},
    "zoo": {"server", "bench", "deploy", "campaign", "report", "plan", "demo", "lab"},
    "deploy": {"campaign", "bench", "report", "demo", "server"},
    "campaign": {"demo", "engine", "server"},
    # doctor's probe talks HTTP like bench or runs the engine in process; it never reaches into the server.
    "doctor": {"server", "deploy", "campaign", "plan", "demo", "lab", "report"},
}


def imported_packages(package: str) -> dict[str, set[str]]:
    """specdeploy subpackage/module names imported anywhere in `package`, each with the files that do it."""
    found: dict[str, set[str]] = {}
    for path in (ROOT / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = (
                    [node.module]
                    if node.module != "specdeploy"
                    else [f"specdeploy.{a.name}" for a in node.names]
                )
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            for name in names:
                parts = name.split(".")
                if parts[0] == "specdeploy" and len(parts) > 1 and parts[1] != package:
                    found.setdefault(parts[1], set()).add(str(path.relative_to(ROOT)))
    return found


def test_the_rules_name_real_packages() -> None:
    real = {p.name for p in ROOT.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    real |= {p.stem for p in ROOT.glob("*.py")}
    assert set(FORBIDDEN) <= real and set().union(*FORBIDDEN.values()) <= real


def test_no_package_imports_upward() -> None:
    upward = {
        f"{package} -> {target}": sorted(files)
        for package, forbidden in FORBIDDEN.items()
        for target, files in imported_packages(package).items()
        if target in forbidden
    }
    assert upward == {}


def test_the_checker_sees_lazy_imports() -> None:
    # a property of the checker itself: the deferred import in bench/compare.py (inside a function) is seen
    assert "zoo" in imported_packages("bench")


def cycles(graph: dict[str, set[str]]) -> list[str]:
    """Every import chain that leads from a node of `graph` back to it, as "a -> b -> a"."""
    found = []
    for start in graph:
        seen, stack = set(), [(start, [start])]
        while stack:
            node, path = stack.pop()
            for target in graph[node]:
                if target == start:
                    found.append(" -> ".join([*path, target]))
                elif target not in seen:
                    seen.add(target)
                    stack.append((target, [*path, target]))
    return found


def test_no_two_packages_import_each_other_through_any_chain() -> None:
    """Sibling packages too: report reads run directories through bench/runs.py and puts `project`'s model
    figure in its table, so projection may not import report."""
    packages = {p.name for p in ROOT.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    graph = {package: set(imported_packages(package)) & packages for package in packages}
    assert cycles(graph) == []


def test_the_package_cycle_checker_finds_a_cycle() -> None:
    # a property of the checker itself, on a graph made for it
    assert cycles({"report": {"projection"}, "projection": {"bench", "report"}, "bench": set()}) == [
        "report -> projection -> report",
        "projection -> report -> projection",
    ]


def module_imports() -> dict[str, set[str]]:
    """Every specdeploy module (dotted name) -> the specdeploy modules it imports, lazily or not."""
    modules = {
        ".".join(("specdeploy", *path.relative_to(ROOT).with_suffix("").parts)).removesuffix(
            ".__init__"
        ): path
        for path in ROOT.rglob("*.py")
    }
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                # `from package import module` names a module; `from module import name` names the module
                targets |= {f"{node.module}.{a.name}" for a in node.names} | {node.module}
            elif isinstance(node, ast.Import):
                targets |= {alias.name for alias in node.names}
        # a module's own packages are being imported already when it runs: those edges close no cycle
        graph[name] = {t for t in targets if t in modules and t != name and not name.startswith(f"{t}.")}
    return graph


def test_no_two_modules_import_each_other_through_any_chain() -> None:
    """No import cycle among the modules, lazy imports included."""
    assert cycles(module_imports()) == []


def test_the_cycle_checker_sees_lazy_imports() -> None:
    # a property of the checker itself: deploy/orphans.py imports deploy/deployment.py inside a function
    assert "specdeploy.deploy.deployment" in module_imports()["specdeploy.deploy.orphans"]
