"""Where lines and their indentation lie in a sequence of tokens, from a table per token id.

A byte-level BPE token can hold a newline and the next line's indentation (``"\\n    "``), a run of
spaces, or the start of a line's code after some spaces (``"    return"``). The early stop that ends an
editor's block suggestion where the code leaves the cursor's scope (``strategies.ScopeEnd``) reads a
line's indentation and whether it holds code token by token, on the device; this table is what it
needs of each token's text, built once per tokenizer. Plain numpy: a column per token id.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

_BLANK = " \t\r"  # what a line may hold and still be blank; tabs count one column, as the editors do

# The table's rows.
NEWLINES = 0  # newlines in the token
HEAD_CODE = 1  # code before its first newline (or in the whole token, without one)
LEAD = 2  # blank columns before that code
SPACES = 3  # the token's width when it is blank and holds no newline (indentation to add), else 0
TAIL_CODE = 4  # code after its last newline: the next line's code starts in this token
TAIL_LEAD = 5  # blank columns after its last newline, before that code (or to the token's end)
INNER_BLANK = 6  # a blank line lies wholly inside the token (between two of its newlines: "\n\n")
ROWS = 7


def _lead(text: str) -> int:
    return len(text) - len(text.lstrip(_BLANK))


def line_table(texts: Sequence[str], size: int | None = None) -> np.ndarray:
    """``[ROWS, V]`` int32: the rows above for each token's text; ``size`` pads it to a model's
    vocabulary (rows of an id past ``texts``: a token without text or newline)."""
    table = np.zeros((ROWS, max(size or 0, len(texts))), np.int32)
    for i, text in enumerate(texts):
        parts = text.split("\n")
        head, tail = parts[0], parts[-1]
        table[NEWLINES, i] = len(parts) - 1
        table[HEAD_CODE, i] = bool(head.strip(_BLANK))
        table[LEAD, i] = _lead(head)
        if len(parts) == 1:
            table[SPACES, i] = 0 if head.strip(_BLANK) else len(head)
        else:
            table[TAIL_CODE, i] = bool(tail.strip(_BLANK))
            table[TAIL_LEAD, i] = _lead(tail)
            table[INNER_BLANK, i] = any(not line.strip(_BLANK) for line in parts[1:-1])
    return table
