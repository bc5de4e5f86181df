"""DiffuCoder's tokenizer, loaded as a Qwen2 byte-level BPE without running code from the model dir.

The published checkpoints name a custom ``DreamTokenizer`` (``tokenization_dream.py``) in
``tokenizer_config.json``; transformers' AutoTokenizer will only load that with ``trust_remote_code``.
That class is a copy of transformers' slow ``Qwen2Tokenizer``: NFC normalisation, the Qwen2
pre-tokenisation regex, GPT-2 byte-to-unicode mapping, BPE merges by rank, and added/special tokens
matched verbatim before BPE. We build exactly that pipeline with the ``tokenizers`` library from the data
files (``vocab.json``, ``merges.txt``, ``added_tokens.json``, ``tokenizer_config.json``; or
``tokenizer.json`` when present). No Python file from the directory is imported.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from model_runtime.errors import ModelError

# Qwen2's PRETOKENIZE_REGEX, as in tokenization_qwen2.py / tokenization_dream.py.
PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"""
    r"""\s+(?!\S)|\s+"""
)

# Qwen2.5's 22 added tokens (ids 151643..151664 in the real vocabulary), then Dream's additions.
QWEN_SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
)
DREAM_SPECIAL_TOKENS = ("<|beginoftext|>", "<|mask|>")
INSTRUCT_SPECIAL_TOKENS = ("<|dlm_pad|>",)
# Qwen2 marks these two as plain added tokens (special=False); everything else is special.
_NON_SPECIAL = (
    {"<tool_call>", "</tool_call>"}
    | {t for t in QWEN_SPECIAL_TOKENS if t.startswith("<|fim")}
    | {"<|repo_name|>", "<|file_sep|>"}
)

SYSTEM_PROMPT = "You are a helpful assistant."


def chat_prompt(messages: Sequence[dict[str, str]]) -> str:
    """The Instruct prompt, byte-exact with the DiffuCoder README for a single user turn.

    The README writes ``<|im_start|>user\\n{query.strip()}\\n<|im_end|>`` (note the newline before
    ``<|im_end|>``) and ends with ``<|im_start|>assistant\\n``. Earlier assistant turns of a multi-turn
    chat are closed with a plain ``<|im_end|>``, as ChatML does; a system message replaces the default.
    """
    return "".join(text for text, _ in chat_parts(messages))


def chat_parts(messages: Sequence[dict[str, str]]) -> list[tuple[str, bool]]:
    """The chat prompt as (text, is_content) pieces: the template's markup, and what people wrote."""
    if not messages:
        raise ValueError("messages: at least one message is needed")
    system = SYSTEM_PROMPT
    turns = list(messages)
    if turns[0].get("role") == "system":
        system = str(turns.pop(0).get("content", ""))
    parts = [("<|im_start|>system\n", False), (system, True), ("<|im_end|>\n", False)]
    for i, msg in enumerate(turns):
        role, content = msg.get("role"), msg.get("content")
        if role not in ("user", "assistant"):
            raise ValueError(f"messages[{i}].role: expected 'user' or 'assistant', got {role!r}")
        if not isinstance(content, str):
            raise ValueError(f"messages[{i}].content: expected a string, got {type(content).__name__}")
        if role == "user":
            parts += [("<|im_start|>user\n", False), (content.strip(), True), ("\n<|im_end|>\n", False)]
        else:
            parts += [("<|im_start|>assistant\n", False), (content, True), ("<|im_end|>\n", False)]
    if turns and turns[-1].get("role") != "user":
        raise ValueError("messages: the last message must come from the user")
    parts.append(("<|im_start|>assistant\n", False))
    return parts


class DreamTokenizer:
    """Byte-level BPE with DiffuCoder's special tokens; ids for mask/pad/eos come from config.json."""

    def __init__(self, tokenizer: Tokenizer, *, mask_id: int, pad_id: int, eos_id: int) -> None:
        self._tok = tokenizer
        self._text_tok: Tokenizer | None = None
        self.mask_id = mask_id
        self.pad_id = pad_id
        self.eos_id = eos_id
        self.im_start_id = tokenizer.token_to_id("<|im_start|>")
        self.im_end_id = tokenizer.token_to_id("<|im_end|>")
        self.dlm_pad_id = tokenizer.token_to_id("<|dlm_pad|>")
        self.mask_token = tokenizer.id_to_token(mask_id) or "<|mask|>"
        self._newlines: tuple[int, ...] | None = None
        self._texts: tuple[str, ...] | None = None

    # -- encoding -------------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        """Raw BPE ids; like DreamTokenizer it adds no BOS/EOS."""
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [e.ids for e in self._tok.encode_batch(list(texts), add_special_tokens=False)]

    def chat_prompt(self, messages: Sequence[dict[str, str]]) -> str:
        return chat_prompt(messages)

    def encode_chat(self, messages: Sequence[dict[str, str]]) -> list[int]:
        """The chat prompt's ids. What people wrote never becomes a control token: a message holding
        ``<|im_start|>`` or ``<|im_end|>`` is encoded as that text, so it cannot forge a turn."""
        parts = chat_parts(messages)
        controls = self._control_strings()
        if not any(content and any(sp in text for sp in controls) for text, content in parts):
            return self.encode("".join(text for text, _ in parts))  # byte-exact with the reference
        ids: list[int] = []
        for text, content in parts:
            ids += self.encode_text(text) if content else self.encode(text)
        return ids

    def encode_text(self, text: str) -> list[int]:
        """Ids of ``text`` as text: the string of any added token in it (``<|endoftext|>``, ``<|mask|>``,
        ``<|im_end|>``, ``<|file_sep|>``, ...) is encoded as its characters, never as that token. Text
        without such strings gets the same ids as ``encode``."""
        if self._text_tok is None:
            # A copy that reads every added token's string as text (a flag on the shared tokenizer would
            # race with other threads encoding prompts at the same time). Qwen2 leaves the FIM and
            # repository markers plain added tokens, which that flag does not split: mark them special.
            text_tok = Tokenizer.from_str(self._tok.to_str())
            text_tok.add_special_tokens(
                [AddedToken(c, special=True, normalized=False) for c in self._control_strings()]
            )
            text_tok.encode_special_tokens = True
            self._text_tok = text_tok
        return self._text_tok.encode(text, add_special_tokens=False).ids

    def _control_strings(self) -> list[str]:
        return [t.content for t in self._tok.get_added_tokens_decoder().values()]

    # -- decoding -------------------------------------------------------------------------------
    def decode(self, ids: Iterable[int], *, skip_special_tokens: bool = False) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_strings(self, ids: Iterable[int]) -> list[str]:
        """One printable piece per id (a byte-level piece of a multi-byte character decodes to U+FFFD)."""
        return [self._tok.decode([i], skip_special_tokens=False) for i in ids]

    def id_to_token(self, token_id: int) -> str | None:
        return self._tok.id_to_token(token_id)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def stop_ids(self, *, chat: bool) -> tuple[int, ...]:
        """Tokens the answer is cut at: pad/end-of-turn for Instruct chats, end-of-text for raw code."""
        ids = [self.eos_id]
        if self.dlm_pad_id is not None:
            ids.append(self.dlm_pad_id)
        if chat and self.im_end_id is not None:
            ids.append(self.im_end_id)
        return tuple(ids)

    def token_texts(self) -> tuple[str, ...]:
        """Every token's own text, by id (decoded once, then kept)."""
        if self._texts is None:
            size = self._tok.get_vocab_size(with_added_tokens=True)
            self._texts = tuple(self._tok.decode_batch([[i] for i in range(size)], skip_special_tokens=False))
        return self._texts

    def newlines(self) -> tuple[int, ...]:
        """How many newlines each token's text holds (``\n``, ``):\n``, ``\n\n``...), by id: where lines
        end."""
        if self._newlines is None:
            self._newlines = tuple(t.count("\n") for t in self.token_texts())
        return self._newlines

    def postprocess(self, ids: Sequence[int], *, chat: bool) -> str:
        """Cut a generated region at its first stop token, as the README's post-processing does, and
        decode it."""
        stops = set(self.stop_ids(chat=chat))
        cut = next((i for i, t in enumerate(ids) if t in stops), len(ids))
        return self.decode(ids[:cut], skip_special_tokens=False)

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)


def _pre_tokenizer(pattern: str) -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


def _byte_level_pipeline(tok: Tokenizer) -> Tokenizer:
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = _pre_tokenizer(PRETOKENIZE_REGEX)
    tok.decoder = decoders.ByteLevel()
    return tok


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelError(f"{path.name}: cannot read it as JSON ({exc})") from None
    except RecursionError:
        raise ModelError(f"{path.name}: nested too deep to be a tokenizer file") from None


# Token ids are unsigned 32-bit in the tokenizers library, and no vocabulary comes near that.
MAX_TOKEN_ID = 2**31 - 1


def _token_id(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_TOKEN_ID:
        raise ModelError(f"{where}: a token id must be an integer in 0..{MAX_TOKEN_ID}, got {value!r}")
    return value


def _added_tokens(model_dir: Path) -> dict[str, tuple[int, bool]]:
    """content -> (id, special) from added_tokens.json and tokenizer_config.json's added_tokens_decoder."""
    added: dict[str, tuple[int, bool]] = {}
    cfg_path = model_dir / "tokenizer_config.json"
    if cfg_path.is_file():
        decoder = _read_json(cfg_path).get("added_tokens_decoder") or {}
        for key, entry in decoder.items():
            try:
                token_id = int(key)
                added[str(entry["content"])] = (token_id, bool(entry.get("special", True)))
            except (KeyError, TypeError, ValueError):
                raise ModelError(
                    f"tokenizer_config.json: added_tokens_decoder[{key!r}] is malformed"
                ) from None
            _token_id(token_id, f"tokenizer_config.json: added_tokens_decoder[{key!r}]")
    path = model_dir / "added_tokens.json"
    if path.is_file():
        data = _read_json(path)
        if not isinstance(data, dict):
            raise ModelError("added_tokens.json: expected an object mapping tokens to ids")
        for content, token_id in data.items():
            _token_id(token_id, f"added_tokens.json: {content!r}")
            special = added.get(content, (token_id, content not in _NON_SPECIAL))[1]
            added[content] = (token_id, special)
    return added


def load_tokenizer(model_dir: str | Path, *, mask_id: int, pad_id: int, eos_id: int) -> DreamTokenizer:
    """Load the tokenizer files of a DiffuCoder/Dream directory (never its Python files)."""
    model_dir = Path(model_dir)
    tokenizer_json = model_dir / "tokenizer.json"
    if tokenizer_json.is_file():
        try:
            tok = Tokenizer.from_file(str(tokenizer_json))
        except Exception as exc:  # the Rust library raises plain Exception subclasses
            raise ModelError(f"tokenizer.json: cannot load it ({exc})") from None
    else:
        vocab_path, merges_path = model_dir / "vocab.json", model_dir / "merges.txt"
        for p in (vocab_path, merges_path):
            if not p.is_file():
                raise ModelError(
                    f"no tokenizer in {model_dir}: {p.name} is missing "
                    "(expected vocab.json + merges.txt, or tokenizer.json)"
                )
        vocab = _read_json(vocab_path)
        if not isinstance(vocab, dict):
            raise ModelError("vocab.json: expected an object mapping tokens to ids")
        for content, token_id in vocab.items():
            _token_id(token_id, f"vocab.json: {content!r}")
        merges = []
        try:
            merges_text = merges_path.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise ModelError(f"merges.txt: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
        for lineno, line in enumerate(merges_text.splitlines(), 1):
            if not line or line.startswith("#version"):
                continue
            pair = line.split(" ")
            if len(pair) != 2:
                raise ModelError(f"merges.txt:{lineno}: expected two space-separated symbols, got {line!r}")
            merges.append((pair[0], pair[1]))
        added = _added_tokens(model_dir)
        # Put added tokens into the BPE vocabulary with their published ids, so add_special_tokens
        # below reuses those ids instead of appending new ones.
        vocab = dict(vocab)
        for content, (token_id, _) in added.items():
            vocab[content] = token_id
        bpe = models.BPE(vocab=vocab, merges=merges, unk_token=None, fuse_unk=False, byte_fallback=False)
        tok = _byte_level_pipeline(Tokenizer(bpe))
        tok.add_special_tokens(
            [
                AddedToken(c, special=s, normalized=False)
                for c, (_, s) in sorted(added.items(), key=lambda kv: kv[1][0])
            ]
        )
        for content, (token_id, _) in added.items():
            if tok.token_to_id(content) != token_id:
                raise ModelError(
                    f"added token {content!r}: expected id {token_id}, "
                    f"the vocabulary gives {tok.token_to_id(content)}"
                )
    for name, token_id in (("mask_token_id", mask_id), ("pad_token_id", pad_id), ("eos_token_id", eos_id)):
        if tok.id_to_token(token_id) is None:
            raise ModelError(f"config.json {name}={token_id} is not a token of the tokenizer")
    return DreamTokenizer(tok, mask_id=mask_id, pad_id=pad_id, eos_id=eos_id)


# For training new vocabularies only: Qwen2's pattern with the newlines that follow punctuation split off
# into a piece of their own (the same newline run Qwen2 would have appended). No learned merge then joins
# a newline to the symbols before it, so under Qwen2's own pattern (what every load uses) ``):`` and a
# following newline still become separate tokens: a prompt that stops at the end of a line, and an infill
# suffix that starts with its newline, are tokenized exactly as the same text inside a file.
TRAIN_PRETOKENIZE_REGEX = PRETOKENIZE_REGEX.replace(
    r" ?[^\s\p{L}\p{N}]+[\r\n]*|", r" ?[^\s\p{L}\p{N}]+|(?<=[^\s\p{L}\p{N}])[\r\n]+|"
)


def train_bpe(texts: Iterable[str], vocab_size: int, *, instruct: bool = True) -> Tokenizer:
    """Train a Qwen2-style byte-level BPE, then append DiffuCoder's special tokens after the merges.

    The special tokens get consecutive ids right after the learned vocabulary, in the published order
    (Qwen2.5's 22, ``<|beginoftext|>``, ``<|mask|>``, and ``<|dlm_pad|>`` for Instruct-style models).
    Merges are learned under ``TRAIN_PRETOKENIZE_REGEX``; the returned tokenizer uses Qwen2's pattern, as
    a loaded one does.
    """
    tok = _byte_level_pipeline(Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False)))
    qwen_pre = tok.pre_tokenizer
    tok.pre_tokenizer = _pre_tokenizer(TRAIN_PRETOKENIZE_REGEX)
    specials = QWEN_SPECIAL_TOKENS + DREAM_SPECIAL_TOKENS + (INSTRUCT_SPECIAL_TOKENS if instruct else ())
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(specials),
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tok.train_from_iterator(texts, trainer=trainer)
    tok.pre_tokenizer = qwen_pre
    tok.add_special_tokens([AddedToken(c, special=c not in _NON_SPECIAL, normalized=False) for c in specials])
    return tok


def save_published_layout(tok: Tokenizer, out_dir: str | Path, *, model_max_length: int = 131072) -> None:
    """Write vocab.json, merges.txt, added_tokens.json and a tokenizer_config.json naming DreamTokenizer."""
    out_dir = Path(out_dir)
    data = json.loads(tok.to_str())
    added = {t["content"]: (t["id"], t["special"]) for t in data["added_tokens"]}
    vocab = {k: v for k, v in data["model"]["vocab"].items() if k not in added}
    merges = [m if isinstance(m, str) else " ".join(m) for m in data["model"]["merges"]]
    (out_dir / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    (out_dir / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n", encoding="utf-8")
    (out_dir / "added_tokens.json").write_text(
        json.dumps({c: i for c, (i, _) in sorted(added.items(), key=lambda kv: kv[1][0])}, indent=2) + "\n",
        encoding="utf-8",
    )
    decoder = {
        str(i): {
            "content": c,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": s,
        }
        for c, (i, s) in sorted(added.items(), key=lambda kv: kv[1][0])
    }
    cfg = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": decoder,
        "auto_map": {"AutoTokenizer": ["tokenization_dream.DreamTokenizer", None]},
        "bos_token": "<|beginoftext|>",
        "chat_template": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|endoftext|>",
        "errors": "replace",
        "mask_token": "<|mask|>",
        "model_max_length": model_max_length,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "DreamTokenizer",
        "unk_token": None,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")
