"""What comes back from a sandboxed run: its pipes, read while it runs, and what they say.

Every stream of a run is a pipe the evaluator reads as the run goes (``pump``), never a file: the
program's stdout and stderr cost no disk outside the run's own tmpfs, and the program's view of its open
descriptors shows pipes, not the evaluator's paths. Each stream keeps what a report needs (16 KiB of
output, the status line, the result lines) and is read on to a bound past which it is closed, so a
program that writes without end meets a closed pipe (``BrokenPipeError``) instead of filling memory.

``records`` reads the result pipe's lines (JSON objects carrying the run's token, so that nothing the
program prints or names forges one), ``classify`` turns them with the exit status into an outcome, and
``isolation`` gathers what the kernel granted.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import time
from collections.abc import Callable
from typing import Any

from assistant.evals import cgroups, sandbox_values


class Stream:
    """One pipe's read end: the first ``keep`` bytes are kept, reading stops (the pipe is closed) after
    ``drain`` bytes."""

    def __init__(self, fd: int, keep: int, drain: int) -> None:
        self.fd, self.keep, self.drain = fd, keep, drain
        self.data = bytearray()
        self.seen = 0
        self.open = True
        os.set_blocking(fd, False)

    def read(self) -> bool:
        """Read what is there; False once the pipe is at its end or past its bound (then closed)."""
        while self.open:
            try:
                chunk = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                return True
            if chunk:
                self.seen += len(chunk)
                room = self.keep - len(self.data)
                if room > 0:
                    self.data += chunk[:room]
            if not chunk or self.seen >= self.drain:
                self.close()
        return False

    def close(self) -> None:
        if self.open:
            self.open = False
            os.close(self.fd)

    @property
    def cut(self) -> bool:
        return self.seen > self.keep

    def text(self, note: str = "\n[output cut]") -> str:
        return self.data.decode("utf-8", "replace") + (note if self.cut else "")


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def pump(
    streams: list[Stream],
    proc: subprocess.Popen,
    deadline: float,
    status: Stream,
    on_report: Callable[[dict[str, Any]], None],
) -> bool:
    """Read ``streams`` while the run's outer process lives; True when it ended before ``deadline``.
    ``on_report`` gets the outer process's report as soon as its line is in (``status``)."""
    selector = selectors.DefaultSelector()
    for stream in streams:
        selector.register(stream.fd, selectors.EVENT_READ, stream)
    pidfd = _pidfd(proc.pid)  # readable when the process ends: no polling while it runs
    if pidfd is not None:
        selector.register(pidfd, selectors.EVENT_READ, None)
    reported = False
    try:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            events = selector.select(remaining if pidfd is not None else min(remaining, 0.05))
            ended = pidfd is None and proc.poll() is not None
            for key, _ in events:
                if key.data is None:
                    ended = True
                elif not key.data.read():
                    selector.unregister(key.fd)
            if not reported and status.data.endswith(b"\n"):
                reported = True
                on_report(report(status))
            if ended:
                return True
    finally:
        selector.close()
        if pidfd is not None:
            os.close(pidfd)


def finish(streams: list[Stream]) -> None:
    """After the run has ended: read what its pipes still hold, then close them (a process left over
    without a PID namespace could keep a pipe open: nothing waits for it)."""
    for stream in streams:
        stream.read()
        stream.close()


def report(status: Stream) -> dict[str, Any]:
    """The outer process's one-line report (namespaces, work dir, init pid); {} if none came."""
    try:
        parsed = json.loads(bytes(status.data).split(b"\n", 1)[0])
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def records(result: Stream, token: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The program's confinement report (its first line, written before the program ran) and the
    harness's records after it: only lines that are JSON objects carrying the run's ``token``."""
    lines = bytes(result.data).decode("utf-8", "replace").split("\n")
    try:
        confined = json.loads(lines[0])
    except ValueError:
        confined = {}
    found = []
    for line in lines[1:]:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("token") == token:
            found.append(record)
    return (confined if isinstance(confined, dict) else {}), found


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _raised(name: object) -> tuple[str, str]:
    text = str(name)
    return ("failed" if text == "AssertionError" else "error"), text


def classify(
    returncode: int, found: list[dict[str, Any]], timed_out: bool, judged: bool
) -> tuple[str, str | None, list[Any] | None]:
    """``(status, error, outputs)`` from the exit status and the harness's records. A judged run that
    sent all its outputs is ``returned`` (the judge compares them); outputs are decoded here, as data."""
    outputs: list[Any] | None = None
    if judged:
        outputs = []
        for r in found:
            if "out" in r:
                try:
                    outputs.append(sandbox_values.decode(str(r["out"])))
                except sandbox_values.NotData as exc:
                    return "failed", f"an output is not data ({exc})", outputs
        if any("end" in r for r in found):
            return "returned", None, outputs
    elif returncode == 0 and any("passed" in r for r in found):
        return "passed", None, None
    if timed_out:
        return "timeout", None, outputs
    # The relays report a signal as 128 + its number, like a shell.
    if returncode < 0 or returncode > 128:
        return "killed", _signal_name(-returncode if returncode < 0 else returncode - 128), outputs
    raised = [r["raised"] for r in found if "raised" in r]
    if raised:
        return (*_raised(raised[-1]), outputs)
    refused = [r["not_data"] for r in found if "not_data" in r]
    if refused:
        return "failed", f"an output is not data ({refused[-1]})", outputs
    if returncode == 0:
        return "exit", "exited with code 0 before its code ran to its end", outputs
    return "exit", f"exit code {returncode}", outputs


def isolation(
    outer: dict[str, Any], confined: dict[str, Any], budget: cgroups.Budget | None
) -> dict[str, object]:
    """What the kernel granted this run: the outer process's report, the program's (written before the
    program's code ran) and the cgroups it joined."""
    granted: dict[str, object] = {k: v for k, v in outer.items() if k not in ("init_pid", "cgroups")}
    granted.update(confined)
    joined = outer.get("cgroups") or []
    if budget is not None:
        granted.update(budget.isolation(list(joined)))
    else:
        granted.update(cgroup_memory=False, cgroup_pids=False, cgroup_kill=False)
    return granted
