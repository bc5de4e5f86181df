"""diffu's assistant layer: the resident daemon, its client library, configuration and the CLI.

Nothing here imports JAX at module import time; only the commands that run the model in-process
(``diffu generate`` without ``--daemon``, ``diffu serve``) import ``model_runtime`` lazily.
"""
