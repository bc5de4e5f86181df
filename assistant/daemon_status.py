"""What the daemon says about itself, typed for both sides: ``/v1/diffu/status`` (:class:`DaemonStatus`
and its parts: the scheduler's :class:`EngineStatus`, the :class:`QueueStatus`, the compiled-program
cache's :class:`ProgramsStatus`, the :class:`DaemonLimits`) and OpenAI's ``/v1/models``
(:class:`ModelList` of :class:`ModelEntry`).

The daemon builds these values and sends ``to_dict()``; the clients read them back with ``from_dict``
and use fields (``status.engine.stage``, not ``status.get("engine", {}).get("stage")``). The JSON is the
one the daemon always sent, key for key and in the same order (tests/assistant/test_daemon_status.py pins
it). Reading is lenient as ``DoneStats`` is: a field the daemon left out keeps its default, one it added
is ignored. A wire module beside ``assistant.wire`` (JAX-free, no HTTP), which it would push past the
size rule.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from assistant.wire import DaemonCounters, Stage

# A JSON object as written (to_dict) and as read back (from_dict): each record says what its values are.
JSONObject = dict[str, object]
JSONMapping = Mapping[str, object]


def _known(cls: type[Any], data: JSONMapping) -> dict[str, Any]:
    """The items of ``data`` that are fields of dataclass ``cls`` (others are a newer daemon's)."""
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in data.items() if k in names}


# -- /v1/diffu/status -------------------------------------------------------------------------------------
@dataclass
class EngineStatus:
    """Where the scheduler is (``engine`` in ``/v1/diffu/status``, inlined in ``/health``; "engine" is
    the old name kept on the wire). While compiling or warming: ``warmed`` of ``shapes`` done (each the
    programs of one request shape), ``eta_seconds`` once one compile was timed. ``compiling``: what is
    being compiled right now, the warm-up's and a request's joined by "; " (None: nothing)."""

    stage: Stage = Stage.STARTING
    progress: float = 0.0
    detail: str = ""
    error: str | None = None
    warmed: int = 0
    shapes: int = 0
    eta_seconds: float | None = None
    compiling: str | None = None

    def to_dict(self) -> JSONObject:
        return {
            "stage": self.stage,
            "progress": round(self.progress, 4),
            "detail": self.detail,
            "error": self.error,
            "warmed": self.warmed,
            "shapes": self.shapes,
            "eta_seconds": self.eta_seconds,
            "compiling": self.compiling,
        }

    @classmethod
    def from_dict(cls, data: JSONMapping) -> EngineStatus:
        values = _known(cls, data)
        if "stage" in values:
            values["stage"] = Stage(values["stage"])
        return cls(**values)


@dataclass(frozen=True)
class QueueStatus:
    """The scheduler's queue: requests waiting and running, how many may wait, the largest batch."""

    pending: int = 0
    running: int = 0
    capacity: int = 0
    max_batch: int = 0

    def to_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: JSONMapping) -> QueueStatus:
        return cls(**{k: int(v) for k, v in _known(cls, data).items()})


@dataclass(frozen=True)
class ProgramsStatus:
    """The compiled-program cache (``model_runtime.programs.ProgramCache.info``): programs held and at
    most held, built since start and evicted, the largest resident memory one build added, the bytes
    the held programs cost and may cost at most, and the process's resident memory now and at most
    (None where the platform does not say, or nothing bounds it)."""

    held: int = 0
    max_programs: int = 0
    compiled: int = 0
    evicted: int = 0
    largest_program_bytes: int = 0
    held_program_bytes: int = 0
    max_program_bytes: int | None = None
    resident_bytes: int | None = None
    memory_ceiling_bytes: int | None = None

    def to_dict(self) -> dict[str, int | None]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: JSONMapping) -> ProgramsStatus:
        return cls(**_known(cls, data))


@dataclass(frozen=True)
class DaemonLimits:
    """The daemon's limits on one request, and its queue's size (``limits``)."""

    max_steps: int = 0
    max_seconds: float = 0.0
    max_body_bytes: int = 0
    queue_size: int = 0

    def to_dict(self) -> dict[str, int | float]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: JSONMapping) -> DaemonLimits:
        return cls(**_known(cls, data))


@dataclass(frozen=True, kw_only=True)
class DaemonStatus:
    """``/v1/diffu/status``: the daemon (model, version, pid), the runtime serving (None, or empty,
    until the model is loaded: device, dtype, quantization, context, default decoder, the model's
    one-line and chat defaults, mesh, buckets, the program cache), the scheduler, its queue and counters,
    uptime, limits, whether it asks for a token, and what clients may rely on beyond the basic routes
    (``features``: ``diffu lsp`` checks ``holes``)."""

    model: str = ""
    model_path: str | None = None
    version: str = ""
    pid: int = 0
    device: str | None = None
    dtype: str | None = None
    quantize: str | None = None
    max_context: int | None = None
    default_decoder: str | None = None
    one_line_defaults: JSONMapping | None = None
    block_defaults: JSONMapping | None = None
    chat_decoder: JSONMapping | None = None
    chat_defaults: JSONMapping = field(default_factory=dict)
    mesh: JSONMapping | None = None
    buckets: tuple[tuple[int, int], ...] = ()
    programs: ProgramsStatus | None = None
    engine: EngineStatus = field(default_factory=EngineStatus)
    queue: QueueStatus = QueueStatus()
    counters: DaemonCounters = field(default_factory=DaemonCounters)
    uptime_seconds: float = 0.0
    limits: DaemonLimits = DaemonLimits()
    auth: bool = True
    features: tuple[str, ...] = ()

    @property
    def chat_settings(self) -> dict[str, Any]:
        """What a chat with the model starts from: its chat defaults, and over them its chat's decoder and
        that decoder's knobs (``diffu_chat``)."""
        return {**self.chat_defaults, **(self.chat_decoder or {})}

    def to_dict(self) -> JSONObject:
        """The JSON object, in the order the daemon has always sent it."""
        return {
            "model": self.model,
            "model_path": self.model_path,
            "version": self.version,
            "pid": self.pid,
            "device": self.device,
            "dtype": self.dtype,
            "quantize": self.quantize,
            "max_context": self.max_context,
            "default_decoder": self.default_decoder,
            "one_line_defaults": _plain(self.one_line_defaults),
            "block_defaults": _plain(self.block_defaults),
            "chat_decoder": _plain(self.chat_decoder),
            "chat_defaults": dict(self.chat_defaults),
            "mesh": _plain(self.mesh),
            "buckets": [list(b) for b in self.buckets],
            "programs": self.programs.to_dict() if self.programs is not None else None,
            "engine": self.engine.to_dict(),
            "queue": self.queue.to_dict(),
            "counters": self.counters.to_dict(),
            "uptime_seconds": self.uptime_seconds,
            "limits": self.limits.to_dict(),
            "auth": self.auth,
            "features": list(self.features),
        }

    @classmethod
    def from_dict(cls, data: JSONMapping) -> DaemonStatus:
        """Read back from JSON (lenient, as the module docstring says)."""
        values = _known(cls, data)
        readers: dict[str, Callable[[JSONMapping], object]] = {
            "engine": EngineStatus.from_dict,
            "queue": QueueStatus.from_dict,
            "counters": DaemonCounters.from_dict,
            "limits": DaemonLimits.from_dict,
            "programs": ProgramsStatus.from_dict,
        }
        for name, read in readers.items():
            if values.get(name) is not None:
                values[name] = read(values[name])
        values["buckets"] = tuple((int(b), int(n)) for b, n in values.get("buckets") or ())
        values["features"] = tuple(values.get("features") or ())
        if values.get("chat_defaults") is None:
            values.pop("chat_defaults", None)
        return cls(**values)


def _plain(mapping: JSONMapping | None) -> JSONObject | None:
    return dict(mapping) if mapping is not None else None


# -- /v1/models -------------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class ModelEntry:
    """The one model a daemon serves, as OpenAI's ``/v1/models`` lists it (``max_model_len`` is vLLM's
    name for the context and ``context_length`` another client's; the daemon sends both)."""

    id: str = ""
    object: str = "model"
    created: int = 0
    owned_by: str = "diffu"
    max_model_len: int | None = None
    context_length: int | None = None
    # diffu's own: the row the model recommends for editors' suggestions (``RuntimeInfo.editor_context``).
    editor_context: int | None = None

    def to_dict(self) -> JSONObject:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: JSONMapping) -> ModelEntry:
        return cls(**_known(cls, data))


@dataclass(frozen=True)
class ModelList:
    """``/v1/models``: ``{"object": "list", "data": [...]}``."""

    data: tuple[ModelEntry, ...] = ()
    object: str = "list"

    def to_dict(self) -> JSONObject:
        return {"object": self.object, "data": [entry.to_dict() for entry in self.data]}

    @classmethod
    def from_dict(cls, data: JSONMapping) -> ModelList:
        values = _known(cls, data)
        entries = tuple(ModelEntry.from_dict(entry) for entry in values.get("data") or ())
        return cls(entries, str(values.get("object", "list")))
