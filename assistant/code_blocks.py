"""The Python code in a model's answer: its fenced blocks, and whether they parse.

Plain Python (no JAX, no HTTP), below both of its users: the chat retries an answer whose python block
does not parse (``tui.settings``, ``retry_block``), and the evaluation judges answers with the same
reading (``assistant.evals.instructions``' held-out measures, the RL format reward).
"""

from __future__ import annotations

import ast
import re

# A python, py or unlabelled fence and what follows it, up to its closing fence or the end of the text
# (an answer cut short leaves its last block open).
FENCE = re.compile(r"```[ \t]*(?:python|py)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)


def fenced_blocks(text: str) -> list[str]:
    """The contents of the answer's fenced code blocks (an unterminated last block counts)."""
    return [m.group(1) for m in FENCE.finditer(text)]


def parsed(code: str) -> ast.Module | None:
    """The code's syntax tree, or None where it does not parse. Model output can be anything: null bytes
    (ValueError) and absurd nesting (RecursionError, MemoryError inside the parser) are code that does not
    parse too, not an error of the caller."""
    try:
        return ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def unparsed_code(text: str) -> bool:
    """The chat's retry test (``ChatSettings.retry_for``): the answer opens a python (or unlabelled)
    fenced block and none of its closed ones parses. An answer without code, or whose code parses, is
    left alone; so is one whose block parses but defines nothing."""
    found = list(FENCE.finditer(text))
    return bool(found) and not any(m.group(0).endswith("```") and parsed(m.group(1)) for m in found)
