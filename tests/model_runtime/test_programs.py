"""The runtime's program cache (issue #17): bounded, least recently used out; and a seeded row's samples
depend on its seed alone, not on what it is batched with."""

from __future__ import annotations

import dataclasses
from concurrent.futures import ThreadPoolExecutor

import jax.numpy as jnp
import numpy as np
import pytest

from model_runtime.decoders.reference import REFERENCE
from model_runtime.interface import BatchDone
from model_runtime.kernels import Knobs, StepInputs, row_keys, step_keys
from model_runtime.params import SamplingParams
from model_runtime.programs import ProgramCache
from model_runtime.specs import SamplerSpec


class _On:
    """The runtime's device with another program cache: a decoder builds its programs in ``cache``."""

    def __init__(self, runtime, cache: ProgramCache) -> None:  # type: ignore[no-untyped-def]
        self._runtime, self.programs = runtime, cache

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        return getattr(self._runtime, name)


def step_program(runtime, cache: ProgramCache, shape: tuple[int, int], spec: SamplerSpec):  # type: ignore[no-untyped-def]
    """The reference decoder's one-step program for ``shape`` and ``spec``, built in ``cache``."""
    program, report = REFERENCE.program(_On(runtime, cache), REFERENCE.key("step", shape, spec))
    return program, report


def one_step(runtime, program) -> np.ndarray:  # type: ignore[no-untyped-def]
    """One denoising step of a (1, 32) reference ``program`` on a canvas of masks."""
    inputs = StepInputs(
        attn=jnp.ones((1, 32), bool),
        ratio=jnp.float32(0.5),
        is_last=jnp.bool_(False),
        key=step_keys(row_keys([0], 1), 0),
        index=jnp.int32(0),
        knobs=Knobs.of(SamplingParams(steps=4)),
    )
    x = jnp.full((1, 32), runtime.config.mask_token_id, jnp.int32)
    return np.asarray(program(runtime.state, x, inputs))


def test_the_cache_keeps_its_bound_and_evicts_the_least_recently_used(runtime) -> None:
    cache = ProgramCache(
        runtime.config, runtime.graphdef, runtime.state, runtime.info.dtype, None, max_programs=2
    )
    entropy, maskgit, margin = (SamplerSpec(alg=a) for a in ("entropy", "maskgit_plus", "topk_margin"))
    kept, _ = step_program(runtime, cache, (1, 32), entropy)
    step_program(runtime, cache, (1, 32), maskgit)
    assert step_program(runtime, cache, (1, 32), entropy)[1].compiled == 0  # in memory: now the most recent
    step_program(runtime, cache, (1, 32), margin)  # the third: maskgit, least recently used, makes room
    assert [key[2] for key, _ in cache.items()] == [entropy, margin]
    info = cache.info()
    assert (info["held"], info["max_programs"], info["compiled"], info["evicted"]) == (2, 2, 3, 1)
    assert step_program(runtime, cache, (1, 32), entropy)[0] is kept
    # A kept program still runs after the eviction cleared JAX's own caches.
    assert one_step(runtime, kept).shape == (1, 32)
    with pytest.raises(ValueError, match="max_programs: must be >= 2"):
        ProgramCache(
            runtime.config, runtime.graphdef, runtime.state, runtime.info.dtype, None, max_programs=1
        )


def _machine_bytes() -> int:
    with open("/proc/meminfo", encoding="ascii") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("MemTotal:")) * 1024


def test_the_ceiling_is_bounded_by_the_machine_not_by_a_count(runtime) -> None:
    """A count alone bounds nothing: a billion places for programs of a 7B model's size (about 400 MB
    each) used to report a ceiling of 400 PB. The byte budget bounds it by the machine's memory."""
    cache = ProgramCache(
        runtime.config, runtime.graphdef, runtime.state, runtime.info.dtype, None, max_programs=10**9
    )
    cache.largest_bytes = 400 << 20
    info = cache.info()
    assert info["memory_ceiling_bytes"] is not None and info["resident_bytes"] is not None
    assert info["memory_ceiling_bytes"] <= _machine_bytes()
    assert 0 < info["max_program_bytes"] <= _machine_bytes() // 2  # half of what was available


def test_the_cache_evicts_by_bytes_and_keeps_the_newest_pair(runtime, monkeypatch) -> None:
    """Programs and costs made up (no compile): past ``max_bytes`` the least recently used go, never the
    two newest; the ceiling is resident memory plus the room the bounds leave."""
    cache = ProgramCache(
        runtime.config,
        runtime.graphdef,
        runtime.state,
        runtime.info.dtype,
        None,
        max_programs=64,
        max_bytes=1000,
    )
    with cache._lock:
        evicted = [cache._keep(("k", i), object(), cost) for i, cost in enumerate([400, 400, 400, 100])]
    assert evicted == [0, 0, 1, 0] and [k for k, _ in cache.items()] == [("k", 1), ("k", 2), ("k", 3)]
    cache.largest_bytes = 400
    monkeypatch.setattr("model_runtime.programs.resident_bytes", lambda: 5000)
    info = cache.info()
    assert (info["held"], info["held_program_bytes"], info["max_program_bytes"]) == (3, 900, 1000)
    assert info["memory_ceiling_bytes"] == 5000 + 100  # the byte budget's room, not 61 x 400
    with cache._lock:
        cache._keep(("big",), object(), 5000)  # alone beyond the budget: kept, with the one before it
    assert [k for k, _ in cache.items()] == [("k", 3), ("big",)]
    assert cache.info()["memory_ceiling_bytes"] == 5000  # no room left


@pytest.mark.parametrize("decoder", ["reference", "fast"])
def test_a_seeded_row_samples_the_same_alone_or_in_any_batch(runtime, decoder: str) -> None:
    """Alone it runs in the (1, 32) bucket; batched, second of three in (4, 64), left-padded by a longer
    prompt beside it, next to rows with other seeds."""
    params = SamplingParams(
        max_new_tokens=16,
        steps=8,
        temperature=1.0,
        decoder=decoder,
        alg_temp=0.5 if decoder == "reference" else None,
    )
    tok = runtime.tokenizer

    def row(text: str, seed: int):
        return dataclasses.replace(runtime.rows.make_row(tok.encode(text), 16, chat=False), seed=seed)

    def texts(rows) -> list[str]:
        done = [e for e in runtime.run(rows, params, stream=False) if isinstance(e, BatchDone)][-1]
        return done.texts

    mine = row("def add(a, b):", 7)
    alone = texts([mine])
    batched = texts([row("x = 1\n" * 12, 3), mine, row("import os", 11)])
    assert batched[1] == alone[0]
    assert batched[0] != batched[2]  # other seeds, other prompts: other samples
    assert texts([dataclasses.replace(mine, seed=8)]) != alone  # another seed, another sample


def test_two_threads_asking_for_one_program_compile_it_once_and_one_runs_meanwhile(runtime) -> None:
    """The daemon's warm-up thread and its device thread may want the same program at once: one compiles
    it, the other waits and takes it. A program of another shape runs while a compile is under way."""
    cache = ProgramCache(runtime.config, runtime.graphdef, runtime.state, runtime.info.dtype, None)
    spec = SamplerSpec(alg="entropy")
    held, _ = step_program(runtime, cache, (1, 32), spec)
    with ThreadPoolExecutor(2) as pool:
        both = list(pool.map(lambda _: step_program(runtime, cache, (2, 64), spec), range(2)))
        # Meanwhile (or after, on a quick machine) the held program runs on this thread.
        assert one_step(runtime, held).shape == (1, 32)
    assert both[0][0] is both[1][0]
    assert sorted(b.compiled + b.cache_hits for _, b in both) == [0, 1]  # built once; the other waited
    assert cache.info()["compiled"] == 2
