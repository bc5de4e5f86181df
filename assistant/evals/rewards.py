"""Reward functions for ``diffu train --rl coupled-grpo``: the published code and format rewards.

Restated from apple/ml-diffucoder ``src/open_r1/rewards.py`` (``get_code_format_reward``,
``code_reward``, ``extract_code``), with the tests run in diffu's sandbox (``assistant/evals/sandbox.py``)
instead of E2B:

- ``code_format``: the answer must be text, one fenced ```` ```python ```` block and nothing after its
  closing fence but a newline; then the block's code (stripped) must parse: 1.0, a SyntaxError 0.5, any
  other shape 0.0.
- ``code``: only for answers whose format scores 1.0 (others get 0.0). Each test case runs as its own
  program with a 5 s timeout; the reward is the fraction that pass. The published script runs the code
  followed by the assert and counts a clean exit, which a policy could learn to take (``sys.exit(0)``
  before the assert, a frame walk to the harness, an object equal to everything). Here each test case is
  judged outside the program (``assistant/evals/judge.py``): the block's code runs in the sandbox, its
  function is called on the assert's input there, and its output, sent back as data, is compared here
  with the expected one (the task's ``solution`` column's output where the task has one, else the
  assert's own expected value). A test case of another shape runs the code followed by the assert in the
  sandbox, passing when its code ran to its end (the fallback). A test that times out makes the whole
  reward 0.0, as in the published evaluation script, whose uncaught ``TimeoutExpired`` ends it before it
  prints a pass rate.

The recipe weights them 2.0 (code) and 0.5 (format). A reward function has TRL's signature,
``f(prompts=..., completions=..., **columns) -> list[float | None]`` with completions as chat messages
(``[{"role": "assistant", "content": text}]``), so open-r1 style functions plug in by import path
(``load_reward``).
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Sequence
from typing import Any

from assistant.code_blocks import parsed
from assistant.evals import judge
from assistant.evals.sandbox import Calls, Limits, Sandbox

RewardFn = Callable[..., list]
CODE_TIMEOUT = 5.0  # the published evaluate_code's exec_timeout
DEFAULT_REWARDS = (("code", 2.0), ("code_format", 0.5))  # recipes/config_coupled_code.yaml

# Anything without a fence, the ```python line, anything without a fence, the closing fence and a final
# newline, and nothing else (used with fullmatch).
_FORMAT = re.compile(r"^(?:(?!```)[\s\S])*?```python\n(?:(?!```)[\s\S])*?```\n$", re.DOTALL)
_BLOCK = re.compile(r"```python\n(.*?)```", re.DOTALL)


def content(completion: Any) -> str:
    """The text of a completion: a string, or chat messages (the last message's ``content``)."""
    if isinstance(completion, str):
        return completion
    return str(completion[-1]["content"])


def extract_code(text: str) -> str:
    """The first ```` ```python ```` block's code (unstripped), or ``""``."""
    match = _BLOCK.search(text)
    return match.group(1) if match else ""


def format_score(text: str) -> float:
    """1.0 for one well-formed python block that parses, 0.5 if it does not parse, else 0.0."""
    if not _FORMAT.fullmatch(text):
        return 0.0
    # A match always holds a block (the published findall cannot come back empty here). The published
    # code catches SyntaxError only; null bytes or absurd nesting would stop its run: here (``parsed``)
    # they are code that does not parse.
    return 1.0 if parsed(extract_code(text).strip()) is not None else 0.5


def code_format(completions: Sequence[Any], **_: Any) -> list[float]:
    """The published ``code_format_reward`` (python)."""
    return [format_score(content(c)) for c in completions]


class CodeReward:
    """The published ``code_reward``: the fraction of a task's asserts that pass, each in the sandbox.

    One ``Sandbox`` is kept for the object's life (its worker pool runs the programs of a whole batch of
    completions in parallel); ``close`` kills whatever still runs.
    """

    __name__ = "code"

    def __init__(self, timeout: float = CODE_TIMEOUT, workers: int | None = None) -> None:
        self.sandbox = Sandbox(Limits(timeout=timeout), workers=workers)

    def __call__(
        self, completions: Sequence[Any], test_cases: Sequence[Sequence[str]], **columns: Any
    ) -> list[float]:
        texts = [content(c) for c in completions]
        solutions = columns.get("solution") or [None] * len(texts)
        # One suite per test case (each is its own program, as published), cached across calls.
        suites = [
            [judge.assert_suite([case], s if isinstance(s, str) else None) for case in cases]
            for cases, s in zip(test_cases, solutions, strict=True)
        ]
        specs = judge.prepare([s for row in suites for s in row if isinstance(s, judge.Suite)])
        jobs: list[tuple[int, str, judge.Spec | None]] = []
        for i, text in enumerate(texts):
            if format_score(text) < 1.0:
                continue
            code = extract_code(text)
            for case, suite in zip(test_cases[i], suites[i], strict=True):
                found = specs[suite.key] if isinstance(suite, judge.Suite) else suite
                if isinstance(found, judge.Spec):
                    jobs.append((i, code, found))
                else:
                    jobs.append((i, f"{code}\n{case}", None))
        calls: list[Calls | None] = [spec.calls if spec is not None else None for _, _, spec in jobs]
        outcomes = list(self.sandbox.map([program for _, program, _ in jobs], calls=calls))
        passed = [0] * len(texts)
        timed_out = [False] * len(texts)
        for (i, _, spec), outcome in zip(jobs, outcomes, strict=True):
            status = judge.verdict(spec, outcome)[0] if spec is not None else outcome.status
            passed[i] += status == "passed"
            timed_out[i] |= status == "timeout"
        rewards = []
        for i, text in enumerate(texts):
            ran = format_score(text) == 1.0
            good = ran and not timed_out[i]
            rewards.append(passed[i] / len(test_cases[i]) if good else 0.0)
        return rewards

    def close(self) -> None:
        self.sandbox.close()


def load_reward(spec: str) -> RewardFn:
    """A reward callable named ``package.module:attribute`` (or ``package.module.attribute``)."""
    module_name, sep, attr = spec.partition(":")
    if not sep:
        module_name, _, attr = spec.rpartition(".")
    if not module_name or not attr:
        raise ValueError(f"reward {spec!r}: expected an import path such as mypkg.rewards:my_reward")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"reward {spec!r}: cannot import {module_name} ({exc})") from None
    fn = getattr(module, attr, None)
    if fn is None:
        raise ValueError(f"reward {spec!r}: {module_name} has no attribute {attr!r}")
    if not callable(fn):
        raise ValueError(f"reward {spec!r}: {module_name}.{attr} is not callable")
    return fn


def builtin(name: str) -> RewardFn:
    """``code`` (a new sandboxed ``CodeReward``) or ``code_format``."""
    if name == "code":
        return CodeReward()
    if name == "code_format":
        return code_format
    raise ValueError(f"unknown built-in reward {name!r} (built-in: code, code_format)")
