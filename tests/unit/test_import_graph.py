"""No import circle in ``src/bastion``: the modules' imports form a DAG.

Read from the source with :mod:`ast` (nothing is imported), so a circle fails
here even when it cannot fail at run time: every import statement is an edge,
those under ``if TYPE_CHECKING:`` and those inside a function body included.
An import deferred into a function to keep start-up light (the CLI does) is
fine; one deferred to hide a circle is not.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import bastion

PACKAGE_ROOT = Path(bastion.__file__).parent


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE_ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(tree: ast.Module) -> Iterator[ast.Import | ast.ImportFrom]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node


def imported(path: Path, modules: set[str]) -> set[str]:
    """The ``bastion`` modules that ``path`` imports, anywhere in it."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in imports(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            # ``from pkg import sub`` imports the submodule when there is one.
            subs = [f"{base}.{alias.name}" for alias in node.names]
            targets = [sub if sub in modules else base for sub in subs]
        out.update(target for target in targets if target in modules and target != name)
    return out


def import_graph() -> dict[str, set[str]]:
    paths = sorted(PACKAGE_ROOT.rglob("*.py"))
    modules = {module_name(path) for path in paths}
    return {module_name(path): imported(path, modules) for path in paths}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle as ``[a, b, ..., a]``, or ``None`` (iterative DFS, white/grey/black)."""
    state: dict[str, int] = {}
    for root in sorted(graph):
        if state.get(root):
            continue
        stack: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(graph[root])))]
        path = [root]
        state[root] = 1
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                state[node] = 2
                stack.pop()
                path.pop()
            elif state.get(child) == 1:
                return [*path[path.index(child) :], child]
            elif not state.get(child):
                state[child] = 1
                path.append(child)
                stack.append((child, iter(sorted(graph[child]))))
    return None


def test_the_module_level_imports_of_bastion_have_no_circle() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


def test_the_graph_sees_the_edges_it_must() -> None:
    graph = import_graph()
    assert len(graph) > 100
    assert "bastion.crypto.key_set" in graph["bastion.crypto.keys"]
    assert "bastion.workers.membership" in graph["bastion.workers.takeover"]
    # Under ``if TYPE_CHECKING:``, inside a function body, and a package's ``__init__``.
    assert "bastion.gateway" in graph["bastion.gateway_metrics"]
    assert "bastion.workers.takeover" in graph["bastion.replica.peers"]
    assert "bastion" in graph["bastion.upstream.http_exchange"]


def test_find_cycle_reports_a_circle_and_accepts_a_dag() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_the_shipped_package_carries_no_test_support() -> None:
    """Fault-injecting stores, the crash gateway and cluster helpers live in ``tests/support``."""
    assert not (PACKAGE_ROOT / "testing").exists()
    for path in sorted(PACKAGE_ROOT.rglob("*.py")):
        for node in imports(ast.parse(path.read_text(encoding="utf-8"))):
            is_import = isinstance(node, ast.Import)
            names = [alias.name for alias in node.names] if is_import else [node.module or ""]
            assert not any(name == "tests" or name.startswith("tests.") for name in names), path
