"""A program's text on its way to a terminal: what ``diffu eval``'s table may print of it.

Exception names (and any other text a program chose) reach the table's failure legend. Two things must
not happen to them there: rich reading them as markup (``[/]`` raised a MarkupError that ended the whole
evaluation, ``[bold red]`` restyled the table) and the terminal acting on them (an escape sequence, a
bidi override). ``shown`` writes control and format characters as Python escapes and escapes the markup;
the ``--json`` report keeps the raw text (JSON escapes it itself).
"""

from __future__ import annotations

from typing import Any


def printable(text: str) -> str:
    """``text`` with every control or format character (category Cc, Cf) written as its escape."""
    return "".join(
        c if c.isprintable() or c == " " else c.encode("unicode_escape", "backslashreplace").decode("ascii")
        for c in text
    )


def shown(text: str) -> str:
    """``printable``, with rich's markup escaped: safe for ``Console.print`` and a table cell."""
    from rich.markup import escape

    return escape(printable(text))


def for_terminal(reports: list[Any]) -> list[Any]:
    """Copies of evaluation reports (``Report``: ``summary``, ``results``) whose results' errors are
    ``shown``; the reports themselves are left as they are."""
    return [
        type(r)(r.summary, [dict(x, error=shown(x["error"])) if x.get("error") else x for x in r.results])
        for r in reports
    ]
