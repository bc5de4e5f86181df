"""Sub-commands of the ``diffu`` CLI, one module each.

Each module exposes ``register(subparsers)``, which adds its parser and sets ``func`` to a callable
taking the parsed ``argparse.Namespace`` and returning the process exit code.
"""
