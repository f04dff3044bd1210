"""No import cycle among the project's modules: a cycle is dodged today by an import inside a
function and bites the day someone moves it. Read with ast, so nothing is imported. An import
counts wherever it sits (module level, function, method); importing `a.b.c` also runs the
`__init__` of `a` and `a.b`, so those count as imported too."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("eagle_synth", "producer", "workers")


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _type_checking_only(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules `name` imports anywhere (functions included; TYPE_CHECKING blocks not)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    pending: list[ast.AST] = [ast.parse(path.read_text())]
    while pending:
        node = pending.pop()
        if _type_checking_only(node):
            continue
        pending.extend(ast.iter_child_nodes(node))
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    [*package.split(".")[: len(package.split(".")) - node.level + 1], *filter(None, [base])]
                )
            # `from pkg import sub` imports the submodule when there is one, else pkg itself.
            targets.update(f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names)
    # Importing a submodule first runs each package above it.
    parents = {t.rsplit(".", depth)[0] for t in targets for depth in range(1, t.count(".") + 1)}
    return {t for t in targets | parents if t in modules and t != name and not name.startswith(f"{t}.")}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    cycles: list[list[str]] = []

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for target in sorted(graph[name]):
            if state.get(target) == 1:
                cycles.append([*path[path.index(target) :], target])
            elif target not in state:
                visit(target, [*path, target])
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    return cycles


def test_no_import_cycle():
    modules = _modules()
    cycles = _cycles({name: _imports(name, path, modules) for name, path in modules.items()})
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_a_cycle_through_a_function_or_a_package_is_found(tmp_path):
    """The two ways a cycle hides: an import inside a function, and a package's __init__ that
    imports a module which imports back."""
    sources = {
        "pkg.queue": "def send():\n    from pkg.sub.store import remember\n",
        "pkg.sub": "from pkg.sub import control\n",
        "pkg.sub.store": "X = 1\n",
        "pkg.sub.control": "from pkg.queue import send\n",
    }
    modules = {}
    for name, source in sources.items():
        path = tmp_path / f"{name.replace('.', '_')}.py"
        path.write_text(source)
        modules[name] = path
    modules["pkg.sub"] = tmp_path / "pkg_sub" / "__init__.py"
    modules["pkg.sub"].parent.mkdir()
    modules["pkg.sub"].write_text(sources["pkg.sub"])
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    assert graph["pkg.queue"] == {"pkg.sub.store", "pkg.sub"}
    assert ["pkg.queue", "pkg.sub", "pkg.sub.control", "pkg.queue"] in _cycles(graph)


def test_only_the_demo_imports_the_testing_harness():
    """eagle_synth/testing serves the demo, the tests and the benchmarks; the product never needs it."""
    modules = _modules()
    users = sorted(
        name
        for name, path in modules.items()
        if not name.startswith(("eagle_synth.testing", "eagle_synth.demo"))
        and any(t.startswith("eagle_synth.testing") for t in _imports(name, path, modules))
    )
    assert users == []
