"""``diffu generate``: one prompt or a left-padded batch of prompts, through the running daemon when there
is one, else with the model loaded in this process (``--local`` forces that, ``--daemon`` the daemon).

The settings are the model's own where no flag is given (its generation_config.json: the bundled model
runs the fast decoder on 192 tokens in blocks of 64, as the chat does), either way. Without ``--json``
the denoising is shown live on stderr (rich): masked positions dim, tokens committed in the current step
highlighted; then the answer on stdout. A step is one forward of the model, with either decoder. With
``--json`` one object is printed, the same in-process and through the daemon: ``prompt_ids``,
``sequences`` (full canvases as the reference returns them), ``text``, ``finish_reason``, ``stats`` and,
with ``--history`` (in-process only), one entry per step holding every prompt's full canvas
(docs/usage.md describes each field).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from assistant.cli.model_options import (
    SAMPLING,
    add_max_new_tokens,
    add_multihost_options,
    add_sampling_options,
    add_where_options,
    check_sampling_flags,
    daemon_config,
    init_multihost,
    load_with_progress,
    model_decoder,
    quantize_of,
    sampling_params,
)
from assistant.wire import DoneStats
from model_runtime.interface import BatchDone
from model_runtime.params import SamplingParams

if TYPE_CHECKING:
    from rich.console import Group

    from assistant.client import Client, Done, Step, Waiting
    from assistant.config import Config
    from model_runtime.rows import CanvasRow


MAX_NEW = SAMPLING["max_new_tokens"].default  # the canvas when neither a flag nor the model says


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "generate",
        help="generate text with the model (through the running daemon, else in this process)",
        description="Denoise a canvas of <|mask|> tokens after the prompt, or between --prompt and --suffix. "
        "A running daemon for the model answers it (no load, no compile); otherwise the model is loaded "
        "in this process.",
    )
    add_generation_options(p)
    add_where_options(p)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the live view")
    p.add_argument("--history", action="store_true", help="with --json, add every step's canvases")
    p.set_defaults(func=run)


def add_generation_options(p: argparse.ArgumentParser) -> None:
    """Model, prompt and sampling flags, shared by ``diffu generate`` and ``diffu bench generate``."""
    p.add_argument(
        "--prompt", action="append", required=True, help="prompt text; repeat it for a left-padded batch"
    )
    p.add_argument(
        "--raw", action="store_true", help="use the prompt as is, without the Instruct chat template"
    )
    p.add_argument(
        "--suffix", default=None, help="code after the hole: fill the middle between prompt and suffix"
    )
    p.add_argument(
        "--infill-tokens",
        type=int,
        default=None,
        metavar="N",
        help="size of the hole with --suffix (default: --max-new-tokens)",
    )
    add_max_new_tokens(p, default=None, default_text=f"the model's generation_config.json, else {MAX_NEW}")
    add_sampling_options(p)
    add_multihost_options(p)


def run(args: argparse.Namespace) -> int:
    from assistant.errors import UsageError

    if args.history and not args.json:
        raise UsageError("--history needs --json")
    check_prompt_args(args)
    check_sampling_flags(args)
    config = daemon_config(args, local_only=("history",))
    if config is not None:
        return _run_daemon(args, config)
    return _run_local(args)


def _run_local(args: argparse.Namespace) -> int:
    """Load the model in this process and generate."""
    from assistant.errors import UsageError
    from model_runtime.errors import DiffuError

    model = args.model or os.environ.get("DIFFU_MODEL")
    try:
        init_multihost(args)
        rt = load_with_progress(model, args.dtype, tp=args.tp, dp=args.dp, quantize=quantize_of(args))
        params = model_decoder(args, sampling_params(args, model=rt.info.chat_defaults), rt)
        rows = build_rows(rt, args, params)
        # Without a live view or a history nobody needs the steps: run the loop as one program.
        events = rt.run(rows, params, stream=not args.json or args.history)
        import jax

        if jax.process_index() != 0:
            for _ in events:  # the other hosts run the same steps; process 0 prints
                pass
        elif args.json:
            print(json.dumps(_collect_json(rt, rows, events, args.history)))
        else:
            done = _live(rt, events)
            _print_texts(done.texts)
            _report_stats(done.stats.to_dict())
    except DiffuError as exc:
        raise UsageError(str(exc)) from None
    return 0


def _run_daemon(args: argparse.Namespace, config: Config) -> int:
    """The same generation through the daemon: live canvas from its step events, then the answers."""
    from assistant.client import APIError, Client, DaemonUnavailable, stderr_progress
    from assistant.errors import UsageError

    try:
        with Client(
            config=config, autostart=args.daemon, progress=stderr_progress(), wait_compiled=False
        ) as client:
            # The model's settings where no flag is given, as in-process (the daemon reports them).
            params = sampling_params(args, model=client.status().chat_defaults)
            results = [_daemon_answer(client, args, prompt, params) for prompt in args.prompt]
    except (DaemonUnavailable, APIError) as exc:
        raise UsageError(str(exc)) from None
    stats = _daemon_stats([r.stats for r in results])
    if args.json:
        ids = [r.ids or {} for r in results]
        sequences = [i.get("sequence", []) for i in ids]
        pad = ids[0].get("pad_id", 0) if ids else 0
        prompts = [i.get("prompt", []) for i in ids]
        texts, reasons = [r.text for r in results], [r.finish_reason for r in results]
        print(json.dumps(_json_shape(prompts, sequences, texts, reasons, stats, pad)))
    else:
        _print_texts([r.text for r in results])
    _report_stats(stats)
    return 0


def _daemon_answer(client: Client, args: argparse.Namespace, prompt: str, params: SamplingParams) -> Done:
    """One prompt's request, drawn live on stderr unless ``--json``; its final event."""
    from assistant.client import SamplingOptions

    # Without --decoder the daemon picks the decoder its model recommends.
    skip = {"max_new_tokens"} | ({"decoder"} if args.decoder is None else set())
    sampling = SamplingOptions(**{k: v for k, v in params.to_dict().items() if k not in skip})
    tokens = params.max_new_tokens
    if args.suffix is not None:
        events = client.stream_infill(
            prompt, args.suffix, canvas_tokens=tokens, sampling=sampling, return_ids=args.json
        )
    else:
        events = client.stream_generate(
            prompt=prompt if args.raw else None,
            messages=None if args.raw else [{"role": "user", "content": prompt}],
            max_new_tokens=tokens,
            sampling=sampling,
            return_ids=args.json,
        )
    return _draw_daemon_events(events, live=not args.json)


def _draw_daemon_events(events: Iterable[Step | Waiting | Done], *, live: bool) -> Done:
    """Draw the daemon's events in place on stderr (``live``), masks dim and this step's tokens
    highlighted; the Done at the end."""
    from rich.console import Console
    from rich.live import Live
    from rich.text import Text

    from assistant.client import DaemonUnavailable, Done, Step, Waiting
    from tui.render import waiting_text

    done: Done | None = None
    if not live:
        done = next((e for e in events if isinstance(e, Done)), None)
    else:
        # Transient, as in-process: the answer follows on stdout, and a frame left above it showed it twice.
        with Live(console=Console(stderr=True), refresh_per_second=30, transient=True) as view:
            for event in events:
                if isinstance(event, Done):
                    done = event
                elif isinstance(event, Waiting):
                    view.update(Text(waiting_text(event), style="dim"))
                elif isinstance(event, Step):
                    view.update(_frame([event]))
    if done is None:
        raise DaemonUnavailable("the daemon ended the stream without an answer")
    return done


def _print_texts(texts: list[str]) -> None:
    """The answers on stdout, flushed before the stats line goes to stderr (one after the other when both
    go to one file or terminal: a piped stdout is block-buffered and would come after it)."""
    for i, text in enumerate(texts):
        if len(texts) > 1:
            print(f"--- [{i}]")
        print(text)
    sys.stdout.flush()


def _daemon_stats(per_request: list[DoneStats]) -> dict[str, Any]:
    """The stats of the daemon's requests (one per prompt, run in turn) in the in-process shape
    (``GenerationStats``): ``new_tokens`` counts the canvas positions denoised, as in-process."""
    new = sum(s.canvas_tokens for s in per_request)
    seconds = sum(s.generate_seconds for s in per_request)
    buckets = [list(s.bucket) for s in per_request if s.bucket]
    return {
        "steps": max((s.steps for s in per_request), default=0),
        "new_tokens": new,
        "batch_size": max((s.batch_size for s in per_request), default=0),
        "compile_seconds": round(sum(s.compile_seconds for s in per_request), 4),
        "generate_seconds": round(seconds, 4),
        "tokens_per_second": round(new / seconds, 2) if seconds > 0 else 0.0,
        "compiled_programs": sum(s.compiled_programs for s in per_request),
        "cache_hits": sum(s.cache_hits for s in per_request),
        "bucket": max(buckets, default=[0, 0]),
        "decoder": per_request[0].decoder if per_request else "",
    }


def _json_shape(
    prompt_ids: list[list[int]],
    sequences: list[list[int]],
    texts: list[str],
    finish_reasons: list[str],
    stats: dict[str, Any],
    pad_id: int,
    history: list[list[list[int]]] | None = None,
) -> dict[str, Any]:
    """The one ``--json`` object, in-process or from the daemon; ``sequences`` are left-padded here to
    the longest, as the reference returns a batch."""
    longest = max((len(s) for s in sequences), default=0)
    out: dict[str, Any] = {
        "prompt_ids": prompt_ids,
        "sequences": [[pad_id] * (longest - len(s)) + list(s) for s in sequences],
        "text": texts,
        "finish_reason": finish_reasons,
        "stats": stats,
    }
    if history is not None:
        out["history"] = history
    return out


def build_rows(rt, args: argparse.Namespace, params: SamplingParams) -> list[CanvasRow]:
    """One canvas row per --prompt (chat template unless --raw), or the infill row with --suffix."""
    if args.suffix is not None:
        return [rt.rows.make_infill_row(args.prompt[0], args.suffix, params.max_new_tokens)]
    chat = not args.raw
    prompts = [
        rt.rows.encode_chat([{"role": "user", "content": p}]) if chat else rt.tokenizer.encode(p)
        for p in args.prompt
    ]
    return [rt.rows.make_row(p, params.max_new_tokens, chat=chat) for p in prompts]


def check_prompt_args(args: argparse.Namespace) -> None:
    from assistant.errors import UsageError

    if args.infill_tokens is not None and args.suffix is None:
        raise UsageError("--infill-tokens needs --suffix")
    if args.suffix is not None and len(args.prompt) != 1:
        raise UsageError("--suffix takes exactly one --prompt (the code before the hole)")
    if args.suffix is None and any(not p.strip() for p in args.prompt):
        # Nothing to condition on: the model would write from nothing, which no one asked for.
        raise UsageError("--prompt: empty prompt (give the text to continue or answer)")


def _collect_json(rt, rows, events, with_history: bool) -> dict[str, Any]:
    history = []
    done = None
    longest = max(len(r.ids) for r in rows)
    pad = rt.config.pad_token_id
    for event in events:
        if isinstance(event, BatchDone):
            done = event
        elif with_history:
            history.append([[pad] * (longest - len(c)) + c for c in event.content])
    assert done is not None, "the runtime ends every generation with a BatchDone"
    _report_stats(done.stats.to_dict(), stream=sys.stderr)
    reasons = []
    for r, region in zip(rows, done.generated, strict=True):
        stops = set(rt.tokenizer.stop_ids(chat=r.chat))
        reasons.append("stop" if any(t in stops for t in region) else "length")
    return _json_shape(
        [list(r.ids[: r.region[0]]) for r in rows],
        done.sequences,
        done.texts,
        reasons,
        done.stats.to_dict(),
        pad,
        history if with_history else None,
    )


def _report_stats(stats: dict[str, Any], stream=None) -> None:
    """One line on stderr: tokens, steps (forwards), generation time and rate (no compile in them), and
    what compiling cost."""
    print(
        f"{stats['new_tokens']} tokens in {stats['steps']} steps, {stats['generate_seconds']:.2f}s "
        f"({stats['tokens_per_second']:.1f} tokens/s); compiled {stats['compiled_programs']} new "
        f"program(s), {stats['cache_hits']} loaded from the compilation cache, "
        f"{stats['compile_seconds']:.2f}s",
        file=stream or sys.stderr,
    )


def _live(rt, events):
    """Draw every row's canvas as it denoises, as through the daemon (:func:`_frame`)."""
    from rich.console import Console
    from rich.live import Live

    from assistant.client import Step
    from assistant.server.http.native import Pieces

    pieces = Pieces(rt.tokenizer)  # the daemon's own rendering of a canvas into text and spans
    done = None
    # The live frame goes to stderr, piped stdout holds the answer only; transient, so that on a terminal
    # the last frame is gone before the answer prints (left there, it showed the answer twice) and a file
    # gets no frame at all (rich writes a non-transient Live's last frame there without a final newline,
    # and the stats line ran into it).
    with Live(console=Console(stderr=True), refresh_per_second=30, transient=True) as live:
        for event in events:
            if isinstance(event, BatchDone):
                done = event
                break
            rows = [
                Step("", event.step, event.steps, masks=0, block=event.block, blocks=event.blocks,
                     **pieces.render(canvas, fresh))
                for canvas, fresh in zip(event.canvas, event.unmasked, strict=True)
            ]  # fmt: skip
            live.update(_frame(rows))
    return done


def _frame(rows: list[Step]) -> Group:
    """One live frame: the step's label, then each row's canvas (masks dim, this step's tokens
    highlighted, stop and pad tokens as one glyph), in-process and through the daemon alike."""
    from rich.console import Group
    from rich.text import Text

    from tui.render import canvas_text, step_label

    first = rows[0]
    label = Text(step_label(first.step, first.steps, first.block, first.blocks), style="bold")
    return Group(label, *(canvas_text(row) for row in rows))
