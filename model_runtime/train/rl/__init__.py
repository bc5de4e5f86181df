"""Coupled-GRPO (DiffuCoder's cpGRPO): reinforcement learning with unit-test rewards.

A port of apple/ml-diffucoder's ``DiffuGRPOTrainer`` (``src/open_r1/coupled_grpo.py``, a subclass of
TRL's ``GRPOTrainer``); ``docs/training.md`` lists where it deliberately differs.

- ``tasks``: the AceCode task format (question, test asserts), its validation and the chat prompt.
- ``synthetic``: a generator of small programming tasks in that format (no download).
- ``coupled``: the pure pieces: mask draws, the coupled three-pass log-probabilities, leave-one-out
  advantages and the clipped loss with the k3 KL term.
- ``rollout``: completions from the reference decoder, the completion mask.
- ``config``: ``RLConfig`` (what changes the weights), ``Reward``, ``RLOptions`` (how the loop runs).
- ``trainer``: the loop (rollouts, rewards, ``num_iterations`` reuse, reference sync, checkpoints).

``tasks``, ``synthetic`` and ``config`` import no JAX (``diffu eval`` reads task files with them); the
others do. Reward functions are plain callables passed in by the caller: the sandboxed ones live in
``assistant/evals/rewards.py``, since this package must not import ``assistant``.
"""
