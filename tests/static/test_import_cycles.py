"""No import cycle anywhere in ``volunteer`` or ``relay``, type-only (``TYPE_CHECKING``) imports
included.

The layering contract (import-linter, ``test_static_checks.py``) keeps imports from running up a
floor; within a floor, modules could still import each other in a circle, and a circle hidden
behind ``TYPE_CHECKING`` is still two modules that cannot be read, tested or moved apart. The
graph comes from grimp, import-linter's own graph library; the cycles are its strongly connected
components, each reported with one concrete loop and the import lines that close it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Set

import pytest

grimp = pytest.importorskip("grimp", reason="grimp comes with the test extra (pip install -e '.[test]')")

PACKAGES = ("volunteer", "relay")


def strongly_connected_components(edges: Mapping[str, Set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative (a deep import chain must not hit the recursion limit).
    Returns the components of more than one module, or of one that imports itself, sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            for successor in successors:
                if successor not in index:
                    index[successor] = low[successor] = len(index)
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(edges.get(successor, ())))))
                    break
                if successor in on_stack:
                    low[node] = min(low[node], index[successor])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1 or node in edges.get(node, ()):
                        found.append(sorted(component))
    return sorted(found)


def one_loop(edges: Mapping[str, Set[str]], component: list[str]) -> list[str]:
    """A shortest loop through the component's first module, staying inside the component."""
    start, members = component[0], set(component)
    came_from: dict[str, str] = {}
    todo = deque([start])
    while todo:
        node = todo.popleft()
        for successor in sorted(edges.get(node, ())):
            if successor == start:
                loop = [node]
                while loop[-1] != start:
                    loop.append(came_from[loop[-1]])
                return [start, *reversed(loop[:-1]), start] if len(loop) > 1 else [start, start]
            if successor in members and successor not in came_from:
                came_from[successor] = node
                todo.append(successor)
    raise AssertionError(f"{component} is not a cycle")


def describe_cycle(graph, edges: Mapping[str, Set[str]], component: list[str]) -> str:
    loop = one_loop(edges, component)
    lines = [f"{len(component)} modules: {', '.join(component)}", "  for instance:"]
    for importer, imported in zip(loop, loop[1:]):
        details = graph.get_import_details(importer=importer, imported=imported)
        where = "; ".join(f"line {d['line_number']}: {d['line_contents']}" for d in details) or "?"
        lines.append(f"    {importer} -> {imported}  ({where})")
    return "\n".join(lines)


def import_graph():
    # No cache: the check reads the tree as it is now and leaves nothing behind.
    return grimp.build_graph(*PACKAGES, exclude_type_checking_imports=False, cache_dir=None)


def test_no_import_cycle_type_only_imports_included():
    graph = import_graph()
    edges = {module: graph.find_modules_directly_imported_by(module) for module in graph.modules}
    cycles = strongly_connected_components(edges)
    report = "\n".join(describe_cycle(graph, edges, component) for component in cycles)
    assert not cycles, f"{len(cycles)} import cycle(s) in {' and '.join(PACKAGES)}:\n{report}"


def test_the_cycle_finder_finds_loops_and_only_loops():
    edges = {
        "a": {"b"}, "b": {"c"}, "c": {"a", "d"},  # a -> b -> c -> a
        "d": {"e"}, "e": set(),  # a chain: no cycle
        "f": {"f"},  # a module importing itself
        "g": {"h"}, "h": {"g"},
    }
    assert strongly_connected_components(edges) == [["a", "b", "c"], ["f"], ["g", "h"]]
    assert one_loop(edges, ["a", "b", "c"]) == ["a", "b", "c", "a"]
    assert one_loop(edges, ["f"]) == ["f", "f"]
    assert strongly_connected_components({"x": {"y"}, "y": set()}) == []
