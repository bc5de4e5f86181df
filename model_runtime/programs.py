"""The runtime's compiled programs: lowered and compiled ahead of time per shape bucket, kept in memory.

The cache knows no decoder: each decoder (``model_runtime/decoders/``) keys its programs by what makes
them a different XLA program (their kind, the (batch, length) bucket, its static spec) and hands over the
jitted kernels and the abstract arguments to build them with (``programs``). Compiling is timed and
counted against JAX's persistent compilation cache (``compile_cache``), so a restart reports which
programs it found there.

The cache is bounded. Request values never reach a key directly: what would change a shape is traced
(``top_k``, ``alg_temp``, ``temperature``, ...) or drawn from a small fixed set (buckets, top-k widths,
block lengths; ``params.py`` refuses other values), so the keys a daemon can see are a finite set. As
the last line of defence the cache keeps at most ``max_programs`` programs and evicts the least recently
used one; evicting also clears JAX's own tracing and compilation caches, which would otherwise keep the
evicted program's executable alive.

The cache is bounded in bytes too, since a count alone bounds nothing a machine can hold (64 programs of
a 7B model's size were a 28 GB ceiling on a 24 GB machine): a program's cost is measured as the growth of
the process's resident memory while it was built (XLA reports no host code size on CPU; the first build,
which also starts the compiler, is left out, and the growth includes the compiler's scratch memory, so it
errs high), and the programs held together cost at most ``max_bytes``, by default half the memory the
machine had available when the cache was made (``MemAvailable``); past it the least recently used go
(never the two newest: the fast decoder runs a pair). ``info()`` reports the bounds, what is held and the
memory ceiling they imply (the daemon's ``/v1/diffu/status``): what the process holds now plus the room
the bounds leave for more programs, which the machine's memory bounds in turn.
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, ItemsView, Mapping, Sequence
from typing import Any, NamedTuple

import jax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from model_runtime import compile_cache
from model_runtime.config import DreamConfig
from model_runtime.errors import InputError
from model_runtime.inflight import InFlight
from model_runtime.interface import CompileReport
from model_runtime.memory import resident_bytes
from model_runtime.params import DEFAULT_MAX_PROGRAMS
from model_runtime.placement import Placed

Program = Callable[..., Any]
Jitted = Any  # a ``jax.jit`` of a decoder's kernel: ``.lower(...)`` makes its program for abstract arguments


class Built(NamedTuple):
    """A program and what getting it cost: compile seconds, fresh compiles, persistent-cache hits (all
    zero when it was already in memory)."""

    program: Program
    seconds: float
    compiled: int
    hits: int


# Row counts the reference sampler may gather: the smallest that holds a step's masks is used
# (``kernels._sample_masked``).
ROW_BUCKETS = (8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536)
# Replaces them for a process (read when a ProgramCache is made; ``loader.load`` checks it up front).
ROW_BUCKETS_ENV = "DIFFU_ROW_BUCKETS"


def row_buckets() -> tuple[int, ...]:
    """The row counts this process's reference programs gather: :data:`ROW_BUCKETS`, or those
    ``DIFFU_ROW_BUCKETS`` lists (comma-separated; empty: none, every step runs ``lm_head`` and the
    sampler on the whole window).

    Every size below a program's window is one more branch of its ``lax.switch``, compiled with the
    program: a tiny model's reference programs compile in about half the time with one size (``8``)
    than with the 7 the default has below a 64-token window, and late steps then compute more rows than
    they need. No size changes a result (``tests/model_runtime/test_row_buckets.py``)."""
    raw = os.environ.get(ROW_BUCKETS_ENV)
    if raw is None:
        return ROW_BUCKETS
    try:
        sizes = sorted({int(part) for part in raw.split(",") if part.strip()})
    except ValueError:
        sizes = [0]
    if sizes and sizes[0] < 1:
        raise InputError(
            f"{ROW_BUCKETS_ENV}={raw!r}: expected comma-separated row counts of at least 1 (e.g. 8,32,128), "
            "or nothing for no gathering",
            field=ROW_BUCKETS_ENV,
        )
    return tuple(sizes)


class ProgramCache:
    """Compiled programs of one model's parameters (``graphdef``/``state``) on one device or mesh."""

    def __init__(
        self,
        cfg: DreamConfig,
        graphdef: nnx.GraphDef,
        state: nnx.State,
        dtype: str,
        mesh: Mesh | None,
        max_programs: int = DEFAULT_MAX_PROGRAMS,
        max_bytes: int | None = None,
    ) -> None:
        if max_programs < 2:
            # The fast decoder needs its refresh and block programs at once.
            raise ValueError(f"max_programs: must be >= 2, got {max_programs}")
        self.max_programs = max_programs
        self.max_bytes = max_bytes if max_bytes is not None else default_max_bytes()
        # The row counts the reference programs gather (DIFFU_ROW_BUCKETS), read once, with the cache: a
        # static of those programs, so a later change of the variable never mixes two ladders in one cache.
        self.row_buckets = row_buckets()
        self.compiled = 0  # programs built since start (fresh or from the persistent cache)
        self.evicted = 0
        self.largest_bytes = 0  # the most resident memory one build added (the first one left out)
        self._costs: dict[tuple[Any, ...], int] = {}  # each held program's build cost, in bytes
        # The scheduler thread compiles; status requests read from the event loop's thread.
        self._lock = threading.Lock()
        self.cfg = cfg
        self.graphdef = graphdef
        self.state = state
        self.dtype = dtype
        self.mesh = mesh
        dp = int(mesh.shape["dp"]) if mesh is not None else 1
        # Canvas arrays [B, L]: rows over dp (replicated without a mesh: one device).
        self._rows = (
            None if mesh is None else NamedSharding(mesh, PartitionSpec("dp" if dp > 1 else None, None))
        )
        self._replicated = None if mesh is None else NamedSharding(mesh, PartitionSpec())
        self._programs: OrderedDict[tuple[Any, ...], Program] = OrderedDict()  # least recently used first
        # The device thread and the daemon's warm-up thread may ask for the same program at once.
        self._inflight: InFlight[Built] = InFlight()
        # Each decoder's jitted functions, made once per cache (their shardings follow its mesh).
        self._families: dict[str, dict[str, Jitted]] = {}

    def __len__(self) -> int:
        return len(self._programs)

    def __contains__(self, key: object) -> bool:
        """Whether the program of ``key`` (``reference_key``, ``fast_keys``) is compiled and in memory."""
        return key in self._programs

    def items(self) -> ItemsView[tuple[Any, ...], Program]:
        """(key, program) pairs; a key starts with the program's kind."""
        return self._programs.items()

    def info(self) -> dict[str, int | None]:
        """The bounds and what is held: programs kept (``held``) and at most kept, programs built since
        start and evicted, the largest resident memory one build added, the bytes the held programs cost
        and may cost at most, and the process's resident memory now and at most (None where the platform
        does not say)."""
        resident = resident_bytes()
        with self._lock:
            free = self.max_programs - len(self._programs)
            held = sum(self._costs.values())
            room = free * self.largest_bytes  # the count's bound, in the largest program's bytes
            if self.max_bytes is not None:
                room = min(room, max(0, self.max_bytes - held))
            return {
                "held": len(self._programs),
                "max_programs": self.max_programs,
                "compiled": self.compiled,
                "evicted": self.evicted,
                "largest_program_bytes": self.largest_bytes,
                "held_program_bytes": held,
                "max_program_bytes": self.max_bytes,
                "resident_bytes": resident,
                "memory_ceiling_bytes": None if resident is None else resident + room,
            }

    def _keep(self, key: tuple[Any, ...], program: Program, cost: int) -> int:
        """Hold ``program`` as the most recently used; evict the least recently used past either bound
        (never the two newest). Returns how many were evicted. Called with the lock held."""
        self._programs[key] = program
        self._programs.move_to_end(key)
        self._costs[key] = cost
        evicted = 0
        while len(self._programs) > 2 and (
            len(self._programs) > self.max_programs
            or (self.max_bytes is not None and sum(self._costs.values()) > self.max_bytes)
        ):
            old, _ = self._programs.popitem(last=False)
            del self._costs[old]
            evicted += 1
        return evicted

    def _get(self, key: tuple[Any, ...]) -> Program | None:
        """The program under ``key``, marked as the most recently used one."""
        with self._lock:
            program = self._programs.get(key)
            if program is not None:
                self._programs.move_to_end(key)
            return program

    # -- abstract arguments ----------------------------------------------------------------------
    def abstract(self, shape: tuple[int, ...], dtype: Any, *, rows: bool = True) -> Any:
        """An abstract argument (a ShapeDtypeStruct standing in for an array); on a mesh, ``[B, ...]``
        arrays of rows (two axes, ``rows``) are split over dp, the rest replicated (a per-token table)."""
        if self.mesh is None:
            return jax.ShapeDtypeStruct(shape, dtype)
        split = rows and len(shape) == 2
        return jax.ShapeDtypeStruct(shape, dtype, sharding=self._rows if split else self._replicated)

    def abstract_keys(self, batch: int) -> Any:
        """``[batch]`` PRNG keys, one per row (replicated on a mesh: they are tiny)."""
        rng = jax.eval_shape(lambda: jax.random.split(jax.random.key(0), batch))
        if self.mesh is not None:
            rng = jax.ShapeDtypeStruct(rng.shape, rng.dtype, sharding=self._replicated)
        return rng

    def scalar(self, dtype: Any) -> Any:
        return self.abstract((), dtype)

    def rows_out(self) -> dict[str, Any]:
        """``jax.jit`` options for a program whose output is a ``[B, L]`` canvas: it comes out with the
        sharding it goes in with, so one step's output feeds the next step."""
        return {} if self._rows is None else {"out_shardings": self._rows}

    # -- building --------------------------------------------------------------------------------
    def family(self, name: str, make: Callable[[ProgramCache], dict[str, Jitted]]) -> dict[str, Jitted]:
        """A decoder's jitted functions by program kind, ``make(self)``'s, made once per cache."""
        with self._lock:
            if name not in self._families:
                self._families[name] = make(self)
            return self._families[name]

    def _held_or_built(self, key: tuple[Any, ...], build: Callable[[], Built]) -> Built:
        """The program under ``key`` if it is held, else ``build()``'s; when another thread is building
        it, this one waits and reports the wait as its compile seconds (nothing compiled here)."""

        def held() -> Built | None:
            program = self._get(key)
            return None if program is None else Built(program, 0.0, 0, 0)

        built, waited = self._inflight.get(key, held, build)
        return built if waited is None else built._replace(seconds=built.seconds + waited)

    def programs(
        self,
        keys: Sequence[tuple[Any, ...]],
        jitted: Mapping[str, Jitted],
        args: Callable[[str, list[Program]], tuple[Any, ...]],
        spec: object,
        statics: Mapping[str, Any] | None = None,
    ) -> tuple[list[Program], CompileReport]:
        """A decoder's programs under ``keys`` (each key starts with its kind, a key of ``jitted``), held
        or compiled once for the abstract arguments ``args(kind, the programs before it)`` gives (a
        second program takes what the first lays out), with ``spec`` and ``statics`` (the mask id
        added) as static arguments; plus what getting them cost."""
        statics = {"mask_id": self.cfg.mask_token_id, **(statics or {})}
        out: list[Program] = []
        seconds, compiled, hits = 0.0, 0, 0
        for key in keys:

            def build(key: tuple[Any, ...] = key) -> Built:
                return self._compile(key, jitted[key[0]], args(key[0], out), spec, statics)

            built = self._held_or_built(key, build)
            out.append(built.program)
            seconds, compiled, hits = seconds + built.seconds, compiled + built.compiled, hits + built.hits
        return out, CompileReport(seconds, compiled, hits)

    def _compile(
        self,
        key: tuple[Any, ...],
        jitted: Jitted,
        args: tuple[Any, ...],
        spec: object,
        statics: Mapping[str, Any],
    ) -> Built:
        """Lower and compile ``jitted`` for abstract ``args``, timed and counted; the least recently used
        programs make room for it."""
        requests0, hits0 = compile_cache.counters()
        rss0 = resident_bytes()
        t0 = time.perf_counter()
        lowered = jitted.lower(self.state, *args, graphdef=self.graphdef, spec=spec, **statics)
        compiled = lowered.compile()
        seconds = time.perf_counter() - t0
        requests1, hits1 = compile_cache.counters()
        program: Program = compiled if self.mesh is None else Placed(compiled)
        rss1 = resident_bytes()
        with self._lock:
            # The process's first build also starts the compiler (about 800 MB of RSS on CPU, once), which
            # no later program costs again: only later builds measure a program.
            cost = max(0, rss1 - rss0) if self.compiled and rss0 is not None and rss1 is not None else 0
            self.largest_bytes = max(self.largest_bytes, cost)
            evict = self._keep(key, program, cost)
            self.compiled += 1
            self.evicted += evict
        if evict:
            # JAX keeps its own caches of traced, lowered and compiled functions keyed by our static
            # arguments; they hold the evicted executables too. Clearing them frees those (the programs
            # kept here are separate objects and stay valid; later compiles re-trace, as they must).
            jax.clear_caches()
        hits = hits1 - hits0
        return Built(program, seconds, (requests1 - requests0) - hits, hits)


def default_max_bytes() -> int | None:
    """Half the memory the machine has available now (Linux ``MemAvailable``); None elsewhere."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            kib = next(int(line.split()[1]) for line in f if line.startswith("MemAvailable:"))
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    return kib * 1024 // 2
