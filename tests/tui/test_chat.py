"""Pilot tests of ``diffu chat`` against the scripted in-process daemon (no JAX, no sockets)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest
from textual.containers import VerticalScroll
from textual.widgets import Button, Input, Markdown, OptionList, Select, Sparkline, Static
from textual.widgets.markdown import MarkdownFence

from tests.tui.conftest import TEST_SETTINGS
from tests.tui.helpers import (
    ANSWER,
    BROKEN,
    SECOND,
    ScriptedBackend,
    answered,
    ask,
    refused_steps,
    screen_text,
    unreachable,
    until,
)
from tui import screens
from tui.app import ChatApp
from tui.denoise import DenoiseView
from tui.screens import ConversationsScreen, HelpScreen, ReplayScreen, SettingsScreen
from tui.settings import ChatSettings
from tui.store import ChatStore
from tui.widgets import AnswerView, ConnectPanel, ErrorNotice, PromptInput, UserMessage

pytestmark = pytest.mark.asyncio
SIZE = (100, 34)


async def test_connect_shows_progress_then_the_model(make_app: Callable[..., ChatApp]) -> None:
    backend = ScriptedBackend(hold_connect=True)
    app = make_app(backend)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        # While the daemon loads and compiles, the panel shows its stage, progress and detail.
        await until(pilot, lambda: "compiling" in screen_text(app))
        shown = screen_text(app)
        assert "90%" in shown and "bucket 1x128" in shown and not app.connected
        await pilot.press(*"typing meanwhile")
        assert app.query_one(PromptInput).text == "typing meanwhile"
        backend.connect_gate.set()
        await until(pilot, lambda: app.connected)
        await pilot.pause()
        assert not app.query_one(ConnectPanel).display
        assert "fake-scripted" in screen_text(app).splitlines()[0]  # the model in the header


async def test_an_answer_denoises_live_then_becomes_markdown(make_app: Callable[..., ChatApp]) -> None:
    backend = ScriptedBackend(pause_at=7)
    app = make_app(backend)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        answer = await ask(pilot, "add two numbers")
        await until(pilot, lambda: backend.steps_sent == 8 and answer.denoise.redraws > 0)
        await pilot.pause(0.1)
        shown = screen_text(app)
        # Mid-generation: the step counter, revealed tokens, rate, masks and the sparkline are visible.
        assert "step 8/16 · 80/160 tokens revealed · 200 tok/s" in shown
        assert "░" in shown and "tokens unmasked per step" in shown
        assert app.query_one(Sparkline).data == [10.0] * 8
        assert "esc Cancel" in shown  # cancel is offered only while generating
        backend.resume.set()
        await until(pilot, lambda: not answer.live)
        assert not answer.query(DenoiseView)  # the canvas became the Markdown message
        fence = answer.query_one(MarkdownFence)
        assert fence.code == "def add(a, b):\n    return a + b" and fence.lexer == "python"
        await pilot.pause()
        shown = screen_text(app).split("add two numbers", 2)[2]  # below the header and the prompt
        assert "def add(a, b):" in shown and "░" not in shown and "```" not in shown
        assert "113 tokens · 16 steps · 0.8s · 141 tok/s" in shown and "esc Cancel" not in shown
        assert len(answer.trace) == 16  # every step was recorded, whatever was drawn


async def test_redraws_are_coalesced_and_typing_stays_responsive(
    make_app: Callable[..., ChatApp], monkeypatch: pytest.MonkeyPatch
) -> None:
    redraws: list[float] = []
    original = DenoiseView.show

    def show(self: DenoiseView, index: int) -> None:
        original(self, index)
        redraws.append(time.monotonic())

    monkeypatch.setattr(DenoiseView, "show", show)
    settings = ChatSettings(max_new_tokens=160, steps=160, temperature=0.0)
    backend = ScriptedBackend(step_delay=0.002)  # ~500 steps a second, far beyond a terminal's refresh
    app = make_app(backend, baseline=settings)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        answer = await ask(pilot, "add")
        await pilot.press(*"typing while it denoises")
        await until(pilot, lambda: not answer.live, timeout=10)
        assert app.query_one(PromptInput).text == "typing while it denoises"
        assert len(answer.trace) == 160  # every step recorded
    # Drawn at most ~30 times a second: only the final flush may follow its predecessor sooner.
    gaps = [b - a for a, b in zip(redraws, redraws[1:], strict=False)]
    assert 2 <= len(redraws) < 160 and sum(gap < 0.03 for gap in gaps) <= 1, gaps


async def test_multi_turn_context_and_prompt_history(
    make_app: Callable[..., ChatApp], store: ChatStore
) -> None:
    backend = ScriptedBackend()
    app = make_app(backend)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await answered(pilot, "first question")
        await answered(pilot, "second question")
        assert backend.requests[1].messages == [
            {"role": "user", "content": "first question"},
            {"role": "assistant", "content": ANSWER},
            {"role": "user", "content": "second question"},
        ]
        params = backend.requests[1].params
        assert params == {
            "max_new_tokens": 160,
            "steps": 16,
            "temperature": 0.0,
            "top_p": 0.95,
            "alg": "entropy",
            "block_length": 32,
            "threshold": 0.9,
        }
        # Both requests belong to the conversation's session (a newer one supersedes an older one).
        assert backend.requests[0].session == backend.requests[1].session == app.conversation_id
        prompt = app.query_one(PromptInput)
        await pilot.press(*"draft")
        await pilot.press("up")
        assert prompt.text == "second question"
        await pilot.press("up", "up")
        assert prompt.text == "first question"  # stays at the oldest
        await pilot.press("down", "down")
        assert prompt.text == "draft"  # past the newest: the draft comes back
        await pilot.press("shift+enter", *"line two")
        assert prompt.text == "draft\nline two"
        await pilot.press("up")  # on the second line: moves the cursor, does not recall
        assert prompt.text == "draft\nline two" and prompt.cursor_location[0] == 0
    # The prompt history survives a restart.
    assert store.prompts() == ["first question", "second question"]


async def test_the_log_follows_new_output_only_when_at_the_bottom(make_app: Callable[..., ChatApp]) -> None:
    backend = ScriptedBackend(pause_at=3)
    app = make_app(backend)
    async with app.run_test(size=(100, 24), notifications=True) as pilot:
        log = app.log_view
        for i in range(3):
            backend.pause_at = None
            await answered(pilot, f"question {i}")
        assert log.max_scroll_y > 0 and log.scroll_y == log.max_scroll_y
        backend.pause_at = 3
        backend.resume.clear()
        answer = await ask(pilot, "at the bottom")
        await until(pilot, lambda: backend.steps_sent >= 1)
        await pilot.pause(0.1)
        assert log.scroll_y == log.max_scroll_y  # followed the new turn
        log.scroll_up(animate=False)
        log.scroll_up(animate=False)
        await pilot.pause(0.05)
        scrolled_to = log.scroll_y
        assert scrolled_to < log.max_scroll_y
        backend.resume.set()
        await until(pilot, lambda: not answer.live)
        await pilot.pause(0.1)
        # The answer grew into Markdown below, but the reader who scrolled up stays where they were.
        assert log.scroll_y == scrolled_to and log.max_scroll_y > scrolled_to
        log.scroll_end(animate=False)
        await pilot.pause(0.05)
        await answered(pilot, "back at the bottom")
        await pilot.pause(0.1)
        assert log.scroll_y == log.max_scroll_y


async def test_escape_cancels_on_the_daemon_and_the_answer_leaves_the_context(
    make_app: Callable[..., ChatApp],
) -> None:
    backend = ScriptedBackend(pause_at=4)
    app = make_app(backend)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        answer = await ask(pilot, "long one")
        await until(pilot, lambda: backend.steps_sent == 5)
        await pilot.press("escape")
        await until(pilot, lambda: not answer.live)
        assert backend.cancelled == ["req-1"]
        assert answer.finish_reason == "cancelled" and not answer.answered
        assert "cancelled at step 5/16" in screen_text(app)
        assert answer.query(DenoiseView)  # the partial canvas stays visible, with its history
        backend.pause_at = None
        await answered(pilot, "again")
        # The cancelled answer is not sent back as context.
        assert [m["role"] for m in backend.requests[1].messages] == ["user", "user"]
        stored = app.store.messages(app.conversation_id or "")
        assert [(m.role, m.finish_reason) for m in stored] == [
            ("user", None),
            ("assistant", "cancelled"),
            ("user", None),
            ("assistant", "stop"),
        ]
    # Reopened later, the cancelled answer still shows its last canvas and where it stopped.
    reopened = make_app(ScriptedBackend(), conversation_id=app.conversation_id)
    async with reopened.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: len(reopened.query(AnswerView)) == 2)
        first = reopened.query(AnswerView).first()
        assert first.query(DenoiseView) and len(first.trace) == 5
        assert "cancelled at step 5/16" in screen_text(reopened) and "cancelling" not in screen_text(reopened)


async def test_an_answer_cancelled_before_its_first_step_offers_no_replay(
    make_app: Callable[..., ChatApp],
) -> None:
    backend = ScriptedBackend(compile_first=True)
    app = make_app(backend)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        answer = await ask(pilot, "one")
        await until(pilot, lambda: "compiling the program" in screen_text(app))
        await pilot.press("escape")
        await until(pilot, lambda: not answer.live)
        assert answer.finish_reason == "cancelled" and "cancelled after 0 steps" in screen_text(app)
        assert "⟲ replay" not in screen_text(app) and not answer.replayable  # nothing to replay
        await pilot.press("ctrl+r")
        assert not isinstance(app.screen, ReplayScreen) and "No answer to replay yet" in screen_text(app)
    reopened = make_app(ScriptedBackend(), conversation_id=app.conversation_id)
    async with reopened.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: len(reopened.query(AnswerView)) == 1)
        assert "⟲ replay" not in screen_text(reopened)


async def test_the_welcome_line_explains_every_glyph_of_the_canvas() -> None:
    from tui.app import WELCOME
    from tui.render import MASK_GLYPH, SPECIAL_GLYPH

    assert MASK_GLYPH in WELCOME and SPECIAL_GLYPH in WELCOME and "highlighted" in WELCOME
    assert "ctrl+n starts a new one for a new topic" in WELCOME


async def test_sending_while_answering_is_refused_with_a_hint(make_app: Callable[..., ChatApp]) -> None:
    backend = ScriptedBackend(pause_at=2)
    app = make_app(backend)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await ask(pilot, "one")
        await pilot.press(*"two", "enter")
        await pilot.pause(0.1)
        assert len(backend.requests) == 1 and app.query_one(PromptInput).text == "two"
        assert "Still answering: press Escape" in screen_text(app)  # a toast


async def test_replay_scrubs_plays_pauses_and_switches_answers(
    make_app: Callable[..., ChatApp], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A frame a second: the test reads what it shows between frames, however slow the machine is.
    monkeypatch.setattr(screens, "REPLAY_SECONDS", 16.0)
    monkeypatch.setattr(screens, "MIN_FPS", 1.0)
    app = make_app(ScriptedBackend())
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        first = await answered(pilot, "one")
        await answered(pilot, "two")
        await pilot.press("ctrl+r")
        screen = app.screen
        assert isinstance(screen, ReplayScreen) and screen.answer_index == 1  # the last answer
        # It plays from the first step at once; home stops it there.
        assert screen.playing and "Replay · answer 2 of 2" in screen_text(app)
        await pilot.press("home")
        assert not screen.playing and "step 1/16" in screen_text(app)
        await pilot.press("right", "right", "right")
        assert screen.frame == 3 and "step 4/16 · 40/160 tokens revealed" in screen_text(app)
        await pilot.press("left")
        assert screen.frame == 2
        await pilot.press("end")
        assert screen.frame == 15 and "░" not in screen_text(app)
        await pilot.press("home")
        assert screen.frame == 0
        await pilot.press("space")
        await until(pilot, lambda: screen.frame >= 1)  # playing on its own
        await pilot.press("space")
        paused_at = screen.frame
        await pilot.pause(0.3)
        assert not screen.playing and screen.frame == paused_at and "❚❚ paused" in screen_text(app)
        await pilot.press("end", "left", "space")  # a frame before the end, then play
        await until(pilot, lambda: not screen.playing)
        assert screen.frame == 15  # played on to the end, then stopped
        await pilot.press("pageup")
        assert screen.answer_index == 0 and screen.trace is first.trace
        assert "Replay · answer 1 of 2" in screen_text(app)
        await pilot.press("escape")
        assert not isinstance(app.screen, ReplayScreen)
        # The "⟲ replay" link under an answer opens that answer's history.
        footer = first.query_one(".answer--footer", Static)
        await pilot.click(footer, offset=(str(footer.render()).index("⟲") + 1, 0))
        assert isinstance(app.screen, ReplayScreen) and app.screen.answer_index == 0


async def test_new_chat_list_and_reopen_with_replay_from_the_database(
    make_app: Callable[..., ChatApp], store: ChatStore
) -> None:
    backend = ScriptedBackend()
    app = make_app(backend)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await answered(pilot, "the first chat")
        first_id = app.conversation_id
        await pilot.press("ctrl+n")
        await pilot.pause()
        assert app.conversation_id is None and not app.query(AnswerView) and not app.query(UserMessage)
        await answered(pilot, "the second chat")
        assert backend.requests[1].messages == [{"role": "user", "content": "the second chat"}]
        await pilot.press("ctrl+o")
        screen = app.screen
        assert isinstance(screen, ConversationsScreen)
        shown = screen_text(app)
        assert shown.index("the second chat") < shown.index("the first chat")  # newest first
        await pilot.press("down", "enter")
        await until(pilot, lambda: app.conversation_id == first_id and app.query(AnswerView))
        assert [w.text for w in app.query(UserMessage)] == ["the first chat"]
        assert "def add(a, b):" in screen_text(app)
    # A new session: the conversation is reopened from SQLite and its history replays from there.
    app2 = make_app(ScriptedBackend(), conversation_id=first_id)
    async with app2.run_test(size=SIZE, notifications=True) as pilot:
        await until(pilot, lambda: app2.query(AnswerView))
        answer = app2.query_one(AnswerView)
        assert answer.message_id is not None and not answer.trace.frames
        await pilot.press("ctrl+r")
        assert isinstance(app2.screen, ReplayScreen) and len(app2.screen.trace) == 16
        await pilot.press("end")
        assert "Call it as `add(2, 3)`." in screen_text(app2)
        await pilot.press("escape")
        await answered(pilot, "and a follow-up")
    assert [m.content for m in store.messages(first_id or "") if m.role == "user"] == [
        "the first chat",
        "and a follow-up",
    ]


async def test_copy_answer_and_code_blocks_and_jump_between_them(make_app: Callable[..., ChatApp]) -> None:
    app = make_app(ScriptedBackend())
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await pilot.press("ctrl+l")
        assert "No answer to copy yet." in screen_text(app)
        await answered(pilot, "one")
        await answered(pilot, "two")
        await pilot.press("ctrl+l")
        assert app.clipboard == SECOND
        await pilot.press("ctrl+g")  # nothing selected: the last code block
        assert app.clipboard == "total = sum(values)"
        await pilot.press("ctrl+up")
        assert app.selected_fence is not None and app.selected_fence.code == "total = sum(values)"
        await pilot.press("ctrl+up")
        assert app.selected_fence.code == "def add(a, b):\n    return a + b"
        assert app.selected_fence.has_class("-selected")
        await pilot.press("ctrl+g")
        assert app.clipboard == "def add(a, b):\n    return a + b"
        assert "Copied the code block (2 lines)." in screen_text(app)
        await pilot.press("ctrl+r")  # replay follows the selected block's answer
        assert isinstance(app.screen, ReplayScreen) and app.screen.answer_index == 0
        await pilot.press("escape")
        await pilot.press("ctrl+down")
        assert app.selected_fence.code == "total = sum(values)"


async def test_settings_screen_validates_saves_and_applies(
    make_app: Callable[..., ChatApp], store: ChatStore
) -> None:
    backend = ScriptedBackend()
    app = make_app(backend)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await pilot.press("f2")
        screen = app.screen
        assert isinstance(screen, SettingsScreen)
        assert not screen.query_one("#field-block_length", Input).disabled  # "model" may pick the fast one
        screen.query_one("#field-decoder", Select).value = "reference"
        await pilot.pause()
        assert screen.query_one("#field-block_length", Input).disabled  # the reference decoder ignores it
        steps = screen.query_one("#field-steps", Input)
        steps.value = "8"
        screen.query_one("#field-top_p", Input).value = "1.5"
        await pilot.click("#save")
        assert isinstance(app.screen, SettingsScreen)  # refused: nothing saved
        assert "must be in (0, 1], got 1.5" in screen_text(app)
        assert store.saved_settings() == {}
        screen.query_one("#field-top_p", Input).value = ""
        screen.query_one("#field-decoder", Select).value = "fast"
        await pilot.pause()
        assert not screen.query_one("#field-block_length", Input).disabled
        screen.query_one("#field-threshold", Input).value = "0.7"
        await pilot.click("#save")
        assert not isinstance(app.screen, SettingsScreen)
        saved = store.saved_settings()
        assert saved["steps"] == 8 and saved["top_p"] is None and saved["decoder"] == "fast"
        await answered(pilot, "with new settings")
        params = backend.requests[0].params
        assert params["steps"] == 8 and "top_p" not in params and params["threshold"] == 0.7
        # Reset brings back the config/default values; saving them clears the saved set.
        await pilot.press("f2")
        await pilot.click("#reset")
        await pilot.click("#save")
        assert store.saved_settings() == {} and app.settings == TEST_SETTINGS
    # Saved settings persist: a new app starts with them.
    store.save_settings(ChatSettings(max_new_tokens=160, steps=4).to_dict())
    app2 = make_app(ScriptedBackend())
    assert app2.settings.steps == 4


async def test_keymap_from_config_help_screen_and_command_palette(make_app: Callable[..., ChatApp]) -> None:
    app = make_app(ScriptedBackend(), keymap={"replay": "f9", "copy-message": "f10"})
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await answered(pilot, "one")
        await pilot.press("ctrl+r")
        assert not isinstance(app.screen, ReplayScreen)  # rebound away
        await pilot.press("f9")
        assert isinstance(app.screen, ReplayScreen)
        await pilot.press("escape")
        await pilot.press("f10")
        assert app.clipboard == ANSWER
        await pilot.press("f1")
        assert isinstance(app.screen, HelpScreen)
        shown = screen_text(app)
        assert "f9" in shown and "replay" in shown and "copy-code" in shown
        assert "f3" in shown and "apply-code" in shown  # /apply's key
        app.screen.query_one(VerticalScroll).scroll_end(animate=False)
        await pilot.pause()
        shown = screen_text(app)
        assert 'replay = "f6"' in shown  # how to rebind, below the table
        assert "/undo [--force]" in shown and "/fill PATH[:FIRST-LAST]" in shown  # the commands
        await pilot.press("escape")
        commands = [c.title for c in app.get_system_commands(app.screen)]
        assert {
            "New chat",
            "Chats",
            "Replay",
            "Settings",
            "Copy answer",
            "Copy code block",
            "Next code block",
            "Previous code block",
            "Cancel",
        } <= set(commands)
        await pilot.press("ctrl+p")
        await pilot.pause(0.1)
        await pilot.press(*"Sett")
        await pilot.pause(0.3)
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, SettingsScreen))


async def test_connect_errors_show_inline_and_retry_reconnects(make_app: Callable[..., ChatApp]) -> None:
    backend = ScriptedBackend(connect_error=unreachable())
    app = make_app(backend)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await until(pilot, lambda: app.query(ErrorNotice))
        shown = screen_text(app)
        assert "cannot reach the diffu daemon at http://127.0.0.1:9" in shown and "Retry" in shown
        assert "Traceback" not in shown and not app.connected
        backend.connect_error = None
        await pilot.click("#retry")
        await until(pilot, lambda: app.connected)
        assert not app.query(ErrorNotice) and backend.connects == 2
        await answered(pilot, "works now")


async def test_generate_errors_show_inline_with_retry_and_settings(make_app: Callable[..., ChatApp]) -> None:
    backend = ScriptedBackend(generate_errors=[refused_steps(), RuntimeError("boom")])
    app = make_app(backend)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        answer = await ask(pilot, "hello")
        await until(pilot, lambda: answer.query(ErrorNotice))
        shown = screen_text(app)
        assert "the daemon refused the request (400): steps: must be <= 1024" in shown
        assert answer.query_one("#open-settings", Button)  # the refused value is a setting
        await pilot.click("#open-settings")
        assert isinstance(app.screen, SettingsScreen)
        await pilot.press("escape")
        await pilot.click("#retry")
        await until(pilot, lambda: len(backend.requests) == 2 and app.query(ErrorNotice))
        shown = screen_text(app)
        assert "unexpected error: RuntimeError: boom" in shown and "Traceback" not in shown
        assert not app.query("#open-settings")
        await pilot.click("#retry")
        await until(pilot, lambda: app.query(AnswerView) and app.query(AnswerView).last().answered)
        assert len(app.query(AnswerView)) == 1 and not app.query(ErrorNotice)
        assert [m["role"] for m in backend.requests[2].messages] == ["user"]


async def test_a_failed_answer_cannot_be_retried_after_the_conversation_moved_on(
    make_app: Callable[..., ChatApp],
) -> None:
    backend = ScriptedBackend(generate_errors=[unreachable()])
    app = make_app(backend)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        answer = await ask(pilot, "hello")
        await until(pilot, lambda: answer.query(ErrorNotice))
        await answered(pilot, "next")
        assert answer.query_one("#retry", Button).disabled


async def test_options_list_is_empty_at_first(make_app: Callable[..., ChatApp]) -> None:
    app = make_app(ScriptedBackend())
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await pilot.press("ctrl+o")
        assert isinstance(app.screen, ConversationsScreen)
        assert "No saved conversations yet." in screen_text(app)
        assert app.screen.query_one(OptionList).option_count == 0
        await pilot.press("escape")
        await asyncio.sleep(0)
        assert not isinstance(app.screen, ConversationsScreen)


async def test_the_chat_starts_from_the_models_chat_defaults_under_config_toml(
    make_app: Callable[..., ChatApp],
) -> None:
    from tui.settings import ChatConfig

    backend = ScriptedBackend(chat_defaults={"max_new_tokens": 96, "steps": 24, "temperature": 0.1})
    config = ChatConfig(ChatSettings(temperature=0.3), table={"temperature": 0.3})
    app = make_app(backend, baseline=config.settings, for_model=config.for_model)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await answered(pilot, "add")
        params = backend.requests[0].params
        assert (params["max_new_tokens"], params["steps"], params["temperature"]) == (96, 24, 0.3)
        assert app.baseline.max_new_tokens == 96  # the settings screen's "reset" goes back to these


async def test_an_answer_whose_code_does_not_parse_is_decoded_again_in_longer_blocks(
    make_app: Callable[..., ChatApp],
) -> None:
    backend = ScriptedBackend(answers=[BROKEN, ANSWER, SECOND], step_delay=0.05)
    app = make_app(backend, baseline=TEST_SETTINGS.replace(retry_block=128))
    async with app.run_test(size=SIZE) as pilot:
        answer = await ask(pilot, "add two numbers")
        # While the second decode runs, its canvas says why.
        await until(
            pilot, lambda: "the code did not parse: decoding again in blocks of 128" in screen_text(app)
        )
        await until(pilot, lambda: not answer.live and answer.query(Markdown))
        first, again = (r.params for r in backend.requests)
        assert first["block_length"] == 32 and first["max_new_tokens"] == 160
        # Fast decoder, blocks of 128 on the canvas rounded up to whole blocks, steps scaled with it.
        assert (again["decoder"], again["block_length"], again["max_new_tokens"], again["steps"]) == (
            "fast",
            128,
            256,
            26,
        )
        assert backend.requests[1].messages == backend.requests[0].messages
        assert answer.content == ANSWER and "def add(a, b):" in screen_text(app)
        assert "decoded twice: the first answer's code did not" in screen_text(app)
        assert app.context_messages()[-1] == {"role": "assistant", "content": ANSWER}
        stored = app.store.messages(app.conversation_id or "")[-1]
        assert stored.content == ANSWER and stored.stats["retried"]["block_length"] == 128
        assert len(answer.trace.frames) == 26  # replay shows the answer that is kept

        # An answer that parses is shown as it is: one decode.
        answer = await answered(pilot, "sum a list")
        assert len(backend.requests) == 3 and answer.content == SECOND


async def test_without_a_retry_block_broken_code_is_shown_as_written(
    make_app: Callable[..., ChatApp],
) -> None:
    backend = ScriptedBackend(answers=[BROKEN])
    app = make_app(backend)
    async with app.run_test(size=SIZE) as pilot:
        answer = await answered(pilot, "add two numbers")
        assert len(backend.requests) == 1 and answer.content == BROKEN
        assert "decoded twice" not in screen_text(app)
