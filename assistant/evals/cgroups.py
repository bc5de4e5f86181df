"""Whole-sandbox budgets from Linux control groups: memory and processes counted for a run's processes
together, and a kill that reaches every one of them.

Where the kernel and the evaluator's rights allow, each sandboxed run gets cgroups of its own, made
before the run and removed after it; the run's first process joins them, so everything it starts is
counted:

- cgroup v2 (the unified hierarchy): a child of the hierarchy's root, or failing that of the
  evaluator's own cgroup (a delegated one, as systemd gives a user's services), with ``memory.max``
  (swap off) and ``pids.max`` where those controllers are enabled there, and ``cgroup.kill`` in any case;
- cgroup v1 (a hybrid system mounts ``memory`` and ``pids`` as hierarchies of their own): a child of the
  evaluator's own cgroup in each, with ``memory.limit_in_bytes`` (and ``memory.memsw.limit_in_bytes``)
  and ``pids.max``.

Without cgroups (a normal user outside a delegated one, a read-only ``/sys/fs/cgroup``) the sandbox's
per-process limits (``RLIMIT_AS``, ``RLIMIT_NPROC``) are what bounds a run; ``Budget.granted`` says
which applies, and the run's ``isolation`` reports it.
"""

from __future__ import annotations

import itertools
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("diffu.sandbox")

_names = itertools.count()


@dataclass(frozen=True)
class Hierarchy:
    """A place where run cgroups can be made: ``version`` 1 or 2, the parent directory, and (v1) the
    controllers this hierarchy holds."""

    version: int
    base: Path
    controllers: frozenset[str] = frozenset()


def _mounts() -> list[tuple[str, str, str, set[str]]]:
    """``(root, mount point, fstype, super options)`` of each cgroup mount in /proc/self/mountinfo."""
    found = []
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        head, sep, tail = line.partition(" - ")
        fields, rest = head.split(), tail.split()
        if not sep or len(fields) < 5 or len(rest) < 3 or rest[0] not in ("cgroup", "cgroup2"):
            continue
        found.append((fields[3], fields[4], rest[0], set(rest[2].split(","))))
    return found


def _own_paths() -> dict[str, str]:
    """This process's cgroup per hierarchy: ``""`` for v2, else each v1 controller's name."""
    paths: dict[str, str] = {}
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return {}
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        for name in parts[1].split(",") if parts[1] else [""]:
            paths[name] = parts[2]
    return paths


def _below(mount_root: str, mount_point: str, own: str) -> Path | None:
    """The directory of cgroup ``own`` under a mount of the hierarchy's ``mount_root`` (a container
    may see only part of the hierarchy)."""
    if mount_root != "/" and own != mount_root and not own.startswith(mount_root.rstrip("/") + "/"):
        return None
    rel = own[len(mount_root) :] if mount_root != "/" else own
    return Path(mount_point + "/" + rel.strip("/")) if rel.strip("/") else Path(mount_point)


def _writable(path: Path) -> bool:
    return path.is_dir() and os.access(path, os.W_OK)


def find() -> list[Hierarchy]:
    """The hierarchies where this process may make cgroups for its runs (possibly none)."""
    own = _own_paths()
    found: list[Hierarchy] = []
    for root, point, fstype, options in _mounts():
        if fstype == "cgroup2" and "" in own:
            candidates = [Path(point), _below(root, point, own[""])]
            # The hierarchy's root first: there the memory and pids controllers are usually enabled
            # for children; a populated cgroup below it cannot enable them for its own.
            for base in dict.fromkeys(c for c in candidates if c is not None):
                if _writable(base) and (base / "cgroup.subtree_control").exists():
                    found.append(Hierarchy(2, base))
                    break
        elif fstype == "cgroup":
            held = frozenset(options & {"memory", "pids"})
            name = next(iter(held), None)
            if name is None or name not in own:
                continue
            below = _below(root, point, own[name])
            if below is not None and _writable(below):
                found.append(Hierarchy(1, below, held))
    return found


def _set(path: Path, value: int | str) -> bool:
    try:
        path.write_text(str(value))
        return True
    except OSError:
        return False


@dataclass
class Budget:
    """One run's cgroups: made by ``__init__``, joined by the run's first process (``procs``), emptied
    with ``kill`` and removed with ``remove``."""

    hierarchies: list[Hierarchy]
    memory_bytes: int
    processes: int
    dirs: list[Path] = field(default_factory=list)
    granted: dict[str, Path] = field(default_factory=dict)  # "memory" / "pids" / "kill" -> its cgroup

    def __post_init__(self) -> None:
        name = f"diffu-sandbox-{os.getpid()}-{next(_names)}"
        for h in self.hierarchies:
            path = h.base / name
            try:
                path.mkdir()
            except OSError:
                continue
            self.dirs.append(path)
            if h.version == 2:
                controllers = set((path / "cgroup.controllers").read_text().split())
                if "memory" in controllers and _set(path / "memory.max", self.memory_bytes):
                    _set(path / "memory.swap.max", 0)  # absent without swap accounting
                    self.granted["memory"] = path
                if "pids" in controllers and _set(path / "pids.max", self.processes):
                    self.granted["pids"] = path
                if (path / "cgroup.kill").exists():
                    self.granted["kill"] = path
            else:
                if "memory" in h.controllers and _set(path / "memory.limit_in_bytes", self.memory_bytes):
                    _set(path / "memory.memsw.limit_in_bytes", self.memory_bytes)
                    self.granted["memory"] = path
                if "pids" in h.controllers and _set(path / "pids.max", self.processes):
                    self.granted["pids"] = path

    @property
    def procs(self) -> list[str]:
        """The ``cgroup.procs`` files the run's first process writes its pid to."""
        return [str(d / "cgroup.procs") for d in self.dirs]

    def isolation(self, joined: list[str]) -> dict[str, bool]:
        """What the run got, given the ``cgroup.procs`` files its first process did join."""
        return {
            f"cgroup_{what}": what in self.granted and str(self.granted[what] / "cgroup.procs") in joined
            for what in ("memory", "pids", "kill")
        }

    def kill(self) -> None:
        """SIGKILL every process in the run's v2 cgroup (wherever it moved in its namespaces)."""
        path = self.granted.get("kill")
        if path is not None:
            _set(path / "cgroup.kill", 1)

    def remove(self, timeout: float = 5.0) -> str | None:
        """Remove the run's cgroups once their processes are gone; never raises. None, or what was left."""
        deadline = time.monotonic() + timeout
        left = []
        for path in self.dirs:
            while True:
                try:
                    path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError as exc:
                    # Busy while the last killed processes exit; bounded.
                    if time.monotonic() > deadline:
                        left.append(f"{path} ({exc.strerror})")
                        break
                    time.sleep(0.01)
        return f"could not remove cgroup {', '.join(left)}" if left else None
