"""Training DiffuCoder-architecture models: ``diffu train``.

- ``objective``: the masked-diffusion loss (1/t-weighted, with Dream's one-position logit shift).
- ``corpus``: source files -> held-out split by file -> memory-mapped token shards.
- ``loop``: AdamW + warmup/cosine, EMA, orbax checkpoints with exact resume, data parallelism.
- ``checkpoints``: what the loops here share: checkpoints, the metrics log, resume, stopping on a signal.
- ``progress``: the rich progress bar of a run.
- ``evaluate``: held-out loss, masked-token accuracy, single-line infill exact match, with baselines.
- ``export``: the published checkpoint layout that ``model_runtime.load`` reads.
- ``run``: the whole pipeline in one resumable run directory; ``sft``: the same for instruction tuning.
- ``rl``: coupled-GRPO.

Importing this package imports JAX; the CLI imports it inside the command only.
"""
