"""The error every layer of the assistant raises for a user's mistake: one line, exit code 2, no traceback.

It lives apart from the CLI so that configuration, paths, discovery and the clients (``tui/``, ``lsp/``)
can raise it without importing the command-line dispatcher.
"""

from __future__ import annotations


class UsageError(Exception):
    """A user-facing error: ``diffu`` prints it as one ``diffu: error: ...`` line and exits with 2."""
