"""``diffu generate``: run the model in-process on one prompt or a left-padded batch of prompts, or ask
the daemon (``--daemon``).

Without ``--json`` the denoising is shown live on stderr (rich): masked positions dim, tokens committed
in the current step highlighted; then the answer on stdout. A step is one forward of the model, with
either decoder. With ``--json`` one object is printed, the same with and without ``--daemon``:
``prompt_ids``, ``sequences`` (full canvases as the reference returns them), ``text``,
``finish_reason``, ``stats`` and, with ``--history`` (in-process only), one entry per step holding every
prompt's full canvas (docs/usage.md describes each field).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TYPE_CHECKING, Any

from assistant.cli.model_options import (
    add_max_new_tokens,
    add_multihost_options,
    add_sampling_options,
    init_multihost,
    load_with_progress,
    model_decoder,
    quantize_of,
    sampling_params,
)
from model_runtime.interface import BatchDone
from model_runtime.params import SamplingParams

if TYPE_CHECKING:
    pass

MASK_GLYPH = "░"


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "generate",
        help="generate text with the model in this process",
        description="Denoise a canvas of <|mask|> tokens after the prompt, or between --prompt and --suffix.",
    )
    add_generation_options(p)
    p.add_argument(
        "--daemon",
        action="store_true",
        help="ask the resident daemon (DIFFU_URL, the discovery file, or one started for --model) "
        "instead of loading the model in this process",
    )
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
    add_max_new_tokens(p)
    add_sampling_options(p)
    add_multihost_options(p)


def run(args: argparse.Namespace) -> int:
    from assistant.errors import UsageError

    if args.history and not args.json:
        raise UsageError("--history needs --json")
    check_prompt_args(args)
    params = sampling_params(args)
    if args.daemon:
        if args.history:
            raise UsageError("--history is not available with --daemon (the daemon streams canvas text)")
        return _run_daemon(args, params)
    model = args.model or os.environ.get("DIFFU_MODEL")

    from model_runtime.errors import DiffuError

    try:
        init_multihost(args)
        rt = load_with_progress(model, args.dtype, tp=args.tp, dp=args.dp, quantize=quantize_of(args))
        params = model_decoder(args, params, rt)
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
            for i, text in enumerate(done.texts):
                if len(done.texts) > 1:
                    print(f"--- [{i}]")
                print(text)
            _report_stats(done.stats.to_dict())
    except DiffuError as exc:
        raise UsageError(str(exc)) from None
    return 0


def _run_daemon(args: argparse.Namespace, params: SamplingParams) -> int:
    """The same generation through the daemon: live canvas from its step events, then the answers."""
    from rich.console import Console
    from rich.live import Live
    from rich.text import Text

    from assistant.client import (
        APIError,
        Client,
        DaemonUnavailable,
        Done,
        SamplingOptions,
        Step,
        Waiting,
        stderr_progress,
    )
    from assistant.config import ConfigError, load_config
    from assistant.errors import UsageError
    from tui.render import step_label, waiting_text

    try:
        config = load_config({"model": args.model} if args.model else None)[0]
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    # Without --decoder the daemon picks the decoder its model recommends.
    skip = {"max_new_tokens"} | ({"decoder"} if args.decoder is None else set())
    sampling = SamplingOptions(**{k: v for k, v in params.to_dict().items() if k not in skip})
    results: list[Done] = []
    console = Console(stderr=True)  # the live frame; stdout holds the answers only
    try:
        with Client(config=config, progress=stderr_progress()) as client:
            for prompt in args.prompt:
                if args.suffix is not None:
                    events = client.stream_infill(
                        prompt, args.suffix, canvas_tokens=params.max_new_tokens, sampling=sampling,
                        return_ids=args.json,
                    )  # fmt: skip
                else:
                    events = client.stream_generate(
                        prompt=prompt if args.raw else None,
                        messages=None if args.raw else [{"role": "user", "content": prompt}],
                        max_new_tokens=params.max_new_tokens,
                        sampling=sampling,
                        return_ids=args.json,
                    )
                with Live(
                    console=console, refresh_per_second=30, transient=True, auto_refresh=not args.json
                ) as live:
                    for event in events:
                        if isinstance(event, Done):
                            results.append(event)
                        elif args.json:
                            continue
                        elif isinstance(event, Waiting):
                            live.update(Text(waiting_text(event), style="dim"))
                        elif isinstance(event, Step):
                            text = Text(step_label(event.step, event.steps, event.block, event.blocks) + "\n")
                            text.stylize("bold")
                            canvas = Text(event.canvas)
                            for lo, hi in event.masked:
                                canvas.stylize("dim", lo, hi)
                            for lo, hi in event.unmasked:
                                canvas.stylize("bold black on bright_green", lo, hi)
                            text.append_text(canvas)
                            live.update(text)
    except (DaemonUnavailable, APIError) as exc:
        raise UsageError(str(exc)) from None
    stats = _daemon_stats([r.stats for r in results])
    if args.json:
        ids = [r.ids or {} for r in results]
        sequences = [i.get("sequence", []) for i in ids]
        pad = ids[0].get("pad_id", 0) if ids else 0
        out = _json_shape(
            [i.get("prompt", []) for i in ids],
            sequences,
            [r.text for r in results],
            [r.finish_reason for r in results],
            stats,
            pad,
        )
        print(json.dumps(out))
    else:
        for i, r in enumerate(results):
            if len(results) > 1:
                print(f"--- [{i}]")
            print(r.text)
    _report_stats(stats)
    return 0


def _daemon_stats(per_request: list[dict[str, Any]]) -> dict[str, Any]:
    """The stats of the daemon's requests (one per prompt, run in turn) in the in-process shape
    (``GenerationStats``): ``new_tokens`` counts the canvas positions denoised, as in-process."""
    new = sum(int(s.get("canvas_tokens", 0)) for s in per_request)
    seconds = sum(float(s.get("generate_seconds", 0.0)) for s in per_request)
    buckets = [s["bucket"] for s in per_request if s.get("bucket")]
    return {
        "steps": max((int(s.get("steps", 0)) for s in per_request), default=0),
        "new_tokens": new,
        "batch_size": max((int(s.get("batch_size", 0)) for s in per_request), default=0),
        "compile_seconds": round(sum(float(s.get("compile_seconds", 0.0)) for s in per_request), 4),
        "generate_seconds": round(seconds, 4),
        "tokens_per_second": round(new / seconds, 2) if seconds > 0 else 0.0,
        "compiled_programs": sum(int(s.get("compiled_programs", 0)) for s in per_request),
        "cache_hits": sum(int(s.get("cache_hits", 0)) for s in per_request),
        "bucket": max(buckets, default=[0, 0]),
        "decoder": per_request[0].get("decoder", "") if per_request else "",
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


def build_rows(rt, args: argparse.Namespace, params: SamplingParams) -> list:
    """One canvas row per --prompt (chat template unless --raw), or the infill row with --suffix."""
    if args.suffix is not None:
        return [rt.make_infill_row(args.prompt[0], args.suffix, params.max_new_tokens)]
    chat = not args.raw
    prompts = [
        rt.encode_chat([{"role": "user", "content": p}]) if chat else rt.tokenizer.encode(p)
        for p in args.prompt
    ]
    return [rt.make_row(p, params.max_new_tokens, chat=chat) for p in prompts]


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
    """Draw every row's canvas as it denoises: masks dim, this step's tokens highlighted."""
    from rich.console import Console, Group
    from rich.live import Live
    from rich.text import Text

    # The live frame goes to stderr: piped stdout holds the answer only.
    from tui.render import step_label

    console = Console(stderr=True)
    tok = rt.tokenizer
    done = None
    with Live(console=console, refresh_per_second=30, transient=False) as live:
        for event in events:
            if isinstance(event, BatchDone):
                done = event
                break
            label = step_label(event.step, event.steps, event.block, event.blocks)
            panels = [Text(label, style="bold")]
            for canvas, fresh in zip(event.canvas, event.unmasked, strict=True):
                text = Text()
                fresh_set = set(fresh)
                for pos, (tid, piece) in enumerate(zip(canvas, tok.token_strings(canvas), strict=True)):
                    if tid == tok.mask_id:
                        text.append(MASK_GLYPH, style="dim")
                    elif pos in fresh_set:
                        text.append(piece, style="bold black on bright_green")
                    else:
                        text.append(piece)
                panels.append(text)
            live.update(Group(*panels))
    return done
