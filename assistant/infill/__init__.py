"""Infill text handling shared by the editors (``lsp``) and the evaluation (``assistant.evals``): the
cursor's context (what kind of suggestion, the window of text around it) and the post-processing of what
the model wrote. Plain Python, no JAX."""
