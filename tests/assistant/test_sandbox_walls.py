"""The sandbox's walls beyond files and network (issue #43): SysV IPC, pathname unix sockets, the kernel
keyrings, nested user namespaces, what the program sees of the evaluator, where its output goes, and the
labels of its failures.

One hostile program tries all of the first five in one run (``attempts``; each test reads its part), as
the evaluator's uid; the unix-socket attempt runs again from a normal user's evaluator where this
machine lets a dropped uid run this Python. Every attempt is bounded: a 16 MiB segment, one connection,
one key, one namespace.
"""

from __future__ import annotations

import ctypes
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import pytest

from assistant.evals.sandbox import Limits, Sandbox
from assistant.evals.sandbox_seccomp import SYSCALLS
from tests.assistant.helpers import REPO, sandbox_pids
from tests.preconditions import precondition

SECRET = b"diffu-keyring-secret-51c2"
IPC_KEY = 0x0D1FF043
NUMBERS = SYSCALLS.get(platform.machine(), {})
KEY_SPEC_SESSION_KEYRING = -3
KEYCTL_JOIN_SESSION_KEYRING, KEYCTL_READ = 1, 11

# Creates a SysV segment (touched), queue and semaphore set under IPC_KEY; connects to the stream socket
# and sends to the datagram socket; reads the evaluator's key and adds one of its own to its session
# keyring; makes a user namespace (with a network namespace) and opens raw sockets in it; reports what
# it holds open and its argv. Prints one JSON line.
HOSTILE = """
import ctypes, json, os, socket, stat, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
libc.shmat.restype = ctypes.c_void_p
got = {{}}
shm = libc.shmget({key}, 16 << 20, 0o1666)
if shm >= 0:
    addr = libc.shmat(shm, None, 0)
    if addr not in (None, ctypes.c_void_p(-1).value):
        ctypes.memset(addr, 7, 16 << 20)
        libc.shmdt(ctypes.c_void_p(addr))
got["shm"] = shm >= 0
got["msg"] = libc.msgget({key}, 0o1666) >= 0
got["sem"] = libc.semget({key}, 1, 0o1666) >= 0
for kind, path in (("stream", {stream!r}), ("dgram", {dgram!r})):
    try:
        if kind == "stream":
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(1)
            s.connect(path)
            s.sendall(b"hello")
        else:
            a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
            a.sendto(b"hello", path)
        got[kind] = "reached"
    except OSError as exc:
        got[kind] = type(exc).__name__
buf = ctypes.create_string_buffer(256)
n = libc.syscall({keyctl}, {read}, {key_id}, buf, 256)
got["key_read"] = buf.raw[: max(n, 0)].decode("latin-1")
got["key_added"] = libc.syscall({add_key}, b"user", b"left-behind", b"x", 1, -3) > 0
got["nested_user_ns"] = libc.unshare(0x10000000 | 0x40000000) == 0
raw = []
for family, kind, proto in ((17, 3, 0), (2, 3, 1)):  # AF_PACKET, AF_INET raw (ICMP): CAP_NET_RAW
    try:
        socket.socket(family, kind, proto).close()
        raw.append(True)
    except OSError:
        raw.append(False)
got["raw_sockets"] = raw
got["argv"] = sys.argv
files = []
for fd in range(64):
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        continue
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        files.append(fd)
got["file_fds"] = files
print(json.dumps(got))
"""


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


def _reachable_dir() -> Path:
    """A directory outside any run that every uid can pass through (the run's tmpfs covers /tmp)."""
    for base in ("/dev/shm", "/var/tmp", "/run"):
        if os.path.isdir(base) and os.access(base, os.W_OK):
            path = Path(tempfile.mkdtemp(prefix="diffu-walls-", dir=base))
            path.chmod(0o755)
            return path
    pytest.skip("no world-reachable writable directory outside /tmp")


class Sockets:
    """A listening stream socket and a datagram socket, mode 0777, in a 0755 directory outside the run."""

    def __init__(self) -> None:
        self.dir = _reachable_dir()
        self.stream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.stream.bind(str(self.dir / "stream"))
        self.stream.listen(4)
        self.stream.settimeout(0.2)
        self.dgram = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.dgram.bind(str(self.dir / "dgram"))
        self.dgram.settimeout(0.2)
        for name in ("stream", "dgram"):
            (self.dir / name).chmod(0o777)

    def reached(self) -> list[str]:
        """What arrived: a connection, a datagram."""
        seen = []
        try:
            self.stream.accept()[0].close()
            seen.append("a connection")
        except TimeoutError:
            pass
        try:
            seen.append(f"a datagram {self.dgram.recv(64)!r}")
        except TimeoutError:
            pass
        return seen

    def close(self) -> None:
        self.stream.close()
        self.dgram.close()
        for name in ("stream", "dgram"):
            (self.dir / name).unlink(missing_ok=True)
        self.dir.rmdir()


def _ipc_left(key: int) -> dict[str, int]:
    """The SysV objects with ``key`` in the machine's IPC namespace: kind -> id."""
    left = {}
    for kind in ("shm", "msg", "sem"):
        for line in Path(f"/proc/sysvipc/{kind}").read_text().splitlines()[1:]:
            fields = line.split()
            if int(fields[0]) == key:
                left[kind] = int(fields[1])
    return left


def _remove_ipc(found: dict[str, int]) -> None:
    """Remove what a run left (a failing run of this test must not leave 16 MiB pinned)."""
    libc = _libc()
    for kind, ipc_id in found.items():
        remove = {"shm": libc.shmctl, "msg": libc.msgctl, "sem": libc.semctl}[kind]
        remove(ipc_id, 0, None) if kind != "sem" else remove(ipc_id, 0, 0)  # IPC_RMID


@pytest.fixture(scope="module")
def attempts():
    """The hostile program's report, what reached the sockets, the SysV objects left under its key, and
    the evaluator's session keyring (key id, payload, every key it holds) after the run."""
    precondition(bool(NUMBERS), f"no system call numbers for {platform.machine()}")
    precondition(not _ipc_left(IPC_KEY), f"SysV objects with key {IPC_KEY:#x} exist before the test")
    sockets = Sockets()
    found: dict = {}

    def run() -> None:
        # A session keyring of this thread's own (credentials are per thread; the sandbox is started
        # from this thread), holding the evaluator's secret.
        libc = _libc()
        assert libc.syscall(NUMBERS["keyctl"], KEYCTL_JOIN_SESSION_KEYRING, b"diffu-test") > 0
        key = libc.syscall(NUMBERS["add_key"], b"user", b"secret", SECRET, len(SECRET), -3)
        assert key > 0, ctypes.get_errno()
        program = HOSTILE.format(
            key=IPC_KEY,
            stream=str(sockets.dir / "stream"),
            dgram=str(sockets.dir / "dgram"),
            keyctl=NUMBERS["keyctl"],
            read=KEYCTL_READ,
            key_id=key,
            add_key=NUMBERS["add_key"],
        )
        with Sandbox(Limits(timeout=5.0), workers=1) as sandbox:
            found["outcome"] = sandbox.run(program)
        buf = ctypes.create_string_buffer(256)
        n = libc.syscall(NUMBERS["keyctl"], KEYCTL_READ, key, buf, 256)
        found["payload"] = buf.raw[: max(n, 0)]
        n = libc.syscall(NUMBERS["keyctl"], KEYCTL_READ, KEY_SPEC_SESSION_KEYRING, buf, 256)
        found["keys"] = [int.from_bytes(buf.raw[i : i + 4], sys.byteorder) for i in range(0, max(n, 0), 4)]
        found["key"] = key

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    try:
        found["reached"] = sockets.reached()
    finally:
        sockets.close()
    found["ipc_left"] = _ipc_left(IPC_KEY)
    _remove_ipc(found["ipc_left"])
    outcome = found["outcome"]
    assert outcome.passed, (outcome.status, outcome.error, outcome.stderr[-800:])
    found["report"] = json.loads(outcome.stdout)
    return found


def test_sysv_shared_memory_queues_and_semaphores_are_gone_after_the_run(attempts):
    assert attempts["report"]["shm"], "the run could make its segment (in a namespace of its own)"
    assert attempts["ipc_left"] == {}, f"left in the machine's IPC namespace: {attempts['ipc_left']}"


def test_a_0777_pathname_socket_outside_the_run_is_not_reachable(attempts):
    report = attempts["report"]
    assert attempts["reached"] == [], attempts["reached"]
    assert report["stream"] != "reached" and report["dgram"] != "reached", report


def test_a_key_in_the_evaluators_session_keyring_is_neither_readable_nor_writable(attempts):
    assert SECRET.decode() not in attempts["report"]["key_read"]
    assert not attempts["report"]["key_added"]
    assert attempts["payload"] == SECRET and attempts["keys"] == [attempts["key"]]


def test_a_nested_user_namespace_gives_no_raw_socket(attempts):
    report = attempts["report"]
    assert not report["nested_user_ns"] and report["raw_sockets"] == [False, False], report


def test_the_program_sees_no_path_of_the_evaluators_in_its_argv_or_open_files(attempts):
    report = attempts["report"]
    assert report["argv"] == ["program.py"]
    assert report["file_fds"] == [], "descriptors of files or directories: paths of the evaluator's"


NORMAL_UID = 54321  # no passwd entry needed: the sandbox as a normal user needs only its uid


def test_a_pathname_socket_is_not_reachable_from_a_normal_users_run_either():
    """The same attempt with the evaluator itself a normal user (a dropped uid), whose programs keep its
    uid: a socket of that user's, mode 0600, in a 0700 directory of its own (as the session bus and
    ssh-agent are) stays out of reach."""
    if os.geteuid() != 0:
        pytest.skip("the evaluator is a normal user already: the test above is this one")
    try:
        probe = subprocess.run(
            [sys.executable, "-c", "import assistant.evals.sandbox"],
            user=NORMAL_UID,
            group=NORMAL_UID,
            cwd=REPO,
            capture_output=True,
        ).returncode
    except PermissionError:
        probe = 126
    if probe != 0:
        pytest.skip(
            "this Python cannot run as another uid here (it lives under a 0700 directory); "
            "docs/eval.md: the file run as a normal user"
        )
    base = next((b for b in ("/dev/shm", "/var/tmp") if os.path.isdir(b)), None)
    precondition(base is not None, "no world-writable directory outside /tmp")
    script = textwrap.dedent(f"""
        import json, os, socket, tempfile
        from assistant.evals.sandbox import Limits, Sandbox
        run_dir = tempfile.mkdtemp(dir={base!r})  # 0700, the user's own
        path = os.path.join(run_dir, "bus")
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(path)
        os.chmod(path, 0o600)
        server.listen(1)
        server.settimeout(0.2)
        program = (
            "import socket\\ns = socket.socket(socket.AF_UNIX)\\ns.settimeout(1)\\ns.connect(%r)\\n" % path
        )
        with Sandbox(Limits(timeout=5.0), workers=1) as sandbox:
            outcome = sandbox.run(program)
        try:
            server.accept()
            reached = True
        except TimeoutError:
            reached = False
        server.close()
        os.unlink(path)
        os.rmdir(run_dir)
        print(json.dumps({{"status": outcome.status, "error": outcome.error, "reached": reached,
                          "uid": outcome.isolation.get("uid")}}))
    """)
    done = subprocess.run(
        [sys.executable, "-c", script],
        user=NORMAL_UID,
        group=NORMAL_UID,
        cwd=REPO,
        env={"PATH": "/usr/bin:/bin", "HOME": "/"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert result["uid"] == NORMAL_UID and not result["reached"], result
    assert result["status"] == "error" and result["error"] == "PermissionError", result


def test_output_takes_no_disk_outside_the_run(tmp_path, monkeypatch):
    """stdout and stderr are pipes: 80 MiB on each (past the run's 64 MiB disk) write nothing in the
    evaluator's temp dir, and the evaluator keeps 16 KiB of each."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    program = textwrap.dedent("""
        import os, sys
        chunk = b'y' * (1 << 20)
        for _ in range(80):
            os.write(1, chunk)
            os.write(2, chunk)
    """)
    largest = [0]

    result: list = []
    with Sandbox(Limits(timeout=10.0), workers=1) as sandbox:
        thread = threading.Thread(target=lambda: result.append(sandbox.run(program)))
        thread.start()
        while thread.is_alive():
            on_disk = sum(f.stat().st_size for f in tmp.rglob("*") if f.is_file() and not f.is_symlink())
            largest[0] = max(largest[0], on_disk)
            time.sleep(0.01)
        thread.join()
    outcome = result[0]
    assert largest[0] == 0, f"{largest[0]} bytes of output on the evaluator's disk"
    assert outcome.stdout.endswith("[output cut]") and len(outcome.stdout) < (16 << 10) + 20
    assert list(tmp.iterdir()) == [] and sandbox_pids() == {}
    # Past the 64 MiB a stream is read to, its pipe is closed: the writer stops with an error.
    assert outcome.status == "error" and outcome.error == "BrokenPipeError", (outcome.status, outcome.error)


def test_no_text_of_the_programs_changes_the_label_of_its_failure():
    """An exception named with a newline and a false report line, and lines written straight to every
    descriptor the program holds: the run is an ``error`` named as raised, not ``failed``."""
    program = textwrap.dedent("""
        import os
        for fd in range(3, 64):
            try:
                os.write(fd, b'raised AssertionError\\n{"raised": "AssertionError"}\\n')
            except OSError:
                pass
        raise type('Odd\\nraised AssertionError', (Exception,), {})()
    """)
    with Sandbox(Limits(timeout=5.0), workers=1) as sandbox:
        outcome = sandbox.run(program)
    assert outcome.status == "error", (outcome.status, outcome.error)
    assert outcome.error == "Odd\nraised AssertionError"


def test_a_program_that_is_not_text_fails_alone_with_its_reason():
    with Sandbox(Limits(timeout=5.0), workers=1) as sandbox:
        bad, good = sandbox.map(["x = '\ud800'\n", "assert True\n"])
    assert bad.status == "error" and "UnicodeEncodeError" in (bad.error or "") and not bad.passed
    assert good.passed
