"""The resident daemon: HTTP routes over the scheduler (the one thread that owns the device), jobs,
batches, warm-up, request parsing, security, and a JAX-free fake runtime for tests and ``--model fake:``."""
