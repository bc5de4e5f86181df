"""The rules of the house that a reader of the code can check: no import circle, every import points down
the floors of ``LAYERS``, the clients load no JAX, and no file or function is too long to read.

The import graph is read from the source (every ``import`` statement anywhere in a file: at the top,
inside functions, under ``TYPE_CHECKING``, and ``importlib.import_module`` with a literal name), so a lazy
import cannot hide a circle or an upward import. A file depends on the most specific module an import
names: ``from a.b import c`` on ``a.b.c`` when that is a module, else on ``a.b``. The rules cover the four
packages and ``scripts/`` (the top floor: the scripts whose figures the docs publish).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from tests.assistant.helpers import REPO

PACKAGES = ("assistant", "model_runtime", "lsp", "tui", "scripts")

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


# -- the floors ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Layer:
    """One floor of the house (or one room of a floor): the modules it holds, by dotted prefix, and the
    layers right below it, which it stands on. A module belongs to the layer with its longest prefix."""

    name: str
    prefixes: tuple[str, ...]
    over: tuple[str, ...]
    jax_free: bool = False  # loads nothing of JAX, numpy or the HTTP server, however deep its imports go


# Top to bottom. A module may import its own layer's modules and those of every layer below it (the
# layers its layer stands on, theirs, and so on); nothing else. Rooms side by side on a floor (the chat,
# the editors, the evaluation, the server) do not import each other, so each names its footing:
# - the front ends and the evaluation reach the daemon through the client (HTTP), never the server;
# - the server stands on the wire and the model runtime, not on the client (the daemon writes what the
#   client reads: the wire types and assistant.discovery, both below the two);
# - training is the model runtime's and stands on it alone (it knows nothing of assistant/: the RL
#   rewards that run code in the sandbox are wired in by the command line);
# - the wire floor (``assistant`` itself: wire, config, paths, errors, discovery, sse, code blocks, the
#   token; a new module of assistant/ lands here unless it is in a sub-package) stands on the model
#   runtime, of which the JAX-free rule below lets it reach only the plain-Python declarations (options,
#   SamplingParams, model references); so do the client and the front ends above it.
# ``jax_free`` layers are the ones an editor or the chat loads: checked by test_the_clients_load_no_jax.
LAYERS: tuple[Layer, ...] = (
    Layer("scripts", ("scripts",), over=("cli",)),
    Layer("cli", ("assistant.cli", "assistant.__main__"), over=("tui", "lsp", "evals", "server", "train")),
    Layer("tui", ("tui",), over=("client", "infill"), jax_free=True),
    Layer("lsp", ("lsp",), over=("client", "infill"), jax_free=True),
    Layer("evals", ("assistant.evals",), over=("client", "infill")),
    Layer("server", ("assistant.server",), over=("wire", "model_runtime")),
    Layer("train", ("model_runtime.train",), over=("model_runtime",)),
    Layer("client", ("assistant.client",), over=("wire",), jax_free=True),
    Layer("infill", ("assistant.infill",), over=("wire",), jax_free=True),
    Layer("wire", ("assistant",), over=("model_runtime",), jax_free=True),
    Layer("model_runtime", ("model_runtime",), over=()),
)

# What a JAX-free layer must never load (rule 1: an editor starting ``diffu lsp`` is ready at once).
HEAVY = ("jax", "jaxlib", "flax", "optax", "orbax", "numpy", "starlette", "uvicorn")


def layer_of(module: str, layers: tuple[Layer, ...] = LAYERS) -> Layer:
    """The layer holding ``module``: the one with the longest prefix of it."""
    best: tuple[int, Layer] | None = None
    for layer in layers:
        for prefix in layer.prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and (
                best is None or len(prefix) > best[0]
            ):
                best = (len(prefix), layer)
    if best is None:
        raise AssertionError(f"{module} is in no layer of LAYERS")
    return best[1]


def below(layers: tuple[Layer, ...] = LAYERS) -> dict[str, frozenset[str]]:
    """Each layer's name and the names of the layers it may import: itself and everything under it."""
    by_name = {layer.name: layer for layer in layers}
    reach: dict[str, frozenset[str]] = {}
    for layer in reversed(layers):  # bottom up: a layer's footing is known before the layer
        reach[layer.name] = frozenset({layer.name}).union(*(reach[name] for name in layer.over))
    assert set(reach) == set(by_name), "two layers share a name"
    return reach


def upward(edges: dict[str, frozenset[str]], layers: tuple[Layer, ...] = LAYERS) -> list[str]:
    """Every import in ``edges`` that does not point down ``layers``, as ``a (layer) imports b (layer)``."""
    reach = below(layers)
    wrong = []
    for name, targets in sorted(edges.items()):
        home = layer_of(name, layers)
        for target in sorted(targets):
            there = layer_of(target, layers)
            if there.name not in reach[home.name]:
                wrong.append(f"{name} ({home.name}) imports {target} ({there.name})")
    return wrong


def test_the_layers_are_a_list_from_top_to_bottom() -> None:
    """Each layer stands only on layers listed after it (so the list is the order of the floors, and the
    layers have no circle), and every module of ours is in one."""
    names = [layer.name for layer in LAYERS]
    for i, layer in enumerate(LAYERS):
        assert set(layer.over) <= set(names[i + 1 :]), f"{layer.name} stands on a layer above it"
    assert {layer.name for layer in LAYERS if not layer.over} == {names[-1]}, "one bottom floor"
    assert sorted(names) == sorted(set(names))
    for module in modules():
        layer_of(module)


def test_every_import_points_down_the_layers() -> None:
    """Every import of every module (lazy and ``TYPE_CHECKING`` ones included) points to its own layer or
    one below it: the floors of LAYERS, as docs/architecture.md draws them."""
    wrong = upward(graph())
    assert not wrong, "imports that do not point down LAYERS:\n" + "\n".join(wrong)


def test_an_upward_import_anywhere_fails_the_layers() -> None:
    """The check itself: each upward import, added to the real graph, is reported, and nothing else."""
    edges = graph()
    refused = {
        "model_runtime.hlo": "assistant.cli.eval_table",  # the model runtime knows nothing of assistant/
        "model_runtime.config": "assistant.server.job",
        "model_runtime.params": "assistant.wire",
        "model_runtime.train.loop": "assistant.evals.rewards",  # training stands on the model runtime alone
        "assistant.server.scheduler": "assistant.cli.main",  # the server under the command line
        "assistant.server.bootstrap": "assistant.client.locate",  # ... and beside the client, not on it
        "assistant.client.core": "assistant.server.job",  # the client reaches the server over HTTP only
        "assistant.evals.runner": "assistant.server.scheduler",  # the evaluation too
        "tui.app": "assistant.server.protocol",  # the front ends too
        "lsp.server": "tui.app",  # rooms side by side
        "tui.backend": "assistant.evals.runner",
        "assistant.wire": "assistant.client.core",  # the wire floor under the client
        "assistant.infill.context": "lsp.fill",
        "assistant.cli.main": "scripts.decoder_table",  # scripts are the top floor
    }
    for source, target in refused.items():
        assert source in edges and target in modules(), (source, target)
        changed = {**edges, source: edges[source] | {target}}
        assert upward(changed) == [
            f"{source} ({layer_of(source).name}) imports {target} ({layer_of(target).name})"
        ], (source, target)
    allowed = {
        "scripts.decoder_table": "model_runtime.params",
        "assistant.cli.main": "tui.app",
        "tui.app": "assistant.client.core",
        "lsp.server": "model_runtime.options",
        "assistant.server.scheduler": "assistant.discovery",
        "model_runtime.train.loop": "model_runtime.runtime",
    }
    for source, target in allowed.items():
        assert not upward({**edges, source: edges[source] | {target}}), (source, target)


def heavy_imports(module: str) -> frozenset[str]:
    """The HEAVY packages ``module``'s own source imports (anywhere in the file)."""
    tree = ast.parse(modules()[module].read_text(encoding="utf-8"))
    return frozenset(n.split(".")[0] for n in _named(tree)) & frozenset(HEAVY)


def heavy_paths(edges: dict[str, frozenset[str]], start: str) -> list[str]:
    """An import chain from ``start`` through modules of ours to a HEAVY package, for each such package
    (breadth first, so each chain is a shortest one)."""
    paths = {start: [start]}
    frontier, found = [start], {}
    while frontier:
        nxt = []
        for node in frontier:
            for package in sorted(heavy_imports(node)):
                found.setdefault(package, " -> ".join([*paths[node], package]))
            for child in sorted(edges[node]):
                if child not in paths:
                    paths[child] = [*paths[node], child]
                    nxt.append(child)
        frontier = nxt
    return [found[p] for p in sorted(found)]


def test_the_clients_load_no_jax() -> None:
    """A module of a ``jax_free`` layer (the chat, the editors, the client library, the infill text and
    the wire floor) reaches no JAX, numpy or server framework through any import of ours, lazy ones
    included: whatever an editor calls, it never pays for the model runtime."""
    edges = graph()
    wrong = [chain for name in sorted(edges) if layer_of(name).jax_free for chain in heavy_paths(edges, name)]
    assert not wrong, "a JAX-free layer reaches a heavy import:\n" + "\n".join(wrong)
    # The check itself: a lazy import of the runtime in the editors' settings would be found.
    changed = {**edges, "lsp.settings": edges["lsp.settings"] | {"model_runtime.runtime"}}
    assert any(
        c.startswith("lsp.settings -> model_runtime.runtime") for c in heavy_paths(changed, "lsp.settings")
    )


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
