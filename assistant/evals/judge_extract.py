"""From a test's source, the calls it makes and what it asserts about each: the judge's cases.

A HumanEval test is a module defining ``check(candidate)``, a run of asserts over calls of ``candidate``
(some in loops, some after assignments of their own). ``rewrite`` turns each assert of a known shape into a
call of ``__case__``, which the reference run (``judge_reference.py``) defines: it evaluates the call's
arguments and the assert's expected side there, calls the reference solution, and records the input, the
comparison and the reference's output. What does not mention ``candidate`` stays as it is (imports,
assignments, loops over constants, ``print``). Known shapes, with ``C`` a call of ``candidate`` whose
arguments do not mention it and ``E`` an expression that does not:

- ``C == E`` (either side; also ``tuple(C) == E`` and the other ``WRAPPERS``): ``eq``; ``C``: ``truthy``;
  ``not C``: ``falsy``; ``C is True/False/None``: ``is``;
- ``abs(C - E) < tol`` (or ``math.fabs``, ``E - C``, ``<=``) with a constant ``tol``: ``close``.

Anything else that mentions ``candidate`` (an assignment from a call, a property of the output such as
``poly(coeffs, candidate(...))``) makes the whole test ``Unsupported``, and that task keeps the in-process
harness (``judge.py``). An AceCode test case (``assert f(1) == 2``) becomes a ``check`` of the function it
calls (``check_of_asserts``).
"""

from __future__ import annotations

import ast
import builtins
from dataclasses import dataclass

from assistant.evals import sandbox_values

CANDIDATE = "candidate"
CASE = "__case__"
# Builtins an assert may call around the candidate: never the function under test.
BUILTINS = frozenset(dir(builtins))
WRAPPERS = tuple(sandbox_values.WRAPPERS)  # tuple(C) == E and the like


class Unsupported(ValueError):
    """The test has a statement the judge cannot turn into cases; the message says which line."""


@dataclass(frozen=True)
class Shape:
    """One assert's comparison: ``op``, the candidate call, the expected side and a tolerance."""

    op: str
    call: ast.Call
    expected: ast.expr | None = None
    tol: float | None = None
    strict: bool = True
    wrap: str | None = None


def _mentions(node: ast.AST | None, name: str) -> bool:
    return node is not None and any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(node))


def _call_of(node: ast.expr, name: str) -> ast.Call | None:
    """``node`` when it is ``name(...)`` with arguments that do not mention ``name``."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == name:
        if not any(_mentions(a, name) for a in [*node.args, *(k.value for k in node.keywords)]):
            return node
    return None


def _wrapped_call_of(node: ast.expr, name: str) -> tuple[ast.Call, str | None] | None:
    """``(call, None)`` for a call of ``name``, ``(call, "tuple")`` for ``tuple(call)`` (a wrapper)."""
    if (call := _call_of(node, name)) is not None:
        return call, None
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in WRAPPERS
        and len(node.args) == 1
        and not node.keywords
        and (call := _call_of(node.args[0], name)) is not None
    ):
        return call, node.func.id
    return None


def _abs_of_difference(node: ast.expr) -> tuple[ast.expr, ast.expr] | None:
    """``(x, y)`` of ``abs(x - y)`` or ``math.fabs(x - y)``."""
    if not isinstance(node, ast.Call) or len(node.args) != 1 or node.keywords:
        return None
    f = node.func
    named = (isinstance(f, ast.Name) and f.id == "abs") or (
        isinstance(f, ast.Attribute) and f.attr == "fabs" and isinstance(f.value, ast.Name)
    )
    diff = node.args[0]
    if named and isinstance(diff, ast.BinOp) and isinstance(diff.op, ast.Sub):
        return diff.left, diff.right
    return None


def shape(test: ast.expr, name: str = CANDIDATE) -> Shape | None:
    """The known shape of an assert's test over calls of ``name``, or None."""
    if (call := _call_of(test, name)) is not None:
        return Shape("truthy", call)
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        call = _call_of(test.operand, name)
        return Shape("falsy", call) if call is not None else None
    if not isinstance(test, ast.Compare) or len(test.ops) != 1:
        return None
    op, left, right = test.ops[0], test.left, test.comparators[0]
    if isinstance(op, ast.Eq):
        for c, e in ((left, right), (right, left)):
            if (wrapped := _wrapped_call_of(c, name)) is not None and not _mentions(e, name):
                return Shape("eq", wrapped[0], e, wrap=wrapped[1])
    if isinstance(op, ast.Is) and isinstance(right, ast.Constant) and right.value in (True, False, None):
        if (call := _call_of(left, name)) is not None:
            return Shape("is", call, right)
    if isinstance(op, ast.Lt | ast.LtE) and (pair := _abs_of_difference(left)) is not None:
        try:
            tol = float(ast.literal_eval(right))
        except (ValueError, TypeError, SyntaxError):
            return None
        for c, e in (pair, pair[::-1]):
            if (call := _call_of(c, name)) is not None and not _mentions(e, name):
                return Shape("close", call, e, tol, isinstance(op, ast.Lt))
    return None


def _case(node: ast.Assert, found: Shape, name: str) -> ast.stmt:
    """``__case__(name, op, lambda: (args, kwargs), lambda: expected, tol, strict, wrap, line)``."""
    call = found.call
    args = ast.Tuple(elts=list(call.args), ctx=ast.Load())
    kwargs = ast.Dict(
        keys=[ast.Constant(k.arg) if k.arg is not None else None for k in call.keywords],
        values=[k.value for k in call.keywords],
    )
    thunk = ast.arguments(posonlyargs=[], args=[], kwonlyargs=[], kw_defaults=[], defaults=[])
    expected = found.expected if found.expected is not None else ast.Constant(None)
    stmt = ast.Expr(
        ast.Call(
            func=ast.Name(CASE, ast.Load()),
            args=[
                ast.Name(name, ast.Load()),
                ast.Constant(found.op),
                ast.Lambda(thunk, ast.Tuple([args, kwargs], ast.Load())),
                ast.Lambda(thunk, expected),
                ast.Constant(found.tol),
                ast.Constant(found.strict),
                ast.Constant(found.wrap),
                ast.Constant(node.lineno),
            ],
            keywords=[],
        )
    )
    return ast.copy_location(stmt, node)


def _body(stmts: list[ast.stmt], name: str) -> list[ast.stmt]:
    out = []
    for node in stmts:
        if not _mentions(node, name):
            out.append(node)
        elif isinstance(node, ast.Assert):
            found = shape(node.test, name)
            if found is None:
                raise Unsupported(f"line {node.lineno}: an assert of another shape: {ast.unparse(node)[:80]}")
            out.append(_case(node, found, name))
        elif isinstance(node, ast.For | ast.While | ast.If):
            head = node.test if isinstance(node, ast.While | ast.If) else ast.Tuple([node.target, node.iter])
            if _mentions(head, name):
                raise Unsupported(f"line {node.lineno}: {name} in a loop's or a test's head")
            node.body = _body(node.body, name)
            node.orelse = _body(node.orelse, name)
            out.append(node)
        else:
            raise Unsupported(f"line {node.lineno}: {name} outside an assert: {ast.unparse(node)[:80]}")
    return out


def rewrite(test: str) -> str:
    """The test module with ``check``'s asserts as recorded cases; ``Unsupported`` says why not."""
    try:
        tree = ast.parse(test)
    except SyntaxError as exc:
        raise Unsupported(f"the test does not parse ({exc.msg})") from None
    checks = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "check"]
    if len(checks) != 1:
        raise Unsupported("no single check function")
    check = checks[0]
    params = check.args
    if len(params.args) != 1 or params.posonlyargs or params.kwonlyargs or params.vararg or params.kwarg:
        raise Unsupported("check takes other arguments than the candidate")
    name = params.args[0].arg
    if any(_mentions(n, name) for n in tree.body if n is not check):
        raise Unsupported(f"{name} is used outside check")
    check.body = _body(check.body, name)
    if not any(_mentions(n, CASE) for n in check.body):
        raise Unsupported("check asserts nothing about the candidate")
    return ast.unparse(ast.fix_missing_locations(tree))


def called_function(test: str) -> str | None:
    """The one function an AceCode test case's asserts call in a known shape (``f`` of ``assert f(1) ==
    2``), or None: not a builtin, not defined in the test itself."""
    try:
        tree = ast.parse(test)
    except SyntaxError:
        return None
    defined = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    defined |= {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.ClassDef)}
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assert):
            calls = [
                n for n in ast.walk(node.test) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
            ]
            for c in calls:
                fname = c.func.id  # type: ignore[attr-defined]
                if fname not in BUILTINS and fname not in defined and shape(node.test, fname) is not None:
                    names.add(fname)
    return names.pop() if len(names) == 1 else None


def check_of_asserts(tests: list[str], function: str) -> str:
    """A ``check(candidate)`` module whose body is ``tests`` (AceCode test cases), with ``function``
    read as the candidate."""

    class Rename(ast.NodeTransformer):
        def visit_Name(self, node: ast.Name) -> ast.Name:
            return ast.copy_location(ast.Name(CANDIDATE, node.ctx), node) if node.id == function else node

    body: list[ast.stmt] = []
    for test in tests:
        body += Rename().visit(ast.parse(test)).body
    module = ast.parse(f"def check({CANDIDATE}):\n    pass\n")
    check = module.body[0]
    assert isinstance(check, ast.FunctionDef)
    check.body = body or check.body
    return ast.unparse(ast.fix_missing_locations(module))
