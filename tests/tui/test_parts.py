"""The chat's plain parts: canvas rendering, settings and keymap parsing, the SQLite store."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console
from rich.style import Style
from rich.text import Text

from assistant.client import Step, Waiting
from tests.assistant.helpers import REPO
from tui import keys
from tui.render import MASK_GLYPH, SPECIAL_GLYPH, CanvasStyles, Trace, canvas_text, header_text
from tui.settings import ChatSettings, SettingsError, apply_saved, parse_field, read_chat_config
from tui.store import ChatStore, StoreError, decode_trace, encode_trace

STYLES = CanvasStyles(mask=Style(color="grey37"), fresh=Style(bgcolor="green"), special=Style(color="red"))


def style_at(text: Text, index: int) -> Style:
    return text.get_style_at_offset(Console(), index)


def test_canvas_marks_masked_fresh_and_plain_tokens_and_folds_special_tokens() -> None:
    # "def f" committed earlier, "(x)" in this step, two masks, then two pad tokens (one fresh).
    canvas = "def f(x)" + MASK_GLYPH * 2 + "<|im_end|><|endoftext|>"
    step = Step(
        id="r", step=3, steps=8, canvas=canvas, masks=2, unmasked=[[5, 8], [10, 20]], masked=[[8, 10]]
    )
    text = canvas_text(step, STYLES)
    assert text.plain == "def f(x)" + MASK_GLYPH * 2 + SPECIAL_GLYPH * 2
    assert style_at(text, 0).bgcolor is None and style_at(text, 0).color is None  # plain
    assert style_at(text, 5).bgcolor.name == "green"  # unmasked in this step
    assert style_at(text, 8).color.name == "grey37"  # still masked
    assert style_at(text, 10).bgcolor.name == "green"  # a pad token committed in this step
    assert style_at(text, 11).color.name == "red"  # an older pad token


def test_trace_counts_tokens_per_step_and_the_header_says_step_revealed_and_rate() -> None:
    trace = Trace(total=10)
    for i, masks in enumerate((7, 7, 2, 0)):
        trace.add(Step(id="r", step=i, steps=4, canvas="", masks=masks, seconds=0.5))  # each step's own time
    assert trace.unmasked_per_step() == [3, 0, 5, 2]
    assert trace.unmasked_per_step(upto=1) == [3, 0]
    assert header_text(trace, 2).plain == "step 3/4 · 8/10 tokens revealed · 5 tok/s"  # 8 tokens in 1.5 s
    assert header_text(Trace(total=4)).plain == "waiting for the first step…"
    # Waiting for a compile: the rate never counts it; the header says what it waits for, and how long.
    why = Waiting("r", "compiling", "compiling the program for 1 x 300 tokens", 6.4)
    waiting = Trace(total=4, waiting=why)
    assert header_text(waiting).plain == "compiling the program for 1 x 300 tokens (about 6 s)…"
    # The fast decoder ends a block when it is full, so it counts blocks, not a fixed number of steps.
    fast = Trace(total=64)
    fast.add(Step(id="r", step=0, steps=64, canvas="", masks=63, seconds=0.1, block=0, blocks=2))
    assert header_text(fast).plain == "step 1 · block 1/2 · 1/64 tokens revealed · 10 tok/s"


def test_the_daemon_warms_the_program_the_chat_asks_for_first() -> None:
    from assistant.server.warmup import CHAT_REQUEST

    # The daemon cannot import the chat (dependencies point the other way): the two must agree.
    assert ChatSettings().request_params() == CHAT_REQUEST


def test_settings_are_checked_like_the_runtime_checks_them() -> None:
    assert ChatSettings().request_params() == {
        "max_new_tokens": 256,
        "temperature": 0.4,
        "top_p": 0.95,
        "alg": "entropy",
        "block_length": 32,  # no decoder: the daemon's model picks it, maybe the fast one
        "threshold": 0.9,
    }
    assert "block_length" not in ChatSettings(decoder="reference").request_params()
    fast = ChatSettings(decoder="fast", steps=64)
    assert fast.request_params()["block_length"] == 32 and fast.request_params()["threshold"] == 0.9
    with pytest.raises(SettingsError, match=r"^top_p: must be in \(0, 1\], got 1.5"):
        ChatSettings(top_p=1.5)
    with pytest.raises(SettingsError, match="alg: must be one of origin, maskgit_plus"):
        ChatSettings(alg="greedy")
    with pytest.raises(SettingsError, match="temperature: must be a number, got 'hot'"):
        ChatSettings.from_mapping({"temperature": "hot"})
    assert parse_field("top_k", "") is None and parse_field("steps", " 12 ") == 12
    with pytest.raises(SettingsError, match="max_new_tokens: must be set"):
        parse_field("max_new_tokens", "")
    with pytest.raises(SettingsError, match="temperature: must be a number, got 'x'"):
        parse_field("temperature", "x")
    settings, problem = apply_saved(ChatSettings(), {"steps": 0})
    assert settings == ChatSettings() and "ignored the saved chat settings (steps: must be >= 1" in problem


def test_config_file_chat_and_keymap_tables(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    assert read_chat_config(path, keys.DESCRIPTIONS).keymap == {}  # no file: defaults
    path.write_text('model = "fake"\n[chat]\nsteps = 32\ndecoder = "fast"\n[keymap]\nreplay = "f6, ctrl+r"\n')
    config = read_chat_config(path, keys.DESCRIPTIONS)
    assert config.settings.steps == 32 and config.settings.decoder == "fast"
    assert config.keymap == {"replay": "f6,ctrl+r"}
    path.write_text("[chat]\ntemprature = 0.2\n")
    with pytest.raises(SettingsError, match=r"config.toml: \[chat\] temprature: unknown setting"):
        read_chat_config(path, keys.DESCRIPTIONS)
    path.write_text("[chat]\nthreshold = 2.0\n")
    with pytest.raises(SettingsError, match=r"\[chat\] threshold: must be in \(0, 1\], got 2.0"):
        read_chat_config(path, keys.DESCRIPTIONS)
    path.write_text('[keymap]\nreplay-answer = "f6"\n')
    with pytest.raises(
        SettingsError, match=r"\[keymap\] replay-answer: unknown binding id \(known: cancel, "
    ):
        read_chat_config(path, keys.DESCRIPTIONS)
    path.write_text("[keymap]\nreplay = 6\n")
    with pytest.raises(SettingsError, match=r"\[keymap\] replay: expected a key string"):
        read_chat_config(path, keys.DESCRIPTIONS)
    path.write_text("[chat\n")
    with pytest.raises(SettingsError, match="invalid TOML"):
        read_chat_config(path, keys.DESCRIPTIONS)


def test_store_keeps_conversations_histories_settings_and_prompts(tmp_path: Path) -> None:
    store = ChatStore(tmp_path / "data" / "chat.sqlite3")
    first = store.new_conversation("Write   quicksort\nin Python " + "please " * 20)
    second = store.new_conversation("Another")
    trace = Trace(
        total=4,
        frames=[
            Step(
                id="req",
                step=0,
                steps=2,
                canvas="ab░░",
                masks=2,
                unmasked=[[0, 2]],
                masked=[[2, 4]],
                seconds=0.1,
            )
        ],
    )
    store.add_message(first, "user", "Write quicksort")
    answer = store.add_message(
        first, "assistant", "def qs(): ...", finish_reason="stop", stats={"steps": 2}, trace=trace
    )
    assert [c.id for c in store.conversations()] == [first, second]  # the last updated first
    info = store.conversation(first)
    assert info is not None and info.messages == 2 and info.title.startswith("Write quicksort in Python")
    assert len(info.title) == 60 and info.title.endswith("…")
    messages = store.messages(first)
    assert [(m.role, m.has_trace) for m in messages] == [("user", False), ("assistant", True)]
    assert messages[1].stats == {"steps": 2} and store.trace(answer) == trace
    assert decode_trace(encode_trace(trace)) == trace
    store.save_settings({"steps": 8})
    for i in range(3):
        store.add_prompt(f"prompt {i}")
    store.close()

    reopened = ChatStore(tmp_path / "data" / "chat.sqlite3")
    assert reopened.saved_settings() == {"steps": 8}
    assert reopened.prompts() == ["prompt 0", "prompt 1", "prompt 2"]
    reopened.delete_conversation(first)
    assert reopened.messages(first) == [] and reopened.conversation(first) is None
    assert (tmp_path / "data").stat().st_mode & 0o777 == 0o700
    reopened.close()
    (tmp_path / "junk.sqlite3").write_text("not a database, just text that is long enough" * 20)
    with pytest.raises(StoreError, match="cannot open the chat database"):
        ChatStore(tmp_path / "junk.sqlite3")


def test_the_chat_never_imports_jax() -> None:
    """Rule 1 of the house: clients start fast and never touch the accelerator."""
    code = (
        "import sys, tui.app, tui.once, assistant.cli.chat; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('jax', 'flax', 'jaxlib')))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_a_models_chat_defaults_sit_between_the_built_in_ones_and_config_toml(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text("[chat]\ntemperature = 0.3\n", encoding="utf-8")
    config = read_chat_config(path, keys.DESCRIPTIONS)
    model = {"temperature": 0.1, "max_new_tokens": 96, "steps": 48, "top_p": 0.9, "alg": "maskgit_plus"}
    settings, problem = config.for_model(model)
    assert problem == ""
    # The model's canvas, steps and sampler; the user's own temperature wins over the model's.
    assert (settings.max_new_tokens, settings.steps, settings.temperature) == (96, 48, 0.3)
    assert (settings.top_p, settings.alg, settings.decoder) == (0.9, "maskgit_plus", "model")
    # The settings screen's saved values still win over both.
    assert apply_saved(settings, {"temperature": 0.7})[0].temperature == 0.7
    # A user who sets the canvas keeps one step per token: the model's steps belong to its own canvas.
    path.write_text("[chat]\nmax_new_tokens = 64\n", encoding="utf-8")
    settings, _ = read_chat_config(path, keys.DESCRIPTIONS).for_model(model)
    assert (settings.max_new_tokens, settings.steps, settings.temperature) == (64, None, 0.1)


def test_chat_defaults_the_chat_cannot_take_are_left_out_and_explained(tmp_path: Path) -> None:
    config = read_chat_config(tmp_path / "absent.toml", keys.DESCRIPTIONS)
    settings, problem = config.for_model({"temperature": -1.0})
    assert settings == ChatSettings() and "ignored the model's chat defaults (temperature:" in problem
    # Keys the chat has no setting for (a newer model's) are not its business.
    assert config.for_model({"eps": 0.01, "temperature": 0.2})[0].temperature == 0.2


def test_an_answer_whose_code_does_not_parse_gets_a_second_decode_in_longer_blocks() -> None:
    from assistant.code_blocks import unparsed_code

    # What needs a second decode: a python (or unlabelled) block none of whose closed blocks parses.
    assert unparsed_code("```python\ndef f(x)\n    return x\n```")
    assert unparsed_code("Sure:\n\n```\ndefsum(xs):\n    return sum(xs)\n```")
    assert unparsed_code("```python\ndef f(x):\n    return (x")  # cut short inside the block
    assert not unparsed_code("```python\ndef f(x):\n    return x\n```")
    assert not unparsed_code("```python\nx = 1\n```")  # parses; defining nothing is no reason
    assert not unparsed_code("A list is a mutable sequence.")  # no code at all
    assert not unparsed_code("```bash\nls -l |\n```")  # not python
    assert not unparsed_code("```python\ndef f(:\n```\n\n```python\ndef f(x):\n    pass\n```")
    # Nesting too deep for the parser (RecursionError inside ast.parse) is code that does not parse.
    assert unparsed_code("```python\nx = a" + ".b" * 200_000 + "\n```")

    bundled = ChatSettings(max_new_tokens=192, steps=192, temperature=0.0, block_length=64)
    assert bundled.retry_settings() is None  # 0: never
    on = bundled.replace(retry_block=128)
    again = on.retry_settings()
    assert again is not None
    # The fast decoder in blocks of 128 on the canvas rounded up to whole blocks, steps scaled with it.
    assert (again.decoder, again.block_length, again.max_new_tokens, again.steps) == ("fast", 128, 256, 256)
    assert (again.temperature, again.retry_block) == (0.0, 0)  # the rest as it was; no third
    assert on.replace(steps=None).retry_settings().steps is None  # one step per token stays so
    assert on.replace(max_new_tokens=160, steps=16).retry_settings().steps == 26
    broken = "```python\ndef f(x)\n    return x\n```"
    assert on.retry_for(broken, "stop") == again and on.retry_for(broken, "length") == again
    assert on.retry_for(broken, "cancelled") is None and on.retry_for(broken, "time") is None
    assert on.retry_for("```python\ndef f(x):\n    return x\n```", "stop") is None
    assert bundled.retry_for(broken, "stop") is None
    with pytest.raises(SettingsError, match="retry_block: must be 0 .never. or one of 1, 2, 4"):
        ChatSettings(retry_block=100)


def test_the_daemon_is_ready_once_the_chats_first_turns_and_second_decode_are_compiled() -> None:
    """What ready waits for of the chat is what the chat sends with its built-in settings: its first
    questions and a second turn (one row), two chats at once, and the second decode of an answer whose
    code does not parse; each warm-up task runs the program the chat's request runs."""
    import dataclasses

    from assistant.config import Config
    from assistant.server.fake_runtime import FakeRuntime
    from assistant.server.job_builder import build_job, warm_task
    from assistant.server.protocol import GenSpec
    from assistant.server.warmup import default_plan
    from assistant.wire import SamplingOptions, chat_prompts
    from tui.settings import ChatConfig

    defaults = {"max_new_tokens": 192, "steps": 192, "temperature": 0.0, "retry_block": 128}
    rt = FakeRuntime(
        max_context=1024, length_buckets=(256, 384, 512), default_decoder="fast", chat_defaults=defaults
    )
    chat, problem = ChatConfig().for_model(defaults)
    assert problem == "" and chat.retry_block == 128
    ready, rest = default_plan(rt, Config(), accelerator=False)
    messages = [{"role": "user", "content": "Write a function that adds two numbers."}]
    chats = [s for s in ready if s.client in ("the chat", "two chats at once", "the chat's second decode")]
    # The shortest first question (bucket 256), then at once the second decode there (its canvas rounded
    # up to blocks of 128): a first answer whose code does not parse is decoded again without waiting for
    # a compile (a newcomer's first `chat --once` waited 18 s for it). Then the longer first questions
    # (384) and a second turn (512), and two chats at once on the smallest.
    assert [(s.prompt_tokens + s.max_new_tokens, s.batch) for s in chats] == [
        (256, 1),
        (320, 1),
        (384, 1),
        (512, 1),
        (256, 2),
    ]
    assert chats[1].client == "the chat's second decode"
    # The chat asks for its own settings' shapes with the same rule (tui.backend.DaemonBackend.warm).
    first, talk = chat_prompts((256, 384, 512), chat.max_new_tokens)
    assert [s.prompt_tokens for s in chats[:1] + chats[2:4]] == first + talk
    for shape in chats:
        settings = chat.retry_settings() if shape.client == "the chat's second decode" else chat
        assert settings is not None
        body = settings.request_params()
        spec = GenSpec(
            mode="chat",
            canvas_tokens=body.pop("max_new_tokens"),
            sampling=SamplingOptions(**body),
            messages=messages,
        )
        job, _ = build_job(rt, spec, Config())
        task = warm_task(rt, shape, Config())
        assert task.params == job.params
    # The rest of the clients' first shapes: diffu generate's raw prompt, then the editors'.
    others = [s.client for s in ready if s not in chats]
    assert others[0] == "diffu generate --raw" and all(c.startswith("the editors") for c in others[1:])
    # Then a long conversation's (the context's bucket, 1024) and the later turns' second decodes.
    assert [s.client for s in rest][:3] == ["the chat, a long conversation"] + [
        "the chat's second decode"
    ] * 2
    # A model without a second decode warms none.
    rt.info = dataclasses.replace(
        rt.info, chat_defaults={"max_new_tokens": 192, "steps": 192, "temperature": 0.0}
    )
    ready, rest = default_plan(rt, Config(), accelerator=False)
    assert not [s for s in ready + rest if s.client == "the chat's second decode"]
