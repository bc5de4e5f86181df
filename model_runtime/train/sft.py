"""Supervised fine-tuning (instruction tuning) of a masked-diffusion model: ``diffu train --sft DATA``.

The recipe is DiffuCoder's instruction tuning as its authors describe it (apple/ml-diffucoder issue #9:
LLaMA-Factory with the loss swapped for the diffusion one) on the layout of DiffuCoder-Instruct's own
answers (``sft_data``): per row a noise level ``t ~ U(eps, 1)``; each response token (the answer, its
``<|im_end|>`` and the padding after it) is masked with probability ``t``; prompt tokens never are; the
model sees the whole row with no attention mask (padding is part of the data) and the loss is
``sum(CE / t)`` over masked tokens divided by their number (``objective.response_loss``), with Dream's
one-position logit shift.

Everything a pre-training run has applies: AdamW with warmup and cosine decay, the EMA, orbax
checkpoints with exact resume, data parallelism, the progress bar, ``metrics.jsonl``, periodic and final
held-out evaluation (response loss and masked accuracy on held-out conversations; with a SOURCE corpus,
the code evaluation of pre-training too), and the export to the published layout in ``RUN/model``::

    RUN/tokenizer/   the base model's tokenizer files
    RUN/sft/         the conversations as fixed-length rows (sft_data.prepare)
    RUN/corpus/      with a SOURCE only: the code corpus whose held-out split is evaluated
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from model_runtime.config import DreamConfig
from model_runtime.errors import InputError
from model_runtime.tokenizer import DreamTokenizer
from model_runtime.train import corpus as corpus_lib
from model_runtime.train import sft_data
from model_runtime.train.config import CorpusOptions, ModelShape, RunOptions, SFTOptions, TrainConfig
from model_runtime.train.evaluate import EvalSet, evaluate
from model_runtime.train.loop import Batches, Trainer, run_config_dict
from model_runtime.train.objective import sft_objective
from model_runtime.train.run import (
    CodeEval,
    check_run_record,
    copy_tokenizer,
    export_run,
    load_base,
    load_run_tokenizer,
    prepare_corpus,
    run_trainer,
)


def sft_eval_set(rows: sft_data.SFTRows, top_token: int, max_rows: int) -> EvalSet:
    """Held-out conversations, spread evenly, for the response loss and masked accuracy."""
    take = np.linspace(0, max(len(rows) - 1, 0), num=min(len(rows), max_rows)).astype(np.int64)
    tokens, plen = rows.tokens[take].astype(np.int32), rows.prompt_len[take].astype(np.int32)
    return EvalSet(tokens, (), top_token, "", prompt_len=plen)


def train_sft(
    run_dir: str | os.PathLike[str],
    data: str | os.PathLike[str],
    *,
    init_from: str | os.PathLike[str],
    cfg: TrainConfig | None = None,
    ropts: RunOptions | None = None,
    sopts: SFTOptions | None = None,
    source: str | os.PathLike[str] | None = None,
    copts: CorpusOptions | None = None,
) -> dict[str, Any]:
    """Instruction-tune ``init_from`` on the conversations of ``data`` in ``run_dir`` (resumable).

    Returns the facts written to ``RUN/model/metrics.json``: ``sft_heldout`` (held-out conversations)
    and, with ``source``, ``heldout`` (the held-out code of that corpus, as pre-training reports it).
    """
    ropts, cfg, sopts = ropts or RunOptions(), cfg or TrainConfig(), sopts or SFTOptions()
    copts = copts or CorpusOptions()
    log = ropts.log
    run_dir, data = Path(run_dir), Path(data)
    if not data.is_file():
        raise InputError(f"--sft {data}: no such file")
    run_dir.mkdir(parents=True, exist_ok=True)
    base, cfg_dict = load_base(init_from, log)
    model_cfg = DreamConfig.from_dict(cfg_dict)
    if cfg.seq_len > model_cfg.max_position_embeddings:
        positions = model_cfg.max_position_embeddings
        raise InputError(f"--seq-len {cfg.seq_len} is longer than the model's {positions} positions")
    code = None
    if source is not None:
        _, code_tok = prepare_corpus(
            run_dir, Path(source), copts, ModelShape(), base.model_dir, cfg_dict, log
        )
        code = CodeEval(run_dir / "corpus", code_tok, model_cfg, cfg)
    if sopts.mix_code and code is None:
        raise InputError("--mix-code needs SOURCE: the code corpus whose windows are mixed in")
    tok_dir = copy_tokenizer(base.model_dir, run_dir)
    tok = load_run_tokenizer(tok_dir, model_cfg)
    sha = sft_data.file_sha256(data)
    check_run_record(run_dir, _run_record(cfg_dict, cfg, str(init_from), sha, sopts, copts, code is not None))
    rows, data_facts = _read_conversations(run_dir, data, tok, tok_dir, cfg, sopts, log)
    top_token = _top_response_token(rows["train"], model_cfg.vocab_size)
    graphdef = base.graphdef
    loop = ropts.loop
    if loop.eval_every and loop.evaluate is None and len(rows["heldout"]):
        small = sft_eval_set(rows["heldout"], top_token, ropts.periodic_eval_windows)
        loop.evaluate = lambda step, p: evaluate(graphdef, p, small, tok, eps=cfg.eps)
    batches: Batches = rows["train"]
    if sopts.mix_code and code is not None:
        batches = sft_data.MixedRows(rows["train"], code.shards, sopts.mix_code)
        n_code = int(round(cfg.batch_size * sopts.mix_code))
        log(f"each batch: {cfg.batch_size - n_code} conversations and {n_code} code windows of {source}")
    objective = sft_objective(model_cfg.mask_token_id, cfg.eps)
    trainer = Trainer(
        run_dir,
        model_cfg,
        cfg,
        batches,
        graphdef=graphdef,
        params=base.state,
        options=loop,
        objective=objective,
    )
    try:
        run_trainer(trainer, cfg, model_cfg, log)
        facts = _final_evals(trainer, rows["heldout"], top_token, tok, code, ropts)
        data_facts = {"file": str(data), "sha256": sha} | data_facts | asdict(sopts)
        extra = {"train": {"objective": "sft"}, "sft_data": data_facts}
        return export_run(run_dir, trainer, cfg_dict, ropts, init_from, facts, extra)
    finally:
        trainer.close()


def _run_record(
    cfg_dict: dict[str, Any],
    cfg: TrainConfig,
    init_from: str,
    sha: str,
    sopts: SFTOptions,
    copts: CorpusOptions,
    with_code: bool,
) -> dict[str, Any]:
    """What RUN/run.json holds for an SFT run (a resume must ask for the same)."""
    sft_record: dict[str, Any] = {"data_sha256": sha, "heldout_permille": sopts.heldout_permille}
    if sopts.mix_code:
        sft_record["mix_code"] = sopts.mix_code
    corpus = asdict(copts) if with_code else None
    return run_config_dict(cfg_dict, cfg, init_from=init_from, sft=sft_record, corpus=corpus)


def _read_conversations(
    run_dir: Path,
    data: Path,
    tok: DreamTokenizer,
    tok_dir: Path,
    cfg: TrainConfig,
    sopts: SFTOptions,
    log: Callable[[str], None],
) -> tuple[dict[str, sft_data.SFTRows], dict[str, Any]]:
    """RUN/sft (built unless already there): the training and held-out rows, and the data's facts."""
    log(f"reading conversations from {data}")
    tok_id = corpus_lib.tokenizer_fingerprint(tok_dir)
    rows, facts = sft_data.prepare(run_dir / "sft", data, tok, tok_id, cfg.seq_len, sopts, log)
    log(
        f"SFT data: {facts['conversations']} conversations for training, "
        f"{facts['heldout_conversations']} held out, {facts['skipped_lines']} lines skipped; "
        f"{facts['prompt_tokens_mean']:.0f} prompt and {facts['answer_tokens_mean']:.0f} answer "
        f"tokens on average in rows of {cfg.seq_len}"
    )
    return rows, facts


def _top_response_token(rows: sft_data.SFTRows, vocab_size: int) -> int:
    """The trivial baseline of masked accuracy: always the most frequent response token (the padding)."""
    response = np.arange(rows.tokens.shape[1])[None, :] >= rows.prompt_len[:, None]
    return int(np.argmax(np.bincount(rows.tokens[response], minlength=vocab_size)))


def _final_evals(
    trainer: Trainer,
    heldout: sft_data.SFTRows,
    top_token: int,
    tok: DreamTokenizer,
    code: CodeEval | None,
    ropts: RunOptions,
) -> dict[str, Any]:
    """The final evaluations of the EMA weights: held-out conversations, and the code corpus if any."""
    graphdef, params, eps = trainer.graphdef, trainer.ema_params(), trainer.cfg.eps
    facts: dict[str, Any] = {}
    if len(heldout):
        ev = sft_eval_set(heldout, top_token, ropts.eval_windows)
        facts["sft_heldout"] = evaluate(graphdef, params, ev, tok, eps=eps)
    if code is not None:
        ev = code.eval_set(ropts.eval_windows, ropts.eval_infill_cases)
        facts["heldout"] = evaluate(graphdef, params, ev, code.tok, eps=eps, return_samples=8)
    return facts
