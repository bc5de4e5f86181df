"""A daemon over several hosts: process 0 serves (``Leader``) while the others repeat its device calls
(``follow``).

Every process joins the process group first (``model_runtime.processes``); then process 0 runs the
daemon with a ``Leader`` around its runtime, and every other process loads its own shards and follows.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Hashable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import jax

from model_runtime.errors import InputError
from model_runtime.interface import BatchEvents, BatchStep, CanvasRow, CompileReport, RuntimeProtocol
from model_runtime.params import SamplingParams

# Every process must launch the same compiled programs in the same order (their collectives meet across
# hosts), so the followers repeat each runtime call of the leader. The calls travel through the key-value
# store of JAX's coordination service (the one jax.distributed.initialize started): the leader writes
# job N under ``diffu/job/N``, and after each denoising step whether the batch goes on; the followers read
# them with blocking gets. No device collective waits while the daemon is idle.

_PREFIX = "diffu"
_POLL_MS = 5_000


def _client() -> Any:
    from jax._src import distributed as jax_distributed  # the coordination service client of this process

    client = jax_distributed.global_state.client
    if client is None:
        raise RuntimeError("jax.distributed is not initialized")
    return client


def _encode_rows(rows: Sequence[CanvasRow]) -> list[dict[str, Any]]:
    return [{"ids": list(r.ids), "region": list(r.region), "chat": r.chat, "seed": r.seed} for r in rows]


def _decode_rows(data: list[dict[str, Any]]) -> list[CanvasRow]:
    return [
        CanvasRow(tuple(r["ids"]), (r["region"][0], r["region"][1]), bool(r["chat"]), r["seed"]) for r in data
    ]


class Leader:
    """Process 0's runtime: answers from the runtime it wraps, and publishes every call that runs device
    programs (``compile``, ``run``) to the followers before making it; ``shutdown()`` releases them.

    What the runtime is (``info``) and how it builds rows (``rows``) are the wrapped runtime's own, so
    the daemon serves it like any runtime and it builds exactly the rows the runtime would.
    """

    def __init__(self, runtime: RuntimeProtocol) -> None:
        self._runtime = runtime
        self._client = _client()
        self._seq = 0
        # The followers take the published calls one at a time, in order: a compile beside a batch would
        # hold a follower away from the batch's collectives.
        self.info = dataclasses.replace(runtime.info, concurrent_compile=False)
        self.rows = runtime.rows

    def program_cache(self) -> dict[str, int | None] | None:
        return self._runtime.program_cache()  # this process's; every process compiles the same programs

    @property
    def forwards(self) -> int:
        return self._runtime.forwards

    def _publish(self, call: Mapping[str, object]) -> str:
        self._seq += 1
        key = f"{_PREFIX}/job/{self._seq}"
        self._client.key_value_set(key, json.dumps(call))
        if self._seq > 2:  # every follower has read job N - 2: it has run job N - 1's collectives with us
            self._client.key_value_delete(f"{_PREFIX}/job/{self._seq - 2}")
            self._client.key_value_delete(f"{_PREFIX}/step/{self._seq - 2}")
            self._client.key_value_delete(f"{_PREFIX}/compiled/{self._seq - 2}")
        return f"{_PREFIX}/step/{self._seq}/"

    def program_keys(self, rows: Sequence[CanvasRow], params: SamplingParams) -> frozenset[Hashable]:
        return self._runtime.program_keys(rows, params)

    def compiled(self, rows: Sequence[CanvasRow], params: SamplingParams) -> bool:
        return self._runtime.compiled(rows, params)

    def compile(self, rows: Sequence[CanvasRow], params: SamplingParams) -> CompileReport:
        # The followers compile the same programs at the same time, so they are ready when the job comes.
        # A compile has no collective to keep the processes in step, so wait for theirs to end: process 0
        # must never run two jobs ahead of a follower (it deletes the keys of job N - 2).
        self._publish({"op": "compile", "rows": _encode_rows(rows), "params": params.to_dict()})
        report = self._runtime.compile(rows, params)
        for rank in range(1, jax.process_count()):
            # None: the daemon is stopping. (A follower that died takes every process down with it.)
            _wait(self._client, f"{_PREFIX}/compiled/{self._seq}/{rank}")
        return report

    def run(
        self,
        rows: Sequence[CanvasRow],
        params: SamplingParams,
        *,
        stream: bool = True,
    ) -> BatchEvents:
        call = {"op": "run", "rows": _encode_rows(rows), "params": params.to_dict(), "stream": stream}
        steps = self._publish(call)
        # An InputError here is the followers' too.
        events = self._runtime.run(rows, params, stream=stream)
        return self._lockstep(events, steps)

    def _lockstep(self, events: BatchEvents, steps: str) -> BatchEvents:
        """The events, telling the followers after each step whether the batch goes on: it stops when
        the consumer closes this generator (every job of the batch cancelled or out of time)."""
        i = 0
        try:
            for event in events:
                yield event
                if isinstance(event, BatchStep):
                    self._client.key_value_set(f"{steps}{i}", "go")
                    i += 1
        finally:
            self._client.key_value_set(f"{steps}{i}", "stop", allow_overwrite=True)
            events.close()

    def shutdown(self) -> None:
        """Tell the followers to exit (the daemon is stopping)."""
        self._seq += 1
        self._client.key_value_set(f"{_PREFIX}/job/{self._seq}", '{"op": "stop"}')
        self._client.key_value_set(f"{_PREFIX}/stopped", "1")


def _wait(client: Any, key: str) -> str | None:
    """The value of ``key`` once it is written; None if the leader stopped first."""
    while True:
        try:
            return client.blocking_key_value_get(key, _POLL_MS)
        except Exception as exc:  # the wait timed out (DEADLINE_EXCEEDED) or the leader is gone
            if "DEADLINE_EXCEEDED" not in str(exc) and "deadline" not in str(exc).lower():
                raise
        try:
            client.key_value_try_get(f"{_PREFIX}/stopped")
            return None
        except Exception:  # not found: the leader is alive and idle
            continue


def follow(runtime: RuntimeProtocol, log: logging.Logger) -> int:
    """A follower's life: repeat each call process 0 publishes until it stops. Returns the jobs run."""
    client = _client()
    seq = 0
    while True:
        seq += 1
        raw = _wait(client, f"{_PREFIX}/job/{seq}")
        if raw is None:
            return seq - 1
        call = json.loads(raw)
        if call["op"] == "stop":
            return seq - 1
        params = SamplingParams.from_dict(call["params"])
        try:
            if call["op"] == "compile":
                runtime.compile(_decode_rows(call["rows"]), params)
                client.key_value_set(f"{_PREFIX}/compiled/{seq}/{jax.process_index()}", "1")
                continue
            events = runtime.run(_decode_rows(call["rows"]), params, stream=call["stream"])
        except InputError as exc:  # the leader got the same error and answered its client
            log.info("job %d refused on every host: %s", seq, exc)
            continue
        i = 0
        try:
            for event in events:
                if isinstance(event, BatchStep):
                    if _wait(client, f"{_PREFIX}/step/{seq}/{i}") != "go":
                        break
                    i += 1
        finally:
            events.close()


if TYPE_CHECKING:
    # The type checker in .ci/run holds this class to the interface the daemon serves.
    _conforms: type[RuntimeProtocol] = Leader
