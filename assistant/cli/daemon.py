"""``diffu daemon start|stop|status|logs``: the background daemon's lifecycle.

``start`` spawns ``diffu serve`` detached (one daemon per model: starting one that runs reports it) and
waits until it serves (its weights loaded), showing the load's progress; the warm-up of its programs
goes on in the background, between requests. ``stop`` sends SIGTERM and waits for the exit.
``status`` exits 3 when no daemon runs, as LSB init scripts do.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from assistant.daemon_status import DaemonStatus, EngineStatus, ProgramsStatus
from assistant.errors import UsageError
from assistant.wire import Stage

if TYPE_CHECKING:
    from assistant.discovery import DaemonInfo

NOT_RUNNING = 3


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from assistant.cli.serve import add_server_flags

    parser = subparsers.add_parser(
        "daemon",
        help="start, stop or inspect the background daemon",
        description="Manage the background diffu daemon.",
    )
    sub = parser.add_subparsers(dest="daemon_command", metavar="ACTION", required=True)
    start = sub.add_parser("start", help="start a background daemon and wait until it serves")
    add_server_flags(start)
    start.add_argument(
        "--no-wait",
        dest="wait",
        action="store_false",
        help="return once it listens, without waiting for the model to load",
    )
    start.set_defaults(func=cmd_start)
    stop = sub.add_parser("stop", help="stop the daemon(s) (all of them unless --model is given)")
    stop.add_argument("--model", help="only the daemon serving this model")
    stop.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for the exit (default 60)")
    stop.set_defaults(func=cmd_stop)
    status = sub.add_parser("status", help="show running daemons (exit code 3 if none)")
    status.add_argument("--json", action="store_true", help="print machine-readable JSON")
    status.set_defaults(func=cmd_status)
    logs = sub.add_parser("logs", help="print the daemon log")
    logs.add_argument("--model", help="the log of the daemon for this model (default: the latest)")
    logs.add_argument("-n", "--lines", type=int, default=50, help="lines to print (default 50)")
    logs.add_argument("-f", "--follow", action="store_true", help="keep printing new lines")
    logs.set_defaults(func=cmd_logs)


def cmd_start(args: argparse.Namespace) -> int:
    from assistant import client, discovery
    from assistant.cli.serve import flags_of
    from assistant.config import load_config

    config, _ = load_config(flags_of(args))
    if not config.model:
        raise UsageError("no model: pass --model DIR (or set model in config.toml, or DIFFU_MODEL)")
    existing = discovery.find_daemon(config.model)
    if existing is not None:
        print(f"diffu daemon: already running at {existing.url} (pid {existing.pid}, model {existing.model})")
        return 0
    try:
        endpoint = client.start_daemon(config.replace(url=None), exact_port=args.port is not None)
        info = endpoint.info
        assert info is not None
        print(
            f"diffu daemon: started pid {info.pid} at {info.url} (model {info.model}); log: {info.log_file}",
            flush=True,
        )
        if args.wait:
            with client.Client(
                config=config.replace(url=info.url),
                autostart=False,
                progress=client.stderr_progress("diffu daemon"),
            ) as c:
                c.wait_ready(endpoint)
                engine = c.status().engine
            print(f"diffu daemon: ready to serve{_warming(engine, ', ')}", flush=True)
    except client.DaemonUnavailable as exc:
        raise UsageError(str(exc)) from None
    return 0


def cmd_stop(args: argparse.Namespace) -> int:
    from assistant import discovery
    from assistant.client import spawn

    if args.model:
        targets = [d for d in [discovery.find_daemon(args.model)] if d]
    else:
        targets = discovery.running_daemons()
    if not targets:
        print("diffu daemon: not running" + (f" for {args.model}" if args.model else ""))
        return 0
    failed = []
    for info in targets:
        print(f"diffu daemon: stopping pid {info.pid} ({info.model}) ...", flush=True)
        if spawn.stop_daemon(info, timeout=args.timeout):
            print(f"diffu daemon: stopped pid {info.pid}")
        else:
            failed.append(info)
    if failed:
        pids = ", ".join(str(i.pid) for i in failed)
        raise UsageError(
            f"daemon(s) {pids} did not exit within {args.timeout:.0f}s after SIGTERM; see 'diffu daemon logs'"
        )
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    import json

    from assistant import discovery

    infos = discovery.running_daemons()
    rows = [{**discovery.info_dict(info), "server": _query_status(info)} for info in infos]
    if args.json:
        print(json.dumps(rows, indent=2))
    elif not rows:
        print("diffu daemon: not running")
    for row in rows if not args.json else []:
        server = row["server"]
        print(
            f"{row['model']}\n  url:     {row['url']}\n  pid:     {row['pid']}\n"
            f"  started: {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(row['started']))}\n"
            f"  log:     {row['log_file']}"
        )
        if "error" in server:
            print(f"  state:   not answering ({server['error']})")
            continue
        status = DaemonStatus.from_dict(server)  # --json prints the daemon's answer as it came
        engine, queue = status.engine, status.queue
        stage, detail = engine.stage, engine.detail or ""
        if stage == Stage.WARMING:
            state = f"ready to serve{_warming(engine, ', ')}"
        elif stage == Stage.COMPILING:  # it takes requests, but a chat's first one would wait for these
            state = f"serving, {detail}; ready once they are in"
        else:
            state = stage if detail in ("", stage) else f"{stage} ({detail})"
        if engine.compiling:
            state += f"\n  compiling: {engine.compiling}"
        print(
            f"  state:   {state}\n"
            f"  device:  {status.device} ({status.dtype}), context {status.max_context}\n"
            f"  queue:   {queue.pending} waiting, {queue.running} running\n"
            f"  served:  {status.counters.completed} requests, up {status.uptime_seconds:.0f}s"
        )
        if status.programs is not None:
            print(f"  programs: {_programs(status.programs)}")
    return 0 if rows else NOT_RUNNING


def _programs(info: ProgramsStatus) -> str:
    """``12 of at most 64 compiled programs held (15 built, 3 evicted); memory 1.2 GiB, at most 3.4 GiB``."""
    text = (
        f"{info.held} of at most {info.max_programs} compiled programs held "
        f"({info.compiled} built, {info.evicted} evicted)"
    )
    resident, ceiling = info.resident_bytes, info.memory_ceiling_bytes
    if resident is not None and ceiling is not None:
        text += f"; memory {resident / 2**30:.1f} GiB, at most {ceiling / 2**30:.1f} GiB"
    return text


def _warming(engine: EngineStatus, sep: str) -> str:
    """``, warming up 2 of 9 request shapes in the background (about 40 s left)`` while warming."""
    if engine.stage != Stage.WARMING:
        return ""
    eta = engine.eta_seconds
    left = f" (about {eta:.0f} s left)" if eta is not None else ""
    done, total = engine.warmed, engine.shapes
    return f"{sep}warming up {done} of {total} request shapes in the background{left}"


def _query_status(info: DaemonInfo) -> dict[str, Any]:
    import httpx

    from assistant.client import client_api_key
    from assistant.config import load_config

    key = client_api_key(load_config()[0])
    try:
        response = httpx.get(
            info.url + "/v1/diffu/status", headers={"authorization": f"Bearer {key or 'none'}"}, timeout=5.0
        )
    except httpx.HTTPError as exc:
        return {"error": str(exc) or type(exc).__name__}
    if response.status_code != 200:
        return {"error": f"HTTP {response.status_code}: {response.text[:200]}"}
    return response.json()


def cmd_logs(args: argparse.Namespace) -> int:
    from assistant import discovery, paths
    from assistant.client import spawn

    if args.model:
        path = discovery.log_path(discovery.model_key(args.model))
    else:
        running = discovery.running_daemons()
        if running:
            path = discovery.log_path(running[0].key)
        else:
            logs = (
                sorted(paths.log_dir().glob("*.log"), key=lambda p: p.stat().st_mtime)
                if paths.log_dir().is_dir()
                else []
            )
            if not logs:
                raise UsageError(f"no daemon logs in {paths.log_dir()}")
            path = logs[-1]
    if not path.exists():
        raise UsageError(f"no log at {path}")
    text = spawn.tail_lines(path, max(args.lines, 0))
    if text:
        print(text)
    if args.follow:
        _follow(path)
    return 0


def _follow(path: Path) -> None:
    """Print lines appended to ``path`` until interrupted (re-opening it when the log rotates)."""
    with open(path, encoding="utf-8", errors="replace") as f:
        f.seek(0, os.SEEK_END)
        inode = os.fstat(f.fileno()).st_ino
        while True:
            line = f.readline()
            if line:
                sys.stdout.write(line)
                sys.stdout.flush()
                continue
            # A file has no "new data" event portable across platforms; tail -f also re-checks periodically.
            time.sleep(0.25)
            try:
                if os.stat(path).st_ino != inode:
                    _follow(path)
                    return
            except FileNotFoundError:
                continue
