"""Helpers for daemon tests: isolated diffu directories and real ``diffu serve`` subprocesses.

Every daemon runs with its own config/runtime/log directories (``DIFFU_*_DIR``), so tests never touch the
user's token, discovery files or logs, and never see a daemon they did not start. Daemons are
session-scoped where tests can share them: starting one on the tiny checkpoint costs a JAX import plus
compiling its buckets.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]

# Shapes the tiny-checkpoint daemon compiles: one length bucket (the context), batches of 1, 4 and 16.
TINY_ENV = {"DIFFU_LENGTH_BUCKETS": "128", "DIFFU_BATCH_BUCKETS": "1,4,16", "DIFFU_MAX_CONTEXT": "128"}

# An even smaller model than the runtime tests' tiny one: on a 2-core CPU a denoising step of the
# 64-wide model is compute-bound, so a batch of 16 costs nearly 16 single steps and batching could not
# show; at this size a step is mostly fixed overhead, as it is for a real model on an accelerator.
MICRO_MODEL = {
    "vocab": 300,
    "hidden_size": 16,
    "intermediate_size": 32,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "num_hidden_layers": 1,
}


# The suite's own settings (tests/conftest.py), which every process of a test run keeps.
SUITE_SETTINGS = ("DIFFU_JAX_CACHE_DIR", "DIFFU_CODE_EXECUTED_MARKER", "DIFFU_ROW_BUCKETS")


def isolated_env(root: Path, **extra: str) -> dict[str, str]:
    """Environment for a daemon or client confined to ``root``; no inherited DIFFU_* settings leak in
    but the suite's own (:data:`SUITE_SETTINGS`)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DIFFU_") or k in SUITE_SETTINGS}
    env.update(
        DIFFU_CONFIG_DIR=str(root / "config"),
        DIFFU_RUNTIME_DIR=str(root / "run"),
        DIFFU_LOG_DIR=str(root / "log"),
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


@dataclass
class DaemonProcess:
    """A ``diffu serve`` subprocess on a free port, with its URL and token."""

    proc: subprocess.Popen[str]
    url: str
    root: Path
    env: dict[str, str]
    health_seen: list[tuple[int, str]] = field(default_factory=list)

    @property
    def token(self) -> str:
        return (self.root / "config" / "token").read_text().strip()

    @property
    def headers(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.token}"}

    def client(self, **kwargs: object) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=self.headers, timeout=60.0, **kwargs)  # type: ignore[arg-type]

    def wait_ready(self, timeout: float = 180.0, *, warm: bool = True) -> None:
        """Follow /health?stream=1 until it serves, recording each status seen; with ``warm``, then until
        its warm-up is over too (stage ready), so tests that time requests time no compile."""
        with httpx.stream("GET", self.url + "/health", params={"stream": "1"}, timeout=timeout) as response:
            for line in response.iter_lines():
                if line.startswith("data: "):
                    data = json.loads(line[6:])
                    self.health_seen.append((200 if data["status"] == "ok" else 503, data["status"]))
                    if data["status"] == "failed":
                        raise RuntimeError(f"daemon failed to load: {data}")
                    if data["status"] == "ok":
                        break
            else:
                raise RuntimeError("health stream ended before ready")
        if warm:
            self.wait_warmed(timeout)

    def wait_warmed(self, timeout: float = 180.0) -> None:
        """Wait until the daemon's warm-up has nothing left to compile (stage "ready", not "warming"): its
        generic plan, and whatever a client queued since (``POST /v1/diffu/warm``)."""
        if not wait_until(lambda: self.health()["stage"] == "ready", timeout, interval=0.2):
            raise RuntimeError(f"the warm-up did not end within {timeout:.0f}s: {self.health()}")

    def health(self) -> dict[str, object]:
        return httpx.get(self.url + "/health", timeout=10).json()

    def stop(self, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()  # a test daemon that ignores SIGTERM is a bug the test run should survive
                self.proc.wait()
        return self.proc.returncode

    def log_text(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in (self.root / "log").glob("*.log"))


def start_daemon(
    root: Path, model: str, *args: str, env: dict[str, str] | None = None, wait: bool = True
) -> DaemonProcess:
    """Run ``diffu serve --model MODEL --port 0 ARGS`` and return once it prints its URL (and is ready)."""
    root.mkdir(parents=True, exist_ok=True)
    env = env or isolated_env(root)
    proc = subprocess.Popen(
        [sys.executable, "-m", "assistant.cli", "serve", "--model", model, "--port", "0", *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=open(root / "stderr.txt", "w"),
        text=True,
    )  # noqa: SIM115
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if "listening on" not in line:
        proc.wait(10)
        raise RuntimeError(f"daemon did not start: {line!r}\n{(root / 'stderr.txt').read_text()}")
    url = line.split("listening on ", 1)[1].split()[0]
    daemon = DaemonProcess(proc, url, root, env)
    # The first plain /health answer, taken before anything waits: the model cannot be loaded yet.
    response = httpx.get(url + "/health", timeout=10)
    daemon.health_seen.append((response.status_code, response.json()["status"]))
    if wait:
        daemon.wait_ready()
    return daemon


def stop_background_daemons(root: Path) -> None:
    """Test cleanup: SIGTERM every daemon whose discovery file is under ``root`` and wait for it. One still
    running 30 s later is killed, with a warning that quotes the end of its log (one such daemon outlived a
    run of the suite, its log gone with the test's directory)."""
    from assistant.client.spawn import tail_lines, wait_exit

    for path in (root / "run").glob("*.json"):
        try:
            pid = json.loads(path.read_text())["pid"]
            os.kill(pid, signal.SIGTERM)
        except (OSError, ValueError, KeyError):
            continue
        if not wait_exit(pid, 30):
            logs = "\n".join(tail_lines(log, 20) for log in sorted((root / "log").glob("*")) if log.is_file())
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
            message = f"daemon {pid} ignored SIGTERM for 30 s and was killed; its log ends:\n{logs}"
            warnings.warn(message, stacklevel=2)


def run_cli_opening_gate(
    args: list[str], env: dict[str, str], gate: Path, when: Callable[[str], bool], timeout: float = 60
) -> tuple[int, list[str], str, str]:
    """Run ``diffu *args`` on a fake model with ``load_gate=gate``: read its stderr line by line until
    ``when(line)`` (the stage the test must see while the model loads), then create the gate so the load
    finishes, however slowly this machine runs. Returns the exit code, the stderr lines read before the
    gate opened, stdout and the rest of stderr."""
    try:
        with subprocess.Popen(
            [sys.executable, "-m", "assistant.cli", *args],
            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        ) as proc:  # fmt: skip
            assert proc.stderr is not None
            shown = [proc.stderr.readline()]
            while shown[-1] and not when(shown[-1]):
                shown.append(proc.stderr.readline())
            gate.touch()
            out, err = proc.communicate(timeout=timeout)
    finally:
        gate.touch()
    return proc.returncode, shown, out, err


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0, interval: float = 0.05) -> bool:
    """For tests only: wait for an outside process's state to change (nothing to subscribe to)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def sandbox_processes() -> list[str]:
    """``ps`` lines of sandboxed programs still running that this test process started.

    A sandboxed run's command line ends with the evaluator's pid (``sandbox_child.py FD PID``); under
    pytest-xdist every worker is a process of its own, so one worker's count never sees another
    worker's programs.
    """
    out = subprocess.run(["ps", "-eww", "-o", "pid,args"], capture_output=True, text=True).stdout
    mine = "sandbox_child.py "
    return [line for line in out.splitlines() if mine in line and line.rsplit(" ", 1)[-1] == str(os.getpid())]


def sandbox_pids() -> dict[int, str]:
    """The running sandbox processes of ``sandbox_processes``, by pid, each with its start time."""
    found = {}
    for line in sandbox_processes():
        pid = int(line.split()[0])
        start = process_start(pid)
        if start is not None:
            found[pid] = start
    return found


def process_start(pid: int) -> str | None:
    """The start time of process ``pid`` (/proc/PID/stat's 22nd field), None when there is no such
    process: with the pid it names one process, even after the pid is reused."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def virtual_devices_env(n: int) -> dict[str, str]:
    """Environment entries for a subprocess whose JAX sees ``n`` virtual CPU devices; the suite's own
    XLA_FLAGS (tests/conftest.py) stay in front.

    The n devices' programs share this machine's two cores with the other test worker, so one can reach
    a collective long after the others: XLA:CPU ends the process when a participant is 40 s late (seen
    once in CI, an all-reduce of the dp x tp RL test), so the wait is allowed five minutes."""
    flags = os.environ.get("XLA_FLAGS", "")
    flags += f" --xla_force_host_platform_device_count={n}"
    flags += " --xla_cpu_collective_call_terminate_timeout_seconds=300"
    flags += " --xla_cpu_collective_call_warn_stuck_timeout_seconds=60"
    return {"XLA_FLAGS": flags, "JAX_PLATFORMS": "cpu"}
