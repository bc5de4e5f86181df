"""Topic changes in a chat: multi-turn instruction data, held-out two-turn requests, and the leak measure.

The instruction data of ``instructions.py`` is one request and its answer per conversation, so a model
tuned on it alone never saw a second request follow an answer: asked for ``half(x)`` after
``reverse_string``, the bundled model wrote ``reverse_string`` again (issue #45). Here:

- ``topic_changes``: training conversations whose earlier turns are *other* training requests with their
  answers (from another file, with another name), then the request whose answer is learned. The loss is
  on the last answer only (``model_runtime.train.sft_data``): the earlier turns are prompt;
- ``two_turn``: held-out conversations of two held-out requests, the first with its reference answer, so
  every model is measured on the same prompts (not on its own first answers);
- ``leak``: for each second answer, which request's name its code defines: the second's (it answered),
  only the first's (the previous topic leaked into the answer), or neither.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence
from typing import Any

from assistant.code_blocks import fenced_blocks
from assistant.evals.runner import confidence_interval

DEFINED = re.compile(r"^[ \t]*(?:async[ \t]+)?(?:def|class)[ \t]+([A-Za-z_]\w*)", re.MULTILINE)
TRIES = 20  # candidates drawn for an earlier turn before a conversation is given up (too long)


def _unrelated(a: dict, b: dict) -> bool:
    """Two conversations that are not about the same thing: other files, other names, and neither name
    written in the other's request (so an answer defining one of them can be told apart)."""
    sa, sb = a["source"], b["source"]
    if sa["path"] == sb["path"] or sa["name"] == sb["name"]:
        return False
    return not (_mentions(b, sa["name"]) or _mentions(a, sb["name"]))


def _mentions(conversation: dict, name: str) -> bool:
    return re.search(rf"\b{re.escape(name)}\b", conversation["messages"][-2]["content"]) is not None


def joined(turns: Sequence[dict]) -> dict:
    """One conversation of several single-turn ones, in order: every turn's request and answer; the last
    answer is the one a training row learns. ``source`` lists each turn's provenance, last last."""
    messages: list[dict[str, str]] = []
    for turn in turns:
        messages += [dict(m) for m in turn["messages"]]
    return {"messages": messages, "source": {"turns": [t["source"] for t in turns]}}


def topic_changes(
    conversations: Sequence[dict],
    count: int,
    *,
    last: Callable[[dict], bool],
    fits: Callable[[dict], bool],
    three_turns: float = 0.25,
    seed: int = 0,
) -> list[dict]:
    """``count`` training conversations of two turns (three with probability ``three_turns``): a final
    request drawn among the ``conversations`` that ``last`` accepts, after earlier requests with their
    answers drawn among all of them, each unrelated to the others. ``fits`` (the whole conversation's
    token count) is checked as turns are added; a slot that finds no fitting candidate in ``TRIES`` draws
    leaves the conversation with the turns it has (at least two), or drops it."""
    rng = random.Random(seed)
    finals = [c for c in conversations if last(c)]
    out: list[dict] = []
    attempts = 0
    while len(out) < count and attempts < count * 4:
        attempts += 1
        turns = [rng.choice(finals)]
        wanted = 3 if rng.random() < three_turns else 2
        while len(turns) < wanted:
            for _ in range(TRIES):
                earlier = rng.choice(conversations)
                if all(_unrelated(earlier, t) for t in turns) and fits(joined([earlier, *turns])):
                    turns.insert(0, earlier)
                    break
            else:
                break
        if len(turns) >= 2:
            out.append(joined(turns))
    return out


def two_turn(requests: Sequence[dict], seed: int = 0) -> list[dict]:
    """Held-out two-turn conversations: each request second, after another one of ``requests`` with its
    reference answer. The first turns are the requests in a fixed shuffled order, each request's partner
    the next one in that order (going round) that is unrelated to it, so each is a first turn about once.
    ``source`` holds ``first`` and ``second``, the two requests' provenance."""
    order = list(range(len(requests)))
    random.Random(seed).shuffle(order)
    out = []
    for at, i in enumerate(order):
        second = requests[i]
        for step in range(1, len(order)):
            first = requests[order[(at + step) % len(order)]]
            if _unrelated(first, second):
                break
        else:
            raise ValueError(f"no request unrelated to {second['source']['name']!r} to put before it")
        conv = joined([first, second])
        conv["source"] = {"first": first["source"], "second": second["source"]}
        out.append(conv)
    return out


def defined_names(answer: str) -> set[str]:
    """The names the answer's first fenced block defines (``def``/``class`` at any depth, whether or not
    the code parses: a small model's code often does not); the whole answer when it has no fence."""
    blocks = fenced_blocks(answer)
    return set(DEFINED.findall(blocks[0] if blocks else answer))


def answered(conversation: dict, answer: str) -> str:
    """``"second"``: the answer defines the request's name; ``"first"``: only the previous request's (the
    leak); ``"neither"``."""
    names = defined_names(answer)
    source = conversation["source"]
    if source["second"]["name"] in names:
        return "second"
    return "first" if source["first"]["name"] in names else "neither"


def leak(conversations: Sequence[dict], answers: Sequence[str]) -> dict[str, Any]:
    """The shares of second answers defining the first request's name instead of the second's
    (``leak``), the second's (``answers_second``) and neither, each with its 95% interval (Wilson's), and
    the per-conversation verdicts (for paired comparisons)."""
    verdicts = [answered(c, a) for c, a in zip(conversations, answers, strict=True)]
    out: dict[str, Any] = {"conversations": len(verdicts), "verdicts": verdicts}
    for key, verdict in (("leak", "first"), ("answers_second", "second"), ("neither", "neither")):
        hits = [float(v == verdict) for v in verdicts]
        share = sum(hits) / max(len(hits), 1)
        out[key] = {"share": share, "count": int(sum(hits)), "ci95": list(confidence_interval(hits))}
    return out
