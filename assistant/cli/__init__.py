"""The ``diffu`` command line: ``main`` dispatches to one module per sub-command.

Each command module exposes ``register(subparsers)``, which adds its parser and sets ``func`` to a
callable taking the parsed ``argparse.Namespace`` and returning the process exit code. This package is the
only code that imports ``tui`` and ``lsp`` (inside the ``chat`` and ``lsp`` commands).
"""
