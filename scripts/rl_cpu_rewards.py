"""Rewards for the CPU demonstration run of coupled-GRPO (``scripts/rl_cpu_run.sh``), by import path:

    PYTHONPATH=. diffu train --rl coupled-grpo ... --reward scripts.rl_cpu_rewards:code=2.0 \\
        --reward scripts.rl_cpu_rewards:code_format=0.5

They are the published code and format rewards (``assistant.evals.rewards``) with one change: an answer that
ends right at its closing fence counts as if a newline followed it. The published format rule wants the
decoded completion to end with the fence *and a newline*; DiffuCoder-Instruct's answers give it one, but
the bundled model was instruction-tuned on answers that end at the fence, followed by ``<|im_end|>`` and
padding (special tokens, dropped when decoding), so under the published rule every answer of it scores 0
and RL from it has no signal at all. Nothing else changes: one python block, parsed, each assert run in the
sandbox.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from assistant.evals import rewards

_sandboxed: rewards.CodeReward | None = None


def _closed(completion: Any) -> str:
    text = rewards.content(completion)
    return text + "\n" if text.endswith("```") else text


def code_format(completions: Sequence[Any], **_: Any) -> list[float]:
    return rewards.code_format([_closed(c) for c in completions])


def code(completions: Sequence[Any], test_cases: Sequence[Sequence[str]], **_: Any) -> list[float]:
    global _sandboxed
    if _sandboxed is None:
        _sandboxed = rewards.CodeReward()
    return _sandboxed([_closed(c) for c in completions], test_cases=test_cases)
