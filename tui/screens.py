"""The chat's modal screens: replay of a denoising history, settings, past conversations, help."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.table import Table
from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.timer import Timer
from textual.widgets import Button, Footer, Input, Label, OptionList, Select, Static
from textual.widgets.option_list import Option

from model_runtime.params import decoder_knobs
from tui import keys
from tui.commands import COMMANDS
from tui.denoise import DenoiseView
from tui.render import Trace
from tui.settings import FIELDS, ChatSettings, SettingsError, decoder_knobs_of, format_field, parse_field
from tui.store import ConversationInfo
from tui.widgets import AnswerView

REPLAY_SECONDS = 3.0  # a whole history plays in about this long, between MIN_FPS and MAX_FPS frames a second
MIN_FPS, MAX_FPS = 8.0, 30.0


class ReplayScreen(ModalScreen[None]):
    """Scrub through the denoising history of any answer of the conversation."""

    BINDINGS = keys.bindings(*keys.REPLAY_IDS)
    DEFAULT_CSS = """
    ReplayScreen { align: center middle; }
    ReplayScreen > #replay {
        width: 94%;
        height: 92%;
        border: round $primary;
        border-title-style: bold;
        background: $surface;
        padding: 0 1;
    }
    ReplayScreen #replay-body { height: 1fr; }
    ReplayScreen #replay-state { height: 1; color: $text-muted; }
    """

    def __init__(
        self, answers: list[AnswerView], index: int, load: Callable[[AnswerView], Trace | None]
    ) -> None:
        super().__init__()
        self.answers = answers
        self.answer_index = index
        self._load = load
        self.trace: Trace = Trace(0)
        self.playing = False
        self._timer: Timer | None = None

    def compose(self) -> ComposeResult:
        with Vertical(id="replay"):
            yield VerticalScroll(id="replay-body", can_focus=False)
            yield Static(id="replay-state")
        yield Footer()

    async def on_mount(self) -> None:
        await self._open(self.answer_index)

    @property
    def view(self) -> DenoiseView | None:
        views = self.query(DenoiseView)
        return views.first() if views else None

    @property
    def frame(self) -> int:
        return self.view.index if self.view is not None else 0

    async def _open(self, index: int) -> None:
        self._pause()
        self.answer_index = index
        self.trace = self._load(self.answers[index]) or Trace(0)
        body = self.query_one("#replay-body", VerticalScroll)
        await body.remove_children()
        box = self.query_one("#replay")
        box.border_title = f"Replay · answer {index + 1} of {len(self.answers)}"
        if not self.trace.frames:
            await body.mount(Static("No denoising history was kept for this answer."))
        else:
            view = DenoiseView(self.trace)
            view.index = 0
            await body.mount(view)
        self._update_state()
        if self.trace.frames:
            self.action_toggle_play()  # a replay plays from the first step; any key pauses it

    def _update_state(self) -> None:
        state = Text()
        if self.trace.frames:
            state.append("▶ playing" if self.playing else "❚❚ paused", style="bold")
            state.append(f"   frame {self.frame + 1} of {len(self.trace.frames)}")
        self.query_one("#replay-state", Static).update(state)

    def _show(self, index: int) -> None:
        view = self.view
        if view is None or not view.is_mounted or not self.trace.frames:
            return  # a tick while the screen is being taken down (the app quits during a replay)
        view.show(max(0, min(index, len(self.trace.frames) - 1)))
        self._update_state()

    # -- actions ---------------------------------------------------------------------------------------
    def action_step(self, delta: int) -> None:
        self._pause()
        self._show(self.frame + delta)

    def action_first(self) -> None:
        self._pause()
        self._show(0)

    def action_last(self) -> None:
        self._pause()
        self._show(len(self.trace.frames) - 1)

    def action_toggle_play(self) -> None:
        if self.playing:
            self._pause()
            self._update_state()
            return
        if not self.trace.frames:
            return
        if self.frame >= len(self.trace.frames) - 1:
            self._show(0)  # at the end, play starts over
        fps = min(MAX_FPS, max(MIN_FPS, len(self.trace.frames) / REPLAY_SECONDS))
        self.playing = True
        self._timer = self.set_interval(1 / fps, self._tick)
        self._update_state()

    def _tick(self) -> None:
        if self.frame >= len(self.trace.frames) - 1:
            self._pause()
            self._update_state()
            return
        self._show(self.frame + 1)

    def _pause(self) -> None:
        self.playing = False
        if self._timer is not None:
            self._timer.stop()
            self._timer = None

    async def action_answer(self, delta: int) -> None:
        index = self.answer_index + delta
        if 0 <= index < len(self.answers):
            await self._open(index)

    def action_close(self) -> None:
        self._pause()
        self.dismiss(None)

    def on_unmount(self) -> None:
        self._pause()


class SettingsScreen(ModalScreen[ChatSettings | None]):
    """Edit the generation settings; bad values are shown next to their field and nothing is saved."""

    BINDINGS = [Binding("escape", "cancel", "Cancel", show=True)]
    DEFAULT_CSS = """
    SettingsScreen { align: center middle; }
    SettingsScreen > #settings {
        width: 100;
        max-width: 96%;
        height: auto;
        max-height: 96%;
        border: round $primary;
        border-title-style: bold;
        background: $surface;
        padding: 0 1;
    }
    SettingsScreen #form { height: auto; max-height: 26; }
    SettingsScreen .row { height: auto; margin: 0 0 1 0; }
    SettingsScreen .row > Label { width: 16; text-style: bold; }
    SettingsScreen .row > Input, SettingsScreen .row > Select { width: 14; }
    SettingsScreen .row > Input { background: $boost; }
    SettingsScreen .row > Input:disabled { color: $text-disabled; background: transparent; }
    SettingsScreen .row > .help { width: 1fr; padding: 0 0 0 2; color: $text-muted; }
    SettingsScreen .error { color: $text-error; padding: 0 0 0 16; height: auto; margin: -1 0 1 0; }
    SettingsScreen .error.-empty { display: none; }
    SettingsScreen #buttons { height: auto; align-horizontal: right; }
    SettingsScreen #buttons > Button { margin-left: 1; }
    """

    def __init__(self, current: ChatSettings, baseline: ChatSettings) -> None:
        super().__init__()
        self.current = current
        self.baseline = baseline

    def compose(self) -> ComposeResult:
        with Vertical(id="settings"):
            with VerticalScroll(id="form"):
                for name, opt in FIELDS.items():
                    with Horizontal(classes="row"):
                        yield Label(name)
                        value = self.current.get(name)
                        if opt.kind is str and opt.choices:  # words to pick from; numbers are typed
                            # Unset (an optional knob left to the daemon): the blank, shown as "default".
                            yield Select(
                                [(c, c) for c in opt.choices],
                                value=Select.NULL if value is None else value,
                                allow_blank=opt.optional,
                                prompt="default",
                                id=f"field-{name}",
                                compact=True,
                            )
                        else:
                            yield Input(
                                format_field(value),
                                id=f"field-{name}",
                                type="integer" if opt.kind is int else "number",
                                placeholder="default" if opt.optional else "",
                                compact=True,
                            )
                        yield Static(opt.help, classes="help")
                    yield Static("", id=f"error-{name}", classes="error -empty")
            with Horizontal(id="buttons"):
                yield Button("Reset to defaults", id="reset", compact=True)
                yield Button("Cancel", id="cancel", compact=True)
                yield Button("Save", id="save", variant="primary", compact=True)
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#settings").border_title = "Settings"
        self._sync_decoder()
        for widget in self.query(Input):
            widget.cursor_blink = self.app.cursor_blink  # type: ignore[attr-defined]
        self.query_one("#field-max_new_tokens", Input).focus()

    @on(Select.Changed, "#field-decoder")
    def _sync_decoder(self) -> None:
        choice = self.query_one("#field-decoder", Select).value
        # What the chosen decoder reads; for "model", every decoder's (it may pick any).
        reads = decoder_knobs_of(str(choice))
        for name in decoder_knobs():
            if self.query(f"#field-{name}"):
                self.query_one(f"#field-{name}").disabled = name not in reads

    def _value(self, name: str) -> Any:
        widget = self.query_one(f"#field-{name}")
        if isinstance(widget, Select):
            return None if widget.is_blank() else widget.value
        assert isinstance(widget, Input)
        return parse_field(name, widget.value)

    def _set_error(self, name: str, message: str) -> None:
        error = self.query_one(f"#error-{name}", Static)
        error.update(Text(message))
        error.set_class(not message, "-empty")

    def read_form(self) -> ChatSettings | None:
        """The settings the form holds, or None after showing what is wrong."""
        values, errors = {}, {}
        for name in FIELDS:
            try:
                values[name] = self._value(name)
            except SettingsError as exc:
                errors[name] = exc.message
        if not errors:
            try:
                return ChatSettings().replace(**values)
            except SettingsError as exc:
                errors[exc.key if exc.key in FIELDS else "max_new_tokens"] = exc.message
        for name in FIELDS:
            self._set_error(name, errors.get(name, ""))
        first = next(iter(errors))
        self.query_one(f"#field-{first}").focus()
        return None

    @on(Button.Pressed, "#save")
    def action_save(self) -> None:
        settings = self.read_form()
        if settings is not None:
            self.dismiss(settings)

    @on(Button.Pressed, "#reset")
    def _reset(self) -> None:
        for name in FIELDS:
            widget = self.query_one(f"#field-{name}")
            value = self.baseline.get(name)
            if isinstance(widget, Select):
                widget.value = Select.NULL if value is None else value
            else:
                assert isinstance(widget, Input)
                widget.value = format_field(value)
            self._set_error(name, "")
        self._sync_decoder()

    @on(Button.Pressed, "#cancel")
    def action_cancel(self) -> None:
        self.dismiss(None)


class ConversationsScreen(ModalScreen[str | None]):
    """Past conversations, the most recent first; Enter reopens one."""

    BINDINGS = [Binding("escape", "cancel", "Close", show=True)]
    DEFAULT_CSS = """
    ConversationsScreen { align: center middle; }
    ConversationsScreen > #conversations {
        width: 100;
        max-width: 96%;
        height: 80%;
        border: round $primary;
        border-title-style: bold;
        background: $surface;
    }
    ConversationsScreen OptionList { height: 1fr; border: none; }
    """

    def __init__(self, conversations: list[ConversationInfo], current: str | None = None) -> None:
        super().__init__()
        self.conversations = conversations
        self.current = current

    def compose(self) -> ComposeResult:
        with Vertical(id="conversations"):
            if not self.conversations:
                yield Static("No saved conversations yet.", id="empty")
            options = []
            for c in self.conversations:
                label = Text(c.title)
                when = time.strftime("%Y-%m-%d %H:%M", time.localtime(c.updated))
                label.append(f"   {c.messages} messages · {when}", style="dim")
                if c.id == self.current:
                    label.append("  (open)", style="bold")
                options.append(Option(label, id=c.id))
            yield OptionList(*options)
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#conversations").border_title = "Conversations"
        self.query_one(OptionList).focus()

    @on(OptionList.OptionSelected)
    def _selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(event.option.id)

    def action_cancel(self) -> None:
        self.dismiss(None)


class HelpScreen(ModalScreen[None]):
    """Every action with its current keys and binding id (the names ``[keymap]`` in config.toml uses)."""

    BINDINGS = [Binding("escape,f1,q", "close", "Close", show=True)]
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll {
        width: 100;
        max-width: 96%;
        height: 90%;
        border: round $primary;
        border-title-style: bold;
        background: $surface;
        padding: 0 1;
    }
    """

    def __init__(self, keymap: dict[str, str], config_file: Path) -> None:
        super().__init__()
        self.keymap = keymap
        self.config_file = config_file

    def compose(self) -> ComposeResult:
        table = Table(box=None, expand=True, pad_edge=False)
        table.add_column("keys", style="bold", no_wrap=True)
        table.add_column("action")
        table.add_column("binding id", style="dim", no_wrap=True)
        for spec in keys.SPECS.values():
            table.add_row(self.keymap.get(spec.id, spec.keys), spec.description, spec.id)
        prompt = Table(box=None, expand=True, pad_edge=False)
        prompt.add_column("keys", style="bold", no_wrap=True)
        prompt.add_column("in the prompt")
        for key, what in (
            ("enter", "send"),
            ("shift+enter, ctrl+j, alt+enter", "new line"),
            ("up / down", "previous / next prompt (on the first / last line)"),
            ("tab", "complete a path after @ or in /add, /drop, /apply, /fill"),
            ("ctrl+p", "command palette: every action by name"),
        ):
            prompt.add_row(key, what)
        commands = Table(box=None, expand=True, pad_edge=False)
        commands.add_column("command", style="bold", no_wrap=True)
        commands.add_column("typed in the prompt (@PATH in a prompt adds a file too)")
        for name, (args, what) in COMMANDS.items():
            commands.add_row(f"/{name} {args}".rstrip(), what)
        note = Text.assemble(
            "Rebind any action by its binding id in ",
            (str(self.config_file), "bold"),
            ":\n",
            ('[keymap]\nreplay = "f6"\ncopy-code = "ctrl+g,f7"', "italic"),
            "\nGeneration defaults go in a [chat] table of the same file; the settings screen (f2) "
            "saves its own values in the chat database.",
        )
        with VerticalScroll() as scroll:
            scroll.border_title = "Help"
            yield Static(table)
            yield Label("")
            yield Static(prompt)
            yield Label("")
            yield Static(commands)
            yield Label("")
            yield Static(note)
        yield Footer()

    def action_close(self) -> None:
        self.dismiss(None)
