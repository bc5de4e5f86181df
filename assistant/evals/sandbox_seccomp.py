"""The sandboxed program's seccomp filter: the few system calls its other walls leave open, refused.

Part of the sandbox's child (``sandbox_child.py`` loads it by path, before any confinement): the standard
library and ctypes only. A classic BPF program, installed with ``prctl(PR_SET_SECCOMP)`` after
``no_new_privs``, refuses (inherited by every process the program starts, and never removable):

- ``socket(AF_UNIX, ...)``: a pathname unix socket is reached by ``connect``/``sendto``, which neither the
  network namespace nor Landlock (up to ABI 7) covers; without a socket of its own the program cannot
  reach the session bus, ssh-agent or any world-writable socket. ``socketpair(AF_UNIX, SOCK_DGRAM)`` too
  (a datagram socket of a pair may still ``sendto`` a path); stream pairs (multiprocessing, asyncio) stay;
- ``unshare`` and ``clone`` with ``CLONE_NEWUSER``, and ``clone3`` (its flags are out of a filter's reach;
  ENOSYS makes the C library fall back to ``clone``): a nested user namespace would give the program every
  capability there (raw sockets, netfilter: kernel attack surface);
- ``keyctl``, ``add_key``, ``request_key``: the kernel keyrings are shared with the evaluator's session and
  uid;
- ``io_uring_*``: its operations open sockets and more without passing through these checks;
- any call of another architecture's numbering (x86-64's x32 calls, 32-bit ``int 0x80``), whose numbers
  the checks above would not match.

x86-64 and arm64 are known; elsewhere ``install`` returns False and the run's isolation says so.
"""

from __future__ import annotations

import ctypes
import errno
import platform

PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
RET_ALLOW = 0x7FFF0000
RET_ERRNO = 0x00050000
AF_UNIX = 1
SOCK_DGRAM = 2
SOCK_TYPE_MASK = 0xF  # SOCK_NONBLOCK and SOCK_CLOEXEC ride in the same argument
CLONE_NEWUSER = 0x10000000
X32_SYSCALL_BIT = 0x40000000

# seccomp_data: nr (int) at 0, arch (u32) at 4, instruction pointer at 8, args[6] (u64) from 16; the low
# half of an argument first on these little-endian machines.
NR, ARCH = 0, 4


def arg(i: int) -> int:
    return 16 + 8 * i


SYSCALLS = {
    "x86_64": dict(
        arch=0xC000003E,
        socket=41,
        socketpair=53,
        clone=56,
        unshare=272,
        clone3=435,
        keyctl=250,
        add_key=248,
        request_key=249,
        io_uring_setup=425,
        io_uring_enter=426,
        io_uring_register=427,
    ),
    "aarch64": dict(
        arch=0xC00000B7,
        socket=198,
        socketpair=199,
        clone=220,
        unshare=97,
        clone3=435,
        keyctl=219,
        add_key=217,
        request_key=218,
        io_uring_setup=425,
        io_uring_enter=426,
        io_uring_register=427,
    ),
}

# classic BPF opcodes
LD_W_ABS = 0x20
ALU_AND_K = 0x54
JEQ_K = 0x15
JGE_K = 0x35
JSET_K = 0x45
RET_K = 0x06


class _Filter(ctypes.Structure):
    _fields_ = [
        ("code", ctypes.c_ushort),
        ("jt", ctypes.c_ubyte),
        ("jf", ctypes.c_ubyte),
        ("k", ctypes.c_uint),
    ]


class _Program(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_Filter))]


class _Assembler:
    """Instructions with forward jumps to labels, resolved into BPF's relative offsets."""

    def __init__(self) -> None:
        self.code: list[tuple[int, object, object, int]] = []
        self.labels: dict[str, int] = {}

    def op(self, code: int, k: int, jt: object = 0, jf: object = 0) -> None:
        self.code.append((code, jt, jf, k))

    def label(self, name: str) -> None:
        self.labels[name] = len(self.code)

    def ret(self, value: int) -> None:
        self.op(RET_K, value)

    def build(self) -> list[tuple[int, int, int, int]]:
        def offset(at: int, target: object) -> int:
            if isinstance(target, int):
                return target
            jump = self.labels[str(target)] - at - 1
            assert 0 <= jump < 256, "classic BPF jumps forward, at most 255 instructions"
            return jump

        return [(c, offset(i, jt), offset(i, jf), k) for i, (c, jt, jf, k) in enumerate(self.code)]


def program(numbers: dict[str, int], x86: bool) -> list[tuple[int, int, int, int]]:
    """The filter for one architecture's numbers: (code, jt, jf, k) per instruction."""
    eperm, enosys = RET_ERRNO | errno.EPERM, RET_ERRNO | errno.ENOSYS
    a = _Assembler()
    a.op(LD_W_ABS, ARCH)
    a.op(JEQ_K, numbers["arch"], jt=1)
    a.ret(enosys)  # another architecture's calling convention
    a.op(LD_W_ABS, NR)
    if x86:
        a.op(JGE_K, X32_SYSCALL_BIT, jt="eperm")
    for name in ("keyctl", "add_key", "request_key"):
        a.op(JEQ_K, numbers[name], jt="eperm")
    for name in ("clone3", "io_uring_setup", "io_uring_enter", "io_uring_register"):
        a.op(JEQ_K, numbers[name], jt="enosys")
    a.op(JEQ_K, numbers["unshare"], jt="flags")
    a.op(JEQ_K, numbers["clone"], jt="flags")
    a.op(JEQ_K, numbers["socket"], jt="socket")
    a.op(JEQ_K, numbers["socketpair"], jt="socketpair")
    a.ret(RET_ALLOW)
    a.label("flags")  # unshare(flags) and clone(flags, ...): no new user namespace
    a.op(LD_W_ABS, arg(0))
    a.op(JSET_K, CLONE_NEWUSER, jt="eperm")
    a.ret(RET_ALLOW)
    a.label("socket")
    a.op(LD_W_ABS, arg(0))
    a.op(JEQ_K, AF_UNIX, jt="eperm")
    a.ret(RET_ALLOW)
    a.label("socketpair")
    a.op(LD_W_ABS, arg(0))
    a.op(JEQ_K, AF_UNIX, jf="allow")
    a.op(LD_W_ABS, arg(1))
    a.op(ALU_AND_K, SOCK_TYPE_MASK)
    a.op(JEQ_K, SOCK_DGRAM, jt="eperm")
    a.label("allow")
    a.ret(RET_ALLOW)
    a.label("eperm")
    a.ret(eperm)
    a.label("enosys")
    a.ret(enosys)
    return a.build()


def install(libc: ctypes.CDLL) -> bool:
    """Install the filter on this process (and all it will start); False where this machine's
    architecture is not known or the kernel refuses."""
    numbers = SYSCALLS.get(platform.machine())
    if numbers is None:
        return False
    code = program(numbers, x86=platform.machine() == "x86_64")
    filters = (_Filter * len(code))(*(_Filter(c, jt, jf, k) for c, jt, jf, k in code))
    prog = _Program(len(code), ctypes.cast(filters, ctypes.POINTER(_Filter)))
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        return False
    return libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) == 0
