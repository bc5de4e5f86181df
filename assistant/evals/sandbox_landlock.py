"""The sandboxed program's Landlock ruleset: what it may read, write and execute, and (where the kernel
has the ABI for it) no TCP bind or connect and no signal to a process outside the sandbox.

Part of the sandbox's child (``sandbox_child.py`` loads it by path, before any confinement): the standard
library only, like the child.
"""

from __future__ import annotations

import ctypes
import os

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
