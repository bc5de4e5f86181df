"""The held-out requests of issue #18: how often a chat model answers with code that parses, and stops.

    python scripts/sft_heldout.py MODEL HELDOUT.jsonl [--json OUT] [--record] [sampling flags]

HELDOUT.jsonl is what ``scripts/sft_data.py`` writes: requests built from files the model never trained
on (the user turn of each line is sent; the assistant turn is only a reference). Every request is
answered in this process (batched, as ``diffu eval`` does it) with the settings given by the flags, by
default the model's own chat defaults (``generation_config.json``: its chat defaults under its chat
decoder, ``diffu_chat``, as the chat takes them; else the chat's built-in ones), and
scored by ``assistant/evals/instructions.py``:

- ``good_block``: the answer holds a closed fenced block that parses and defines a function (target >= 80%);
- ``repeats_line``: one line of the answer occurs more than 3 times (target < 10%);
- ``stops_after_block``: nothing but blank lines follows the answer's first closed block.

Answers are the chat's: where the settings hold a ``retry_block`` (the bundled model's
generation_config.json does), an answer whose python block does not parse is decoded once more as the
chat decodes it (``ChatSettings.retry_for``), and the second answer is scored. The scores of the first
decodes alone are printed beside them (``--retry-block 0`` measures the model alone).

``--held-out-of N`` reads HELDOUT as a training file instead and sends only the lines that ``diffu train
--sft --heldout-permille N`` kept out of training: validation requests for choosing between runs (seeds,
checkpoints) without looking at the 200 held-out ones. They hold more classes than the 200 and score
lower (the bundled model: 67.3% of the first 300 against 76.0%), but rank runs alike (docs/training.md).

Two-turn conversations (``heldout_two_turn.jsonl`` of ``scripts/sft_data.py``: each held-out request
after another one with its reference answer) are sent whole, and the second answers are also scored for
the topic-change leak (``assistant/evals/topic_change.py``): the share that define the first request's
name instead of the second's, and the share that define the second's, with 95% intervals.
``--before BEFORE.json`` (an earlier ``--json`` on the same file) adds the paired differences, request by
request, with their 95% intervals.

``--record`` measures a small grid of chat settings instead (``GRID``, under the flags given) and writes
the best one (highest ``good_block - repeats_line``) into the model's generation_config.json as its chat
defaults.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from decoder_table import paired  # scripts/ is on the path when run as a script: the paired interval
from rich.progress import Progress

from assistant.evals import instructions as ins
from assistant.evals import topic_change as tc
from assistant.evals.runner import Job, LocalGenerator
from model_runtime.tokenizer import chat_prompt
from tui.settings import ChatSettings

# The chat's built-in defaults (tui/settings.py) where the model names none.
CHAT_DEFAULTS = {"max_new_tokens": 256, "temperature": 0.4, "top_p": 0.95, "alg": "entropy"}
KNOBS = {
    "decoder": str,
    "temperature": float,
    "top_p": float,
    "alg": str,
    "steps": int,
    "max_new_tokens": int,
    "block_length": int,
    "window": int,
    "threshold": float,
    "retry_block": int,  # the chat's second decode of code that does not parse; 0: the model alone
}
# The grid --record tries: the fast decoder, greedy (sampling at 0.2 already broke the syntax of this
# model's answers), with blocks of 32 (the published default), 64 and 128 on canvases of 128 to 256 tokens.
# Block length decides most: within a block the model commits the end of its answer (<|im_end|>, then
# padding) as soon as it is confident of it, so a block that reaches past the answer's end lets it stop,
# while 32-token blocks one after another keep it writing (and repeating) until the canvas is full.
# The reference decoder's confidence order commits the predictable padding and the end of turn first and
# leaves a model this small an empty answer (measured in docs/training.md), so it is not tried.
GRID = (
    {"decoder": "fast", "temperature": 0.0, "max_new_tokens": 192, "steps": 192, "block_length": 32},
    {"decoder": "fast", "temperature": 0.0, "max_new_tokens": 192, "steps": 192, "block_length": 64},
    {"decoder": "fast", "temperature": 0.0, "max_new_tokens": 128, "steps": 128, "block_length": 128},
    {"decoder": "fast", "temperature": 0.0, "max_new_tokens": 256, "steps": 256, "block_length": 128},
)


def score(answers: list[str]) -> dict[str, Any]:
    n = max(len(answers), 1)
    stops = 0
    for text in answers:
        m = next((m for m in ins.FENCE.finditer(text) if m.group(0).endswith("```")), None)
        stops += m is not None and not text[m.end() :].strip()
    return {
        "requests": len(answers),
        "good_block": sum(map(ins.has_good_block, answers)) / n,
        "repeats_line": sum(map(ins.repeats_a_line, answers)) / n,
        "stops_after_block": stops / n,
        "mean_chars": sum(map(len, answers)) / n,
    }


def run(rt: Any, requests: list[dict], knobs: dict[str, Any], batch: int) -> dict[str, Any]:
    """Answer every request as the chat would with ``knobs`` (its settings), the second decode of an
    answer whose code does not parse included; the scores of the first decodes alone come along."""
    settings = ChatSettings.from_mapping(knobs)
    prompts = [chat_prompt(r["messages"][:-1]) for r in requests]
    started = time.perf_counter()
    answers = _answer(rt, prompts, settings, batch)
    first = list(answers)
    again = [i for i, text in enumerate(first) if settings.retry_for(text, "stop") is not None]
    retry = settings.retry_settings()
    if again and retry is not None:
        for i, text in zip(again, _answer(rt, [prompts[i] for i in again], retry, batch), strict=True):
            answers[i] = text
    result = score(answers) | {"seconds": round(time.perf_counter() - started, 1)}
    two_turn = all("second" in r.get("source", {}) for r in requests)
    if two_turn:  # each request after another one: which of the two the answer wrote
        result["topic_change"] = tc.leak(requests, answers)
        result["first_decode_topic_change"] = tc.leak(requests, first)
    result["decoded_again"] = len(again)
    result["first_decode"] = {k: v for k, v in score(first).items() if k != "requests"}
    params = settings.sampling_params()
    result["settings"] = {k: v for k, v in params.to_dict().items() if k != "seed"}
    result["settings"]["retry_block"] = settings.retry_block
    result["samples"] = [
        {"request": r["messages"][-2]["content"], "answer": a, "good_block": ins.has_good_block(a)}
        | ({"first_answer": f} if f != a else {})
        | {"first_good_block": ins.has_good_block(f)}
        for r, a, f in zip(requests, answers, first, strict=True)
    ]
    if two_turn:  # the verdicts go with their samples (bundled_metrics.py leaves samples out)
        for key, field in (("topic_change", "answered"), ("first_decode_topic_change", "first_answered")):
            for sample, verdict in zip(result["samples"], result[key].pop("verdicts"), strict=True):
                sample[field] = verdict
    return result


def _same_settings(earlier: list[dict[str, Any]], r: dict[str, Any]) -> dict[str, Any]:
    """The result of ``--before`` measured with the settings of ``r``."""
    found = next((b for b in earlier if b["settings"] == r["settings"]), None)
    if found is None:
        raise SystemExit(f"--before: no result with the settings {r['settings']}")
    return found


def report(r: dict[str, Any], before: dict[str, Any] | None) -> None:
    """Print one setting's scores; with ``before`` (an earlier run's result on the same requests), the
    paired differences, request by request, and their 95% intervals."""
    s = r["settings"]
    print(
        f"{s['decoder']:9} t={s['temperature']:<4} top_p={s['top_p']} tokens={s['max_new_tokens']} "
        f"steps={s['steps']}: good block {r['good_block']:.1%}, repeats a line {r['repeats_line']:.1%}, "
        f"stops after its block {r['stops_after_block']:.1%} ({r['requests']} requests, {r['seconds']} s)"
    )
    if s["retry_block"]:
        f = r["first_decode"]
        print(
            f"  decoded again in blocks of {s['retry_block']}: {r['decoded_again']} answers; "
            f"the first decodes alone: good block {f['good_block']:.1%}, repeats a line "
            f"{f['repeats_line']:.1%}"
        )
    for key, label in (("topic_change", "answers"), ("first_decode_topic_change", "first decodes")):
        if key in r:
            parts = [
                f"{name} {r[key][k]['share']:.1%} ({r[key][k]['count']}, 95% CI "
                f"{r[key][k]['ci95'][0]:.1%}-{r[key][k]['ci95'][1]:.1%})"
                for k, name in (
                    ("leak", "define the first request's name"),
                    ("answers_second", "the second's"),
                )
            ]
            print(f"  second {label}: " + "; ".join(parts))
    if before is None:
        return
    old, new = before["samples"], r["samples"]
    if [x["request"] for x in old] != [x["request"] for x in new]:
        raise SystemExit("--before: not the same requests in the same order")
    pairs = [
        ("good_block", lambda x: x["good_block"]),
        ("first decode good block", lambda x: x["first_good_block"]),
    ]
    if "answered" in new[0] and "answered" in old[0]:
        pairs += [
            ("leak", lambda x: x["answered"] == "first"),
            ("second's name", lambda x: x["answered"] == "second"),
            ("first decode leak", lambda x: x["first_answered"] == "first"),
        ]
    for name, value in pairs:
        mean, low, high = paired([value(x) for x in new], [value(x) for x in old])
        print(f"  {name}: {mean:+.1%} against --before (95% CI {low:+.1%} to {high:+.1%}, paired)")


def _answer(rt: Any, prompts: list[str], settings: ChatSettings, batch: int) -> list[str]:
    params = settings.sampling_params()
    jobs = [Job(p, params.max_new_tokens, chat=True) for p in prompts]
    with Progress(transient=True) as progress:
        label = f"{params.decoder} blocks of {params.block_length}, t={params.temperature}"
        task = progress.add_task(label, total=len(jobs))
        out = LocalGenerator(rt, params, batch).generate(jobs, lambda k: progress.advance(task, k))
    return [g.text for g in out]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("model", type=Path)
    parser.add_argument("heldout", type=Path)
    parser.add_argument("--json", type=Path, default=None, help="write every result here")
    parser.add_argument("--record", action="store_true", help="try the grid; record the best chat defaults")
    parser.add_argument(
        "--held-out-of",
        type=int,
        default=None,
        metavar="PERMILLE",
        help="HELDOUT is a training file: send only the lines --heldout-permille PERMILLE kept out of it",
    )
    parser.add_argument("--limit", type=int, default=None, help="only the first N requests")
    parser.add_argument("--before", type=Path, default=None, help="an earlier --json: paired differences")
    parser.add_argument("--batch", type=int, default=16)
    for name, kind in KNOBS.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=kind, default=None)
    args = parser.parse_args()

    import model_runtime
    from model_runtime.generation_config import chat_decoder, chat_defaults
    from model_runtime.train.sft_data import is_heldout_line

    # Lines as diffu train reads them (file lines, not str.splitlines, which also splits at \u2028 and
    # the like), so --held-out-of picks the very lines training kept out.
    with args.heldout.open(encoding="utf-8") as f:
        lines = [line for line in f if line.strip()]
    if args.held_out_of is not None:
        lines = [line for line in lines if is_heldout_line(line, args.held_out_of)]
    requests = [json.loads(line) for line in lines]
    requests = requests[: args.limit]
    # 768: two-turn prompts (at most 316 tokens) with the chat's second decode on 256 tokens.
    buckets = (256, 384, 512, 768)
    rt = model_runtime.load(args.model, length_buckets=buckets, batch_buckets=(1, args.batch))
    given = {k: getattr(args, k) for k in KNOBS if getattr(args, k) is not None}
    # As the chat layers them: its built-in knobs, the model's chat defaults, then its chat decoder (whose
    # knobs go with it when --decoder names another).
    chat = chat_decoder(args.model)
    if given.get("decoder", chat.get("decoder")) != chat.get("decoder"):
        chat = {}
    base = CHAT_DEFAULTS | {"decoder": rt.info.default_decoder} | chat_defaults(args.model) | chat

    points = GRID if args.record else ({},)
    results = [run(rt, requests, base | point | given, args.batch) for point in points]
    earlier = json.loads(args.before.read_text())["results"] if args.before else []
    for r in results:
        report(r, _same_settings(earlier, r) if args.before else None)
    if args.record:
        best = ins.best_setting(results)
        path = args.model / "generation_config.json"
        config = json.loads(path.read_text(encoding="utf-8"))
        s = best["settings"]
        config |= {k: s[k] for k in ("temperature", "top_p", "alg", "steps", "max_new_tokens")}
        config["diffu_decoder"] = s["decoder"]
        if s["decoder"] == "fast":
            config |= {"block_length": s["block_length"], "threshold": s["threshold"]}
        path.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
        print(f"recorded the chat defaults of {s['decoder']} t={s['temperature']} in {path}", file=sys.stderr)
    if args.json:
        args.json.write_text(json.dumps({"model": str(args.model), "results": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
