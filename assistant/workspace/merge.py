"""A code block from an answer put into a Python file by its definitions (found with ``ast``).

The rules (docs/chat.md, "Applying an answer"):

- a function or class of the block replaces the top-level one of the same name, at its place (its
  decorators, and the comment lines right above it when the block brings its own);
- a function the file has only as a method (of one class) replaces that method, indented as it was;
- a class whose header (decorators, bases) is unchanged and whose body is only methods is merged method by
  method, so a block showing one method of a long class does not drop the others; new methods go at the
  end of the class;
- a top-level ``NAME = ...`` replaces the file's one assignment to ``NAME``;
- an import the file lacks goes after the file's last top-level import (after its docstring when it has
  none); one it has is left out;
- anything else the file does not already hold (the same statement, compared by its syntax tree) goes at
  the end, as do definitions the file does not have.

The file's line endings are kept; nothing outside the replaced spans changes.
"""

from __future__ import annotations

import ast
import textwrap
from dataclasses import dataclass, field

from assistant.errors import UsageError

Span = tuple[int, int]  # 0-based [start, end) line indices into a file's lines


class MergeError(UsageError):
    """The block or the file cannot be merged by definitions (it does not parse); says why in one line."""


@dataclass
class Merge:
    """The merged text and what was done, for the one line shown above the diff."""

    text: str
    replaced: list[str] = field(default_factory=list)
    added: list[str] = field(default_factory=list)
    imports: int = 0
    statements: int = 0

    def summary(self) -> str:
        parts = []
        if self.replaced:
            parts.append("replaces " + ", ".join(self.replaced))
        if self.imports:
            parts.append(f"adds {self.imports} import{'s' if self.imports != 1 else ''}")
        if self.added:
            parts.append("adds " + ", ".join(self.added))
        if self.statements:
            parts.append(f"adds {self.statements} statement{'s' if self.statements != 1 else ''} at the end")
        return "; ".join(parts) or "nothing the file does not already hold"


def parse(code: str, what: str) -> ast.Module:
    """``code``'s syntax tree, or a MergeError naming ``what`` and where it stops parsing."""
    try:
        return ast.parse(code)
    except SyntaxError as exc:
        raise MergeError(f"{what} does not parse (line {exc.lineno}: {exc.msg})") from None
    except (ValueError, RecursionError, MemoryError) as exc:
        raise MergeError(f"{what} does not parse ({type(exc).__name__})") from None


def _newline(text: str) -> str:
    return "\r\n" if "\r\n" in text else "\n"


class _Source:
    """A parsed text and its lines (ends kept), with each top-level statement's span."""

    def __init__(self, text: str, tree: ast.Module) -> None:
        self.text = text
        self.tree = tree
        self.lines = text.splitlines(keepends=True)

    def span(self, node: ast.stmt, *, comments: bool = False) -> Span:
        """The lines of ``node``: from its first decorator (and, with ``comments``, the comment lines
        right above it) to its last line."""
        decorators = getattr(node, "decorator_list", [])
        start = min([node.lineno, *(d.lineno for d in decorators)]) - 1
        end = node.end_lineno or node.lineno
        if comments:
            while start > 0 and self.lines[start - 1].lstrip().startswith("#"):
                start -= 1
        return start, end

    def has_comments_above(self, node: ast.stmt) -> bool:
        return self.span(node, comments=True)[0] < self.span(node)[0]

    def chunk(self, span: Span) -> str:
        return "".join(self.lines[span[0] : span[1]])


def _named(tree_body: list[ast.stmt]) -> dict[str, ast.stmt]:
    """Definitions by name (the last of a name wins, as it does when the module runs)."""
    out: dict[str, ast.stmt] = {}
    for node in tree_body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            out[node.name] = node
    return out


def _assigned(node: ast.stmt) -> str | None:
    """``NAME`` of a top-level ``NAME = ...`` or ``NAME: T = ...``."""
    if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
        return node.targets[0].id
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return node.target.id
    return None


def _indent(text: str, prefix: str, newline: str) -> str:
    lines = text.splitlines()
    return "".join((prefix + line if line.strip() else "") + newline for line in lines)


def _header(source: _Source, node: ast.ClassDef) -> str:
    """A class's decorators and ``class`` line(s), up to its first body statement (comment and blank
    lines left out: a comment above the first method is not part of the header)."""
    start = source.span(node)[0]
    lines = source.lines[start : node.body[0].lineno - 1]
    return "\n".join(line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#"))


class _Merger:
    """Collects the edits of one merge, then applies them bottom-up."""

    def __init__(self, original: _Source, block: _Source) -> None:
        self.file = original
        self.block = block
        self.newline = _newline(original.text)
        self.edits: dict[Span, str] = {}  # file span -> new text (empty span: insertion)
        self.imports: list[str] = []
        self.tail: list[str] = []
        self.result = Merge("")

    def unit(self, node: ast.stmt, *, prefix: str = "") -> str:
        """A block statement's text (comments above included), in the file's newline and indent."""
        text = self.block.chunk(self.block.span(node, comments=True))
        return _indent(text, prefix, self.newline)

    def replace(self, target: ast.stmt, node: ast.stmt, label: str, *, prefix: str = "") -> None:
        comments = self.block.has_comments_above(node)
        self.edits[self.file.span(target, comments=comments)] = self.unit(node, prefix=prefix)
        self.result.replaced.append(label)

    def run(self) -> Merge:
        top = _named(self.file.tree.body)
        methods = self._methods()
        imports = {ast.unparse(n) for n in self.file.tree.body if isinstance(n, ast.Import | ast.ImportFrom)}
        assigns: dict[str, list[ast.stmt]] = {}
        for n in self.file.tree.body:
            if (name := _assigned(n)) is not None:
                assigns.setdefault(name, []).append(n)
        present = {ast.dump(n) for n in self.file.tree.body}
        for node in self.block.tree.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                self._definition(node, top, methods)
            elif isinstance(node, ast.Import | ast.ImportFrom):
                if ast.unparse(node) not in imports:
                    imports.add(ast.unparse(node))
                    self.imports.append(self.unit(node))
                    self.result.imports += 1
            elif (name := _assigned(node)) is not None and len(assigns.get(name, [])) == 1:
                if ast.dump(node) != ast.dump(assigns[name][0]):
                    self.replace(assigns[name][0], node, name)
            elif ast.dump(node) not in present:
                self.tail.append(self.unit(node))
                self.result.statements += 1
        self.result.text = self._apply()
        return self.result

    def _methods(self) -> dict[str, list[tuple[ast.ClassDef, ast.stmt]]]:
        found: dict[str, list[tuple[ast.ClassDef, ast.stmt]]] = {}
        for cls in self.file.tree.body:
            if isinstance(cls, ast.ClassDef):
                for name, member in _named(cls.body).items():
                    if not isinstance(member, ast.ClassDef):
                        found.setdefault(name, []).append((cls, member))
        return found

    def _definition(
        self,
        node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef,
        top: dict[str, ast.stmt],
        methods: dict[str, list[tuple[ast.ClassDef, ast.stmt]]],
    ) -> None:
        target = top.get(node.name)
        if (
            isinstance(target, ast.ClassDef)
            and isinstance(node, ast.ClassDef)
            and self._by_method(target, node)
        ):
            return
        if target is not None:
            self.replace(target, node, node.name)
        elif not isinstance(node, ast.ClassDef) and len(methods.get(node.name, [])) == 1:
            cls, method = methods[node.name][0]
            prefix = self.file.lines[method.lineno - 1][: method.col_offset]
            self.replace(method, node, f"{cls.name}.{node.name}", prefix=prefix)
        else:
            self.tail.append(self.unit(node))
            self.result.added.append(node.name)

    def _by_method(self, target: ast.ClassDef, node: ast.ClassDef) -> bool:
        """Merge a class method by method when its header is the file's and it holds only methods (a
        docstring aside); False to replace it whole instead."""
        members = [m for m in node.body if not _is_docstring(m)]
        if _header(self.file, target) != _header(self.block, node) or not members:
            return False
        if not all(isinstance(m, ast.FunctionDef | ast.AsyncFunctionDef) for m in members):
            return False
        own = _named(target.body)
        last = target.body[-1]
        prefix = self.file.lines[last.lineno - 1][: last.col_offset]
        for member in members:
            assert isinstance(member, ast.FunctionDef | ast.AsyncFunctionDef)
            label = f"{node.name}.{member.name}"
            # The block's method is indented for its class in the block; re-indent it for the file's.
            text = _indent(textwrap.dedent(self.unit(member)), prefix, self.newline)
            if member.name in own:
                comments = self.block.has_comments_above(member)
                self.edits[self.file.span(own[member.name], comments=comments)] = text
                self.result.replaced.append(label)
            else:
                end = target.end_lineno or target.lineno
                self.edits[(end, end)] = self.edits.get((end, end), "") + self.newline + text
                self.result.added.append(label)
        return True

    def _apply(self) -> str:
        lines = list(self.file.lines)
        if lines and not lines[-1].endswith(("\n", "\r")):
            lines[-1] += self.newline  # new text may follow the last line
        if self.imports:
            at, fresh = self._import_line()
            joined = "".join(self.imports)
            if fresh:  # the file's first imports: a block of their own, set apart by blank lines
                joined = (self.newline if at > 0 else "") + joined + self.newline
            self.edits[(at, at)] = self.edits.get((at, at), "") + joined
        spans = sorted(self.edits, reverse=True)
        for i, (a, b) in enumerate(spans):
            for c, d in spans[i + 1 :]:
                if max(a, c) < min(b, d) or c < a < d:
                    raise MergeError("the code block changes the same lines of the file twice")
        for start, end in spans:
            lines[start:end] = [self.edits[(start, end)]]
        text = "".join(lines)
        for unit in self.tail:
            # Two blank lines between top-level statements at the end, as PEP 8 sets definitions apart.
            text = (text.rstrip("\r\n") + self.newline * 3 if text.strip() else "") + unit
        return text

    def _import_line(self) -> tuple[int, bool]:
        """Where new imports go, and whether they are the file's first: after its last top-level import,
        else after its docstring, else after its leading comments (a shebang, an encoding line)."""
        body = self.file.tree.body
        last = [n for n in body if isinstance(n, ast.Import | ast.ImportFrom)]
        if last:
            return last[-1].end_lineno or last[-1].lineno, False
        if body and _is_docstring(body[0]):
            return body[0].end_lineno or body[0].lineno, True
        at = 0
        while at < len(self.file.lines) and self.file.lines[at].startswith("#"):
            at += 1
        return at, True


def _is_docstring(node: ast.stmt) -> bool:
    return (
        isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
    )


def merge_code(original: str | None, block: str) -> Merge:
    """``block`` put into ``original`` by its definitions (None: a new file, which is the block)."""
    block_tree = parse(block, "the code block")
    newline = _newline(original) if original is not None else "\n"
    if original is None or not original.strip():
        text = _indent(block, "", newline)
        return Merge(text, added=list(_named(block_tree.body)))
    merger = _Merger(_Source(original, parse(original, "the file")), _Source(block, block_tree))
    return merger.run()


def forced(original: str | None, block: str) -> Merge:
    """``/apply --force``: the block as it is, at the end of the file (the file when there is none),
    for a block (or file) that does not parse and so has no definitions to place."""
    newline = _newline(original) if original is not None else "\n"
    unit = _indent(block, "", newline)
    if original is None or not original.strip():
        return Merge(unit, statements=1)
    return Merge(original.rstrip("\r\n") + newline * 2 + unit, statements=1)
