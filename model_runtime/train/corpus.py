"""Corpus building: a directory of source files -> a held-out split by file -> memory-mapped token shards.

Everything here is deterministic for a given directory: files are visited in sorted relative-path order,
the held-out split is a hash of each relative path (so adding a file never moves another between
splits), and documents are concatenated in that order, each followed by ``<|endoftext|>``.

Layout of a corpus directory::

    meta.json          counts, dtype, shard list, the split, a fingerprint of the tokenizer
    train-00000.bin    uint16 (or uint32 for vocabularies over 65535) token ids, documents joined by eos
    heldout.bin        the held-out files' tokens, same format
    heldout.jsonl      the held-out files' text (path, text), for the line-infill evaluation

Training batches are windows of ``seq_len`` tokens at offsets drawn from a generator seeded by
``(seed, step)``: the data order is a pure function of the step, which is what makes a resumed run see
exactly the batches the interrupted one would have seen.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from model_runtime.errors import InputError
from model_runtime.tokenizer import DreamTokenizer
from model_runtime.train.config import DEFAULT_EXCLUDES, DEFAULT_MAX_FILE_BYTES, DEFAULT_SUFFIXES

SHARD_TOKENS = 1 << 24
CORPUS_VERSION = 1


def find_source_files(
    root: Path,
    *,
    suffixes: Sequence[str] = DEFAULT_SUFFIXES,
    excludes: Sequence[str] = DEFAULT_EXCLUDES,
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
) -> list[Path]:
    """Source files under ``root`` in sorted relative-path order.

    A file is skipped when any component of its relative path matches an ``excludes`` glob, when its
    suffix is not in ``suffixes``, or when it is larger than ``max_file_bytes``.
    """
    root = Path(root)
    if not root.is_dir():
        raise InputError(f"corpus directory {root} does not exist")
    found = []
    for path in root.rglob("*"):
        rel = path.relative_to(root)
        if any(fnmatch.fnmatch(part, pat) for part in rel.parts for pat in excludes):
            continue
        if path.suffix not in suffixes or not path.is_file():
            continue
        if path.stat().st_size > max_file_bytes:
            continue
        found.append(path)
    return sorted(found, key=lambda p: p.relative_to(root).as_posix())


def is_heldout(rel_path: str, heldout_permille: int) -> bool:
    """The split is a hash of the relative path: stable across machines and under added files."""
    h = int.from_bytes(hashlib.sha256(rel_path.encode("utf-8")).digest()[:4], "big")
    return h % 1000 < heldout_permille


def read_sources(root: Path, files: Sequence[Path]) -> Iterator[tuple[str, str]]:
    """(relative path, text) for each file that decodes as UTF-8; others are skipped, not mangled."""
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if text.strip():
            yield path.relative_to(root).as_posix(), text


def split_sources(
    sources: Sequence[tuple[str, str]], heldout_permille: int
) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    train = [s for s in sources if not is_heldout(s[0], heldout_permille)]
    heldout = [s for s in sources if is_heldout(s[0], heldout_permille)]
    if not train:
        raise InputError("every file landed in the held-out split; lower --heldout-permille")
    return train, heldout


TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "merges.txt", "added_tokens.json", "tokenizer_config.json")


def tokenizer_fingerprint(tokenizer_dir: Path) -> str:
    """Hash of a directory's tokenizer files: a corpus is only valid with the tokenizer that made it."""
    h = hashlib.sha256()
    for name in TOKENIZER_FILES:
        path = Path(tokenizer_dir) / name
        if path.is_file():
            h.update(name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def _token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)


def _tokenize(tok: DreamTokenizer, texts: Sequence[str], chunk: int = 256) -> Iterator[list[int]]:
    # encode_batch runs on the tokenizers library's thread pool; chunks bound the memory held at once.
    for i in range(0, len(texts), chunk):
        yield from tok.encode_batch(texts[i : i + chunk])


def build_corpus(
    out_dir: Path,
    tok: DreamTokenizer,
    train: Sequence[tuple[str, str]],
    heldout: Sequence[tuple[str, str]],
    *,
    source: str,
    heldout_permille: int,
    tokenizer_id: str,
    shard_tokens: int = SHARD_TOKENS,
) -> dict[str, Any]:
    """Tokenize the split into shards under ``out_dir`` and write ``meta.json`` last (its presence marks
    a complete corpus). Returns the meta dict."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    dtype = _token_dtype(tok.vocab_size)
    shards: list[dict[str, Any]] = []
    buf: list[np.ndarray] = []
    n_buf = 0

    def flush() -> None:
        nonlocal buf, n_buf
        if not n_buf:
            return
        name = f"train-{len(shards):05d}.bin"
        np.concatenate(buf).astype(dtype).tofile(out_dir / name)
        shards.append({"file": name, "tokens": n_buf})
        buf, n_buf = [], 0

    for ids in _tokenize(tok, [text for _, text in train]):
        doc = np.asarray(ids + [tok.eos_id], dtype=np.int64)
        buf.append(doc)
        n_buf += len(doc)
        if n_buf >= shard_tokens:
            flush()
    flush()
    held = [np.asarray(ids + [tok.eos_id], dtype=np.int64) for ids in _tokenize(tok, [t for _, t in heldout])]
    held_arr = np.concatenate(held) if held else np.zeros((0,), np.int64)
    held_arr.astype(dtype).tofile(out_dir / "heldout.bin")
    with (out_dir / "heldout.jsonl").open("w", encoding="utf-8") as f:
        for path, text in heldout:
            f.write(json.dumps({"path": path, "text": text}) + "\n")
    # The trivial infill baseline: always answer the most frequent non-empty line of the training files.
    lines = Counter(line.strip() for _, text in train for line in text.splitlines() if line.strip())
    meta = {
        "version": CORPUS_VERSION,
        "source": source,
        "dtype": dtype.name,
        "eos_id": tok.eos_id,
        "tokenizer": tokenizer_id,
        "heldout_permille": heldout_permille,
        "train_files": len(train),
        "train_tokens": int(sum(s["tokens"] for s in shards)),
        "train_bytes": int(sum(len(t.encode("utf-8")) for _, t in train)),
        "most_frequent_line": lines.most_common(1)[0][0] if lines else "",
        "heldout_files": [p for p, _ in heldout],
        "heldout_tokens": int(held_arr.size),
        "shards": shards,
    }
    (out_dir / "meta.json").write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
    return meta


@dataclass
class TokenShards:
    """The memory-mapped training shards of a corpus, sampled as fixed-length windows."""

    arrays: Sequence[np.ndarray]  # memory-mapped shards
    seq_len: int

    def __post_init__(self) -> None:
        # Valid window starts per shard; a window never spans two shards.
        starts = [max(a.size - self.seq_len + 1, 0) for a in self.arrays]
        if sum(starts) == 0:
            raise InputError(
                f"the corpus has no run of {self.seq_len} tokens; use a smaller --seq-len or more files"
            )
        self._cum = np.cumsum([0] + starts)

    @property
    def total_tokens(self) -> int:
        return int(sum(a.size for a in self.arrays))

    def batch(self, seed: int, step: int, batch_size: int) -> np.ndarray:
        """The ``[batch_size, seq_len]`` int32 batch of ``step``: a pure function of (seed, step)."""
        rng = np.random.default_rng([seed, step])
        offsets = rng.integers(0, self._cum[-1], size=batch_size)
        shard = np.searchsorted(self._cum, offsets, side="right") - 1
        rows = [
            self.arrays[s][o - self._cum[s] : o - self._cum[s] + self.seq_len]
            for s, o in zip(shard, offsets, strict=True)
        ]
        return np.stack(rows).astype(np.int32)

    def counts(self, vocab_size: int) -> np.ndarray:
        """Token frequencies over the whole training split (for the most-frequent-token baseline)."""
        total = np.zeros((vocab_size,), np.int64)
        for a in self.arrays:
            total += np.bincount(a, minlength=vocab_size)[:vocab_size]
        return total


# The bundled model's pre-training filters (scripts/train_bundled.sh's --exclude): test suites, IDLE's
# tests, codec tables.
BUNDLED_EXCLUDES = ("test", "tests", "idle_test", "encodings")


def bundled_sources(corpus_dir: Path) -> Iterator[tuple[str, str]]:
    """(relative path, text) of the files of a corpus ``scripts/bundled_corpus.py`` built, filtered as the
    bundled model's pre-training filtered them (the held-out split is ``is_heldout(path, 25)``)."""
    files = find_source_files(corpus_dir, excludes=DEFAULT_EXCLUDES + BUNDLED_EXCLUDES)
    return read_sources(corpus_dir, files)


def load_meta(corpus_dir: Path) -> dict[str, Any]:
    path = Path(corpus_dir) / "meta.json"
    if not path.is_file():
        raise InputError(f"{corpus_dir} is not a built corpus (no meta.json)")
    return json.loads(path.read_text(encoding="utf-8"))


def open_shards(corpus_dir: Path, seq_len: int) -> TokenShards:
    meta = load_meta(corpus_dir)
    dtype = np.dtype(meta["dtype"])
    arrays = [np.memmap(Path(corpus_dir) / s["file"], dtype=dtype, mode="r") for s in meta["shards"]]
    return TokenShards(arrays, seq_len)


def heldout_tokens(corpus_dir: Path) -> np.ndarray:
    meta = load_meta(corpus_dir)
    return np.fromfile(Path(corpus_dir) / "heldout.bin", dtype=np.dtype(meta["dtype"]))


def heldout_texts(corpus_dir: Path) -> list[tuple[str, str]]:
    with (Path(corpus_dir) / "heldout.jsonl").open(encoding="utf-8") as f:
        return [(d["path"], d["text"]) for d in map(json.loads, f)]
