"""The rules of the house that a reader of the code can check: imports point down the floors, and no
file or function is too long to read.

The import graph is read from the source (every ``import`` statement anywhere in a file: at the top,
inside functions, under ``TYPE_CHECKING``, and ``importlib.import_module`` with a literal name), so a lazy
import cannot hide a circle. A file depends on the most specific module an import names: ``from a.b
import c`` on ``a.b.c`` when that is a module, else on ``a.b``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from functools import cache
from pathlib import Path

from tests.assistant.helpers import REPO

PACKAGES = ("assistant", "model_runtime", "lsp", "tui")

# Import circles that other branches of issue #33 remove, each as the files it joins. The lead deletes an
# entry when its branch lands: ``test_a_known_circle_is_still_there`` fails as soon as one is gone, so an
# entry never outlives its circle.
MAX_FILE_LINES = 450
MAX_FUNCTION_LINES = 80  # from the ``def`` line to the last line of its body, nested functions included

# Files and functions over the limits that other branches of issue #33 (or later work) split; the lead
# deletes an entry when its branch lands. An entry that is no longer over the limit fails the test, so
# none outlives its offender.
KNOWN_LONG: dict[str, str] = {}


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def modules() -> dict[str, Path]:
    """Every module of the four packages, by dotted name."""
    return {_module_name(p): p for pkg in PACKAGES for p in sorted((REPO / pkg).rglob("*.py"))}


def _named(tree: ast.AST) -> Iterator[str]:
    """Every module name an import in ``tree`` names (for ``from a import b``: ``a.b`` and ``a``)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0 and node.module, "the packages use absolute imports only"
            for alias in node.names:
                yield f"{node.module}.{alias.name}"
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            yield node.args[0].value


def _resolve(name: str) -> str | None:
    """The module of ours that ``name`` (a module, or a module's attribute) is, or None."""
    while name:
        if name in modules():
            return name
        name = name.rpartition(".")[0]
    return None


@cache
def graph() -> dict[str, frozenset[str]]:
    """Each module's imports among the four packages' modules (itself left out)."""
    edges = {}
    for name, path in modules().items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        targets = {_resolve(n) for n in _named(tree)}
        edges[name] = frozenset(t for t in targets if t is not None and t != name)
    return edges


def circles(edges: dict[str, frozenset[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module: every set of files that import each
    other round a circle (Tarjan's algorithm, iterative: the graph is a few hundred modules deep)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(frozenset(component))
    return found


def a_cycle(edges: dict[str, frozenset[str]], component: frozenset[str]) -> list[str]:
    """One concrete circle through ``component``'s first module, for a readable failure."""
    start = min(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt = []
        for node in frontier:
            for child in sorted(edges[node] & component):
                if child == start:
                    return [*paths[node], start]
                if child not in paths:
                    paths[child] = [*paths[node], child]
                    nxt.append(child)
        frontier = nxt
    raise AssertionError(f"{sorted(component)} is not a circle")


def describe(edges: dict[str, frozenset[str]], component: frozenset[str]) -> str:
    return f"{' -> '.join(a_cycle(edges, component))} (component: {', '.join(sorted(component))})"


def test_the_walker_sees_lazy_and_type_checking_imports_and_finds_every_circle() -> None:
    source = """
from typing import TYPE_CHECKING
import importlib
if TYPE_CHECKING:
    from pkg.b import Thing
def later():
    import pkg.c
    importlib.import_module("pkg.d")
"""
    assert set(_named(ast.parse(source))) >= {"pkg.b.Thing", "pkg.c", "pkg.d", "typing.TYPE_CHECKING"}
    edges = {
        "a": frozenset({"b"}),
        "b": frozenset({"c"}),
        "c": frozenset({"a", "d"}),
        "d": frozenset(),
        "e": frozenset({"f"}),
        "f": frozenset({"e"}),
    }
    assert sorted(map(sorted, circles(edges))) == [["a", "b", "c"], ["e", "f"]]
    assert a_cycle(edges, frozenset({"a", "b", "c"})) == ["a", "b", "c", "a"]
    # The real graph: a module of ours imported only inside a function is an edge all the same.
    assert "model_runtime.loader" in graph()["model_runtime"]


def test_no_import_circle_between_files() -> None:
    edges = graph()
    found = [describe(edges, c) for c in circles(edges)]
    assert not found, "import circles:\n" + "\n".join(found)


def test_only_the_command_line_imports_the_editor_and_chat_clients() -> None:
    """``tui`` and ``lsp`` are front ends: the ``diffu`` commands start them, nothing else imports them
    (and neither imports the other)."""
    wrong = []
    for name, targets in graph().items():
        own = name.split(".")[0]
        for target in sorted(targets):
            front_end = target.split(".")[0]
            in_cli = name == "assistant.cli" or name.startswith("assistant.cli.")
            if front_end in ("tui", "lsp") and front_end != own and not in_cli:
                wrong.append(f"{name} imports {target}")
    assert not wrong, "\n".join(wrong)


# What the front ends (``tui``, ``lsp``) may use of ``assistant/``: the client library's public import and
# the JAX-free modules below it. Not the server, the command line, the evaluation, nor the client
# library's own modules (``assistant.client`` is the one import both front ends use).
FRONT_END_IMPORTS = frozenset(
    {
        "assistant",  # the package itself, for __version__ (the editors' server info)
        "assistant.client",
        "assistant.wire",
        "assistant.config",
        "assistant.paths",
        "assistant.errors",
        "assistant.code_blocks",
    }
)
FRONT_END_PACKAGES = ("assistant.infill", "assistant.workspace")  # and every module in them


def front_end_may_import(target: str) -> bool:
    """Whether a module of ``tui`` or ``lsp`` may import ``target``, a module of the four packages."""
    if not (target == "assistant" or target.startswith("assistant.")):
        return True  # the rule is about assistant/ only; the other rules hold for the rest
    return target in FRONT_END_IMPORTS or any(
        target == package or target.startswith(package + ".") for package in FRONT_END_PACKAGES
    )


def test_the_front_ends_import_only_the_client_side_of_assistant() -> None:
    """The chat and the editors reach the daemon through ``assistant.client`` and share only pure,
    JAX-free pieces of ``assistant/`` (the wire types, config, paths, the infill text handling, the code
    blocks of an answer); what the evaluation and the chat both need lives below both."""
    refused = ("assistant.evals.instructions", "assistant.server.job", "assistant.cli", "assistant.sse")
    assert not any(map(front_end_may_import, refused))
    assert front_end_may_import("assistant.infill.context") and front_end_may_import("model_runtime.params")
    wrong = [
        f"{name} imports {target}"
        for name, targets in graph().items()
        if name.split(".")[0] in ("tui", "lsp")
        for target in sorted(targets)
        if not front_end_may_import(target)
    ]
    assert not wrong, "\n".join(wrong)


def long_parts() -> dict[str, int]:
    """Every file over MAX_FILE_LINES and function over MAX_FUNCTION_LINES in the four packages, as
    ``path`` or ``path:function`` (the innermost name), with its length in lines."""
    found = {}
    for path in modules().values():
        text = path.read_text(encoding="utf-8")
        where = path.relative_to(REPO).as_posix()
        if (lines := len(text.splitlines())) > MAX_FILE_LINES:
            found[where] = lines
        for node in ast.walk(ast.parse(text, where)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                assert node.end_lineno is not None
                if (lines := node.end_lineno - node.lineno + 1) > MAX_FUNCTION_LINES:
                    found[f"{where}:{node.name}"] = lines
    return found


def test_no_file_or_function_is_too_long() -> None:
    found = long_parts()
    new = {k: v for k, v in found.items() if k not in KNOWN_LONG}
    assert not new, f"over {MAX_FILE_LINES} lines a file or {MAX_FUNCTION_LINES} a function: {new}"
    gone = sorted(set(KNOWN_LONG) - set(found))
    assert not gone, f"no longer too long, take them out of KNOWN_LONG: {gone}"


def test_the_clients_import_no_server_code() -> None:
    """The client library and the front ends talk to the daemon over HTTP only: none of them imports the
    server (editors start ``diffu lsp`` on every file open; it must stay light and independent)."""

    def client(name: str) -> bool:
        return name.split(".")[0] in ("tui", "lsp") or (name + ".").startswith("assistant.client.")

    wrong = [
        f"{name} imports {target}"
        for name, targets in graph().items()
        if client(name)
        for target in sorted(targets)
        if target == "assistant.server" or target.startswith("assistant.server.")
    ]
    assert not wrong, "\n".join(wrong)
