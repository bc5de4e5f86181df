"""The sandbox's first process: confine itself, then run one untrusted program (stdlib only, run by path).

``assistant.evals.sandbox`` starts ``python -I sandbox_child.py CONFIG_JSON`` in a new session with a scrubbed
environment, in a fresh temporary directory. Before the program's first line runs, this process, still
single-threaded:

1. leaves the machine's namespaces where the kernel lets it: a new user namespace (so the process-count
   limit applies even to root, whose processes are otherwise exempt), a new network namespace (only a
   loopback device that is down: no socket reaches anything) and a new PID namespace (its first child is
   PID 1 there; when that process dies the kernel kills everything else in the namespace);
2. sets resource limits: CPU seconds, address space, file size, processes, open files;
3. applies a Landlock ruleset: read and execute under the Python installation and the system library
   directories, read and write in the working directory only, no TCP bind or connect, no signals to
   processes outside the sandbox (Landlock ABI 6);
4. reports what it achieved as one JSON line on the status pipe and closes it, so the program cannot
   forge that report.

Everything is irreversible for the program: namespaces cannot be left, hard limits cannot be raised
without privileges the new user namespace does not have on the machine, and a Landlock domain can only
be narrowed. The program's exit status is the verdict; an uncaught exception is reported on stderr's
last line as ``diffu-sandbox-error: TypeName`` (the parent uses it for the error kind only).
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import sys
import traceback

CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
CLONE_NEWPID = 0x20000000

# Landlock (linux/landlock.h). x86-64 and arm64 share these generic syscall numbers.
SYS_LANDLOCK_CREATE_RULESET = 444
SYS_LANDLOCK_ADD_RULE = 445
SYS_LANDLOCK_RESTRICT_SELF = 446
LANDLOCK_CREATE_RULESET_VERSION = 1
LANDLOCK_RULE_PATH_BENEATH = 1
PR_SET_NO_NEW_PRIVS = 38

FS_EXECUTE = 1 << 0
FS_WRITE_FILE = 1 << 1
FS_READ_FILE = 1 << 2
FS_READ_DIR = 1 << 3
FS_TRUNCATE = 1 << 14
FS_IOCTL_DEV = 1 << 15
# Rights valid on a single file (the others only make sense on directories).
FILE_RIGHTS = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV
NET_BIND_TCP = 1 << 0
NET_CONNECT_TCP = 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0
SCOPE_SIGNAL = 1 << 1

READ_ONLY_DIRS = ("/usr", "/lib", "/lib64", "/lib32", "/bin")
READ_ONLY_FILES = ("/etc/ld.so.cache", "/etc/localtime", "/dev/urandom", "/dev/random", "/dev/zero")
READ_WRITE_FILES = ("/dev/null",)


class _RulesetAttr(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _unshare(libc: ctypes.CDLL, flags: int) -> bool:
    return libc.unshare(ctypes.c_int(flags)) == 0


def enter_namespaces(libc: ctypes.CDLL) -> dict[str, bool]:
    """The strongest combination the kernel allows: all three at once, else network and PID alone."""
    if _unshare(libc, CLONE_NEWUSER | CLONE_NEWNET | CLONE_NEWPID):
        return {"user_ns": True, "net_ns": True, "pid_ns": True}
    got = {"user_ns": _unshare(libc, CLONE_NEWUSER)}
    got["net_ns"] = _unshare(libc, CLONE_NEWNET)
    got["pid_ns"] = _unshare(libc, CLONE_NEWPID)
    return got


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


def landlock(libc: ctypes.CDLL, workdir: str, read_dirs: list[str]) -> int:
    """Confine the filesystem (and, where supported, TCP and signals); returns the ABI used, 0 if none."""
    syscall = libc.syscall
    syscall.restype = ctypes.c_long
    abi = syscall(
        ctypes.c_long(SYS_LANDLOCK_CREATE_RULESET),
        None,
        ctypes.c_size_t(0),
        ctypes.c_uint32(LANDLOCK_CREATE_RULESET_VERSION),
    )
    if abi < 1:
        return 0
    handled_fs = (1 << 13) - 1  # ABI 1: execute .. make_sym
    if abi >= 2:
        handled_fs |= 1 << 13  # refer
    if abi >= 3:
        handled_fs |= FS_TRUNCATE
    if abi >= 5:
        handled_fs |= FS_IOCTL_DEV
    attr = _RulesetAttr(handled_fs, 0, 0)
    size = 8
    if abi >= 4:
        attr.handled_access_net = NET_BIND_TCP | NET_CONNECT_TCP  # handled and never allowed
        size = 16
    if abi >= 6:
        attr.scoped = SCOPE_SIGNAL | SCOPE_ABSTRACT_UNIX_SOCKET
        size = 24
    fd = syscall(
        ctypes.c_long(SYS_LANDLOCK_CREATE_RULESET),
        ctypes.byref(attr),
        ctypes.c_size_t(size),
        ctypes.c_uint32(0),
    )
    if fd < 0:
        return 0
    read_only = FS_EXECUTE | FS_READ_FILE | FS_READ_DIR

    def allow(path: str, access: int) -> None:
        try:
            pfd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            return  # a directory this system lacks
        try:
            if not os.path.isdir(path):
                access &= FILE_RIGHTS
            rule = _PathBeneath(access & handled_fs, pfd)
            syscall(
                ctypes.c_long(SYS_LANDLOCK_ADD_RULE),
                ctypes.c_int(fd),
                ctypes.c_int(LANDLOCK_RULE_PATH_BENEATH),
                ctypes.byref(rule),
                ctypes.c_uint32(0),
            )
        finally:
            os.close(pfd)

    for path in [*READ_ONLY_DIRS, *read_dirs, *READ_ONLY_FILES]:
        allow(path, read_only)
    for path in READ_WRITE_FILES:
        allow(path, FS_READ_FILE | FS_WRITE_FILE | FS_TRUNCATE)
    allow(workdir, handled_fs)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        os.close(fd)
        return 0
    ok = syscall(ctypes.c_long(SYS_LANDLOCK_RESTRICT_SELF), ctypes.c_int(fd), ctypes.c_uint32(0)) == 0
    os.close(fd)
    return int(abi) if ok else 0


def run_program(path: str) -> None:
    """Run the program as ``__main__``; never returns."""
    with open(path, encoding="utf-8") as f:
        source = f.read()
    code = 0
    try:
        exec(compile(source, "program.py", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException as exc:  # the program's own failure: report its kind, exit 1
        traceback.print_exc()
        print(f"diffu-sandbox-error: {type(exc).__name__}", file=sys.stderr)
        code = 1
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except Exception:
        pass
    os._exit(code)


def main() -> None:
    config = json.loads(sys.argv[1])
    status_fd = int(config["status_fd"])
    libc = _libc()
    report: dict[str, object] = dict(enter_namespaces(libc))
    set_limits(config["limits"])
    report["landlock_abi"] = landlock(libc, config["workdir"], config["read_dirs"])
    os.chdir(config["workdir"])
    with os.fdopen(status_fd, "w") as status:
        status.write(json.dumps(report) + "\n")
    if report["pid_ns"]:
        # The first child of a new PID namespace is its PID 1; when it exits every other process in
        # the namespace is killed by the kernel. This process only relays its exit status.
        pid = os.fork()
        if pid:
            _, wait_status = os.waitpid(pid, 0)
            if os.WIFSIGNALED(wait_status):
                os._exit(128 + os.WTERMSIG(wait_status))
            os._exit(os.WEXITSTATUS(wait_status))
    run_program(config["program"])


if __name__ == "__main__":
    main()
