"""One training run end to end: tokenizer -> corpus -> train (resumable) -> evaluate -> export.

A run lives in one directory; every stage is skipped when its output is already there, so running the
same command again after a crash (or after it finished) resumes instead of starting over::

    RUN/tokenizer/      tokenizer files (trained here for a from-scratch model, copied with --init-from)
    RUN/corpus/         memory-mapped token shards and the held-out split (corpus.py)
    RUN/run.json        the model config and TrainConfig; a resumed run must ask for the same
    RUN/checkpoints/    orbax checkpoints of the full training state
    RUN/metrics.jsonl   one line per logged step and per periodic evaluation
    RUN/model/          the exported model in the published layout, with metrics.json
"""

from __future__ import annotations

import json
import math
import os
import platform
import shutil
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import jax
import numpy as np

from model_runtime.config import DreamConfig
from model_runtime.errors import InputError
from model_runtime.runtime import Runtime
from model_runtime.tiny import tiny_config
from model_runtime.tokenizer import DreamTokenizer, load_tokenizer, save_published_layout, train_bpe
from model_runtime.train import corpus as corpus_lib
from model_runtime.train.checkpoints import devices_note, resume, stop_note
from model_runtime.train.config import CorpusOptions, ModelShape, RunOptions, TrainConfig
from model_runtime.train.evaluate import build_eval_set, evaluate
from model_runtime.train.export import export_model
from model_runtime.train.loop import Trainer, init_params, run_config_dict


def prepare_tokenizer(
    run_dir: Path, source: Path, copts: CorpusOptions, *, shape: ModelShape, init_from: Path | None
) -> tuple[Path, list[tuple[str, str]], list[tuple[str, str]]]:
    """RUN/tokenizer (trained or copied) and the split sources; the split is only read if needed."""
    tok_dir = run_dir / "tokenizer"
    files = corpus_lib.find_source_files(
        source, suffixes=copts.suffixes, excludes=copts.excludes, max_file_bytes=copts.max_file_bytes
    )
    if not files:
        raise InputError(f"no {'/'.join(copts.suffixes)} files under {source}")
    sources = list(corpus_lib.read_sources(source, files))
    train, heldout = corpus_lib.split_sources(sources, copts.heldout_permille)
    if init_from is not None:
        copy_tokenizer(init_from, run_dir)
    elif not (tok_dir / "added_tokens.json").is_file():
        tmp = run_dir / "tokenizer.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        # Only the training split trains the tokenizer: held-out files stay unseen in every sense.
        tok = train_bpe((text for _, text in train), shape.vocab_size, instruct=True)
        save_published_layout(tok, tmp)
        tmp.rename(tok_dir)
    return tok_dir, train, heldout


def copy_tokenizer(model_dir: Path, run_dir: Path) -> Path:
    """RUN/tokenizer: the tokenizer files of the model a run fine-tunes (copied once, then kept)."""
    tok_dir = run_dir / "tokenizer"
    if not (tok_dir / "added_tokens.json").is_file():
        tmp = run_dir / "tokenizer.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        for name in corpus_lib.TOKENIZER_FILES:
            if (model_dir / name).is_file():
                shutil.copyfile(model_dir / name, tmp / name)
        tmp.rename(tok_dir)
    return tok_dir


def load_run_tokenizer(tok_dir: Path, cfg: DreamConfig) -> DreamTokenizer:
    """RUN/tokenizer with the special ids of the model it trains."""
    return load_tokenizer(
        tok_dir, mask_id=cfg.mask_token_id, pad_id=cfg.pad_token_id, eos_id=cfg.eos_token_id
    )


def scratch_config(tok_dir: Path, shape: ModelShape) -> dict[str, Any]:
    """config.json of a from-scratch model: DiffuCoder's keys, our sizes, the vocabulary padded to 64."""
    probe = load_tokenizer(tok_dir, mask_id=0, pad_id=0, eos_id=0)
    eos, mask = probe.token_to_id("<|endoftext|>"), probe.token_to_id("<|mask|>")
    if eos is None or mask is None:
        # The tokenizer trained here always has both; a RUN/tokenizer put there by hand may not.
        raise InputError(f"{tok_dir}: a from-scratch model needs <|endoftext|> and <|mask|> tokens")
    vocab = int(math.ceil(probe.vocab_size / 64) * 64)  # padded like the real 152064-row embedding
    return tiny_config(
        vocab,
        eos,
        mask,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_hidden_layers,
        max_window_layers=shape.num_hidden_layers,
        num_attention_heads=shape.num_attention_heads,
        num_key_value_heads=shape.num_key_value_heads,
        max_position_embeddings=shape.max_position_embeddings,
        rope_theta=shape.rope_theta,
        torch_dtype="float32",
    )


def load_base(
    init_from: str | os.PathLike[str], log: Callable[[str], None]
) -> tuple[Runtime, dict[str, Any]]:
    """The checkpoint to fine-tune, loaded in float32, and its ``config.json`` as a dict."""
    from model_runtime.checkpoint import resolve_model_dir
    from model_runtime.loader import load

    init_dir = resolve_model_dir(init_from)
    log(f"loading {init_dir} to fine-tune")
    base = load(init_dir, dtype="float32")
    return base, json.loads((init_dir / "config.json").read_text(encoding="utf-8"))


def check_run_record(run_dir: Path, record: dict[str, Any]) -> None:
    """Write RUN/run.json, or refuse when it holds a run with other settings (a resume must compute the
    same thing as the run it resumes)."""
    record = json.loads(json.dumps(record))  # tuples -> lists, as they come back from disk
    run_json = run_dir / "run.json"
    if run_json.is_file():
        old = json.loads(run_json.read_text(encoding="utf-8"))
        diff = _diff(old, record)
        if diff:
            raise InputError(
                f"{run_dir} holds a run with other settings ({'; '.join(diff[:3])}); "
                "use a new --out directory or repeat the original flags"
            )
    else:
        run_json.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")


def prepare_corpus(
    run_dir: Path,
    source: Path,
    copts: CorpusOptions,
    shape: ModelShape,
    base_dir: Path | None,
    cfg_dict: dict[str, Any] | None,
    log: Callable[[str], None],
) -> tuple[dict[str, Any], DreamTokenizer]:
    """RUN/tokenizer and RUN/corpus, built unless already there; returns the model's config dict (the
    base's, or a from-scratch one sized to the tokenizer) and the tokenizer."""
    corpus_dir, tok_dir = run_dir / "corpus", run_dir / "tokenizer"
    have_corpus = (corpus_dir / "meta.json").is_file() and tok_dir.is_dir()
    if not have_corpus:
        log(f"reading source files under {source}")
        _, train_src, heldout_src = prepare_tokenizer(run_dir, source, copts, shape=shape, init_from=base_dir)
    cfg_dict = cfg_dict or scratch_config(tok_dir, shape)
    tok = load_run_tokenizer(tok_dir, DreamConfig.from_dict(cfg_dict))
    tok_id = corpus_lib.tokenizer_fingerprint(tok_dir)
    if not have_corpus:
        log(f"tokenizing {len(train_src)} training and {len(heldout_src)} held-out files")
        shutil.rmtree(corpus_dir, ignore_errors=True)
        corpus_lib.build_corpus(
            corpus_dir,
            tok,
            train_src,
            heldout_src,
            source=str(source),
            heldout_permille=copts.heldout_permille,
            tokenizer_id=tok_id,
        )
    meta = corpus_lib.load_meta(corpus_dir)
    if meta["tokenizer"] != tok_id:
        raise InputError(f"{corpus_dir} was tokenized with another tokenizer; delete it to rebuild")
    log(
        f"corpus: {meta['train_files']} files, {meta['train_tokens']:,} training tokens; "
        f"{len(meta['heldout_files'])} held-out files, {meta['heldout_tokens']:,} tokens"
    )
    return cfg_dict, tok


class CodeEval:
    """The held-out code evaluation of a corpus (loss, masked accuracy, line infill; evaluate.py)."""

    def __init__(
        self, corpus_dir: Path, tok: DreamTokenizer, model_cfg: DreamConfig, cfg: TrainConfig
    ) -> None:
        self.meta = corpus_lib.load_meta(corpus_dir)
        self.tok, self.cfg = tok, cfg
        self.shards = corpus_lib.open_shards(corpus_dir, cfg.seq_len)
        self.top_token = int(np.argmax(self.shards.counts(model_cfg.vocab_size)))
        self.tokens = corpus_lib.heldout_tokens(corpus_dir)
        self.texts = corpus_lib.heldout_texts(corpus_dir)

    def eval_set(self, windows: int, cases: int) -> Any:
        return build_eval_set(
            self.tok,
            self.tokens,
            self.texts,
            seq_len=self.cfg.seq_len,
            top_token=self.top_token,
            top_line=self.meta["most_frequent_line"],
            max_windows=windows,
            n_cases=cases,
        )


def model_facts(model_cfg: DreamConfig) -> dict[str, Any]:
    return {
        "parameters": model_cfg.param_count(),
        "hidden_size": model_cfg.hidden_size,
        "intermediate_size": model_cfg.intermediate_size,
        "num_hidden_layers": model_cfg.num_hidden_layers,
        "num_attention_heads": model_cfg.num_attention_heads,
        "num_key_value_heads": model_cfg.num_key_value_heads,
        "vocab_size": model_cfg.vocab_size,
    }


def hardware_facts() -> dict[str, Any]:
    n_dev = len(jax.devices())
    return {
        "devices": f"{n_dev} x {jax.devices()[0].device_kind}",
        "cpu_count": os.cpu_count(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "jax": jax.__version__,
    }


def run_trainer(
    trainer: Trainer, cfg: TrainConfig, model_cfg: DreamConfig, log: Callable[[str], None]
) -> None:
    """Resume from the newest checkpoint, if any, and train to ``cfg.steps``."""
    resume(trainer, log)
    until = stop_note(cfg.steps, trainer.options.stop_at)
    log(
        f"model: {model_cfg.param_count() / 1e6:.2f}M parameters; training {cfg.steps} steps of "
        f"{cfg.batch_size}x{cfg.seq_len} tokens on {devices_note()}{until}"
    )
    trainer.run()


def export_run(
    run_dir: Path,
    trainer: Trainer,
    cfg_dict: dict[str, Any],
    ropts: RunOptions,
    init_from: str | os.PathLike[str] | None,
    evals: dict[str, Any],
    extra: dict[str, Any],
) -> dict[str, Any]:
    """The end of a run: the final evaluations in metrics.jsonl, then RUN/model (the EMA weights, the
    tokenizer) with metrics.json: ``evals``, the weights, model, training and hardware facts, ``extra``."""
    cfg = trainer.cfg
    trainer.log_record({"step": trainer.step, "final_eval": evals})
    train = asdict(cfg) | {
        "steps_done": trainer.step,  # below ``steps`` when a run was stopped early (--stop-at)
        "tokens_seen": trainer.step * cfg.batch_size * cfg.seq_len,
        "seconds": round(trainer.train_seconds, 1),
        "init_from": str(init_from) if init_from else None,
    }
    facts = evals | {
        "weights": f"EMA of the training weights (decay {cfg.ema_decay:g})",
        "model": model_facts(trainer.model_cfg),
        "train": train | extra.pop("train", {}),
        **extra,
        "hardware": hardware_facts(),
    }
    out = export_model(
        run_dir / "model",
        cfg_dict,
        trainer.ema_params(),
        run_dir / "tokenizer",
        dtype=ropts.export_dtype,
        extra_files={"metrics.json": facts},
    )
    ropts.log(f"exported to {out}")
    return facts


def train_model(
    run_dir: str | os.PathLike[str],
    source: str | os.PathLike[str],
    *,
    init_from: str | os.PathLike[str] | None = None,
    shape: ModelShape | None = None,
    copts: CorpusOptions | None = None,
    cfg: TrainConfig | None = None,
    ropts: RunOptions | None = None,
    prepare_only: bool = False,
) -> dict[str, Any]:
    """Run (or resume) a training run in ``run_dir`` on the source files under ``source``.

    Returns the final held-out metrics, also written to ``RUN/model/metrics.json``. With
    ``prepare_only`` it stops once the tokenizer and the corpus are built and returns the corpus facts
    (prepare on one machine, copy the run directory, train on another).
    """
    ropts = ropts or RunOptions()
    cfg = cfg or TrainConfig()
    shape, copts = shape or ModelShape(), copts or CorpusOptions()
    log = ropts.log
    run_dir, source = Path(run_dir), Path(source)
    run_dir.mkdir(parents=True, exist_ok=True)
    base, cfg_dict = load_base(init_from, log) if init_from is not None else (None, None)
    cfg_dict, tok = prepare_corpus(
        run_dir, source, copts, shape, base.model_dir if base else None, cfg_dict, log
    )
    model_cfg = DreamConfig.from_dict(cfg_dict)
    corpus_dir = run_dir / "corpus"
    meta = corpus_lib.load_meta(corpus_dir)
    if prepare_only:
        return {"corpus": {k: v for k, v in meta.items() if k not in ("heldout_files", "shards")}}

    check_run_record(
        run_dir,
        run_config_dict(cfg_dict, cfg, init_from=str(init_from) if init_from else None, corpus=asdict(copts)),
    )
    graphdef, params = (base.graphdef, base.state) if base is not None else init_params(model_cfg, cfg.seed)
    code = CodeEval(corpus_dir, tok, model_cfg, cfg)
    loop = ropts.loop
    if loop.eval_every and loop.evaluate is None and code.tokens.size:
        small = code.eval_set(ropts.periodic_eval_windows, ropts.periodic_eval_infill_cases)
        loop.evaluate = lambda step, p: evaluate(graphdef, p, small, tok, eps=cfg.eps)
    trainer = Trainer(run_dir, model_cfg, cfg, code.shards, graphdef=graphdef, params=params, options=loop)
    try:
        run_trainer(trainer, cfg, model_cfg, log)
        final = evaluate(
            graphdef,
            trainer.ema_params(),
            code.eval_set(ropts.eval_windows, ropts.eval_infill_cases),
            tok,
            eps=cfg.eps,
            return_samples=8,
        )
        corpus = {k: meta[k] for k in ("source", "train_files", "train_tokens", "train_bytes")}
        corpus |= {"heldout_files": len(meta["heldout_files"]), "heldout_tokens": meta["heldout_tokens"]}
        extra = {"corpus": corpus | asdict(copts)}
        return export_run(run_dir, trainer, cfg_dict, ropts, init_from, {"heldout": final}, extra)
    finally:
        trainer.close()


def _diff(old: Any, new: Any, prefix: str = "") -> list[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for k in sorted(set(old) | set(new)):
            out += _diff(old.get(k), new.get(k), f"{prefix}{k}.")
        return out
    return [] if old == new else [f"{prefix.rstrip('.')}: was {old!r}, now {new!r}"]
