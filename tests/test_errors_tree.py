"""eagle_synth/errors.py holds every error class of the product, and the tree its docstring draws
is the real class hierarchy: each class under its parent, its builtin bases in parentheses, and a
module that raises it. Read with ast where no import is needed."""

from __future__ import annotations

import ast
import builtins
import re
from pathlib import Path

import eagle_synth.errors as errors

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("eagle_synth", "producer", "workers")
# One drawn line: the tree's prefix, the class, its builtin bases, the module that raises it.
LINE = re.compile(
    r"^    (?P<prefix>(?:[│ ]   )*(?:[├└]── )?)(?P<name>\w+)(?: \((?P<mixins>[\w., ]+)\))?\s+(?P<path>\S+)$"
)


def _drawn() -> list[tuple[int, str, list[str], str]]:
    """(depth, class name, builtin bases, module path) of each line of the docstring's tree."""
    doc = errors.__doc__ or ""
    rows = []
    for line in doc.split("cannot drift:", 1)[1].strip("\n").splitlines():
        match = LINE.match(line)
        assert match, f"not a tree line: {line!r}"
        depth = len(match["prefix"]) // 4
        mixins = [m.strip() for m in match["mixins"].split(",")] if match["mixins"] else []
        rows.append((depth, match["name"], mixins, match["path"]))
    return rows


def _defined() -> dict[str, type]:
    return {
        name: value
        for name, value in vars(errors).items()
        if isinstance(value, type) and issubclass(value, BaseException) and value.__module__ == errors.__name__
    }


def test_the_drawn_tree_is_the_class_hierarchy():
    rows = _drawn()
    defined = _defined()
    assert sorted(name for _, name, _, _ in rows) == sorted(defined)
    parents: list[str] = []  # the drawn ancestors of the current line
    for depth, name, mixins, path in rows:
        del parents[depth:]
        cls = defined[name]
        ours = [base.__name__ for base in cls.__bases__ if base.__module__ == errors.__name__]
        others = [base.__name__ for base in cls.__bases__ if base.__module__ != errors.__name__]
        assert ours[:1] == parents[-1:], f"{name} is drawn under {parents[-1:]}, derives from {ours}"
        assert [m.rpartition(".")[2] for m in mixins] == others, f"{name}: drawn {mixins}, bases {others}"
        assert re.search(rf"\b{name}\b", (ROOT / path).read_text()), f"{path} does not raise or name {name}"
        parents.append(name)


def _exception_names() -> set[str]:
    ours = set(_defined())
    return ours | {
        name for name, value in vars(builtins).items() if isinstance(value, type) and issubclass(value, BaseException)
    }


def test_no_error_class_is_defined_outside_the_errors_module():
    known = _exception_names()
    outside = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if path == ROOT / "eagle_synth" / "errors.py":
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, ast.ClassDef):
                    continue
                bases = [ast.unparse(base).rpartition(".")[2] for base in node.bases]
                if any(base in known or base.endswith(("Error", "Exception")) for base in bases):
                    outside.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}")
    assert outside == []
