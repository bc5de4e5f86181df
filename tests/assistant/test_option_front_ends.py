"""Every sampling option, declared once in ``SamplingParams``, exists in every front end and is checked
alike there: the CLI flag, the client option, the daemon's request field, the chat setting and the
editors' setting (docs/architecture.md, "Adding a sampling option", walks through it).

The cases come from the declaration itself: for each option, a value inside its bounds and choices, and
one just outside each bound (or outside its choices). A new option is covered without a change here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from assistant.cli.flags import flag
from assistant.cli.main import build_parser, main
from assistant.cli.model_options import sampling_params
from assistant.client import APIError, Client, SamplingOptions
from assistant.server.protocol import SAMPLING_FIELDS
from lsp.settings import FIELDS as LSP_FIELDS
from lsp.settings import VIEW as LSP_VIEW
from lsp.settings import camel, editor_schema, parse_settings
from model_runtime.options import Option, OptionError, options
from model_runtime.params import SamplingParams
from tests.assistant.helpers import REPO, DaemonProcess
from tui.settings import FIELDS as CHAT_FIELDS
from tui.settings import ChatSettings, SettingsError, parse_field, read_chat_config

DECLARED = options(SamplingParams)
# max_new_tokens is the canvas, which every front end names its own way (--max-new-tokens, a call's
# max_new_tokens or canvas_tokens, the editors' maxTokens): the knobs are the rest.
KNOBS = [name for name in DECLARED if name != "max_new_tokens"]


def good(opt: Option) -> Any:
    """A value the option takes, other than its default."""
    if opt.choices is not None:
        return next(c for c in opt.choices if c != opt.default)
    lo = opt.ge if opt.ge is not None else opt.gt
    hi = opt.le if opt.le is not None else opt.lt
    if lo is not None and hi is not None:
        return (lo + hi) // 2 if opt.kind is int else (lo + hi) / 2
    step = 1 if opt.kind is int else 0.5
    return (lo if lo is not None else 0) + step


def bad(opt: Option) -> list[Any]:
    """Values just past each bound, or outside the choices."""
    step = 1 if opt.kind is int else 0.5
    out = [v for v in (opt.gt, opt.lt) if v is not None]
    out += [opt.ge - step] if opt.ge is not None else []
    out += [opt.le + step] if opt.le is not None else []
    if opt.choices is not None and opt.kind is str:
        out.append("no-such-" + opt.name)
    elif opt.choices is not None:  # a number within the bounds that is not a choice
        out.append(next(v for v in range(opt.ge or 0, 10**6) if v not in opt.choices))
    return out


def problem(opt: Option, value: Any) -> str:
    with pytest.raises(OptionError) as info:
        opt.read(value)
    return info.value.problem


CASES = [(name, value) for name in KNOBS for value in bad(DECLARED[name])]


def test_every_knob_has_cases_and_every_front_end_has_every_knob() -> None:
    assert all(bad(DECLARED[name]) for name in KNOBS), "an option without bounds or choices: add a case"
    flags = {a.dest for a in build_parser()[1]["generate"]._actions}
    assert set(KNOBS) <= flags
    assert list(SamplingOptions.__dataclass_fields__) == KNOBS
    assert list(SAMPLING_FIELDS) == KNOBS
    assert set(KNOBS) <= set(CHAT_FIELDS) and set(KNOBS) <= set(LSP_FIELDS)


@pytest.mark.parametrize("name", KNOBS)
def test_a_good_value_reaches_the_request_from_every_front_end(name: str, fake_daemon: DaemonProcess) -> None:
    opt = DECLARED[name]
    value = good(opt)
    # The CLI flag: parsed, then the value the command runs with.
    args = build_parser()[0].parse_args(["generate", "--prompt", "x", flag(name), str(value)])
    assert getattr(sampling_params(args), name) == value
    # The client option serializes as the request field, and the daemon takes it.
    sampling = SamplingOptions(**{name: value})
    assert sampling.body() == {name: value}
    with Client(fake_daemon.url, fake_daemon.token, autostart=False) as client:
        assert client.generate(prompt="def f(x):", max_new_tokens=4, sampling=sampling).finish_reason
    # The chat: from config.toml's [chat] or the settings screen, into its requests.
    chat = ChatSettings.from_mapping({name: value})
    assert chat.get(name) == value and chat.replace(decoder="fast").request_params()[name] == value
    if not (opt.kind is str and opt.choices):  # words are picked from a list, numbers typed
        assert parse_field(name, f" {value} ") == value
    # The editors: a settings key, sent with each suggestion unless the server derives it (steps).
    settings, problems = parse_settings({"diffu": {camel(name): value}})
    assert problems == [] and LSP_VIEW.get(settings, name) == value
    if name not in ("steps", "temperature"):
        assert settings.request_sampling(4).body()[name] == value


@pytest.mark.parametrize(("name", "value"), CASES)
def test_a_bad_value_is_refused_by_every_front_end_naming_it(
    name: str, value: Any, fake_daemon: DaemonProcess, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    opt = DECLARED[name]
    expected = problem(opt, value)
    # The CLI: one line naming the flag, before any model loads (a word outside the choices gets
    # argparse's own error, which lists them).
    if opt.kind is str and opt.choices:
        with pytest.raises(SystemExit) as exit_info:
            main(["generate", "--prompt", "x", flag(name), str(value)])
        assert exit_info.value.code == 2
        assert f"argument {flag(name)}: invalid choice {value!r}" in capsys.readouterr().err
    else:
        assert main(["generate", "--prompt", "x", flag(name), str(value)]) == 2
        assert capsys.readouterr().err == f"diffu: error: {flag(name)}: {expected}\n"
    # The daemon: the client sends the value as it is; the answer is a 400 naming the field.
    with Client(fake_daemon.url, fake_daemon.token, autostart=False) as client:
        with pytest.raises(APIError) as info:
            client.generate(prompt="x", max_new_tokens=4, sampling=SamplingOptions(**{name: value}))
    assert (info.value.status, info.value.param, info.value.message) == (400, name, f"{name}: {expected}")
    # The chat: config.toml's [chat] stops `diffu chat` with the key; the settings screen's field too.
    # The chat's view of an option may differ from the daemon's (its decoder may also be "model"): the
    # message is its option's.
    chat_expected = problem(CHAT_FIELDS[name], value)
    config = tmp_path / "config.toml"
    config.write_text(f"[chat]\n{name} = {json.dumps(value)}\n")
    with pytest.raises(SettingsError) as chat_error:
        read_chat_config(config, {})
    assert str(chat_error.value) == f"{config}: [chat] {name}: {chat_expected}"
    if not (opt.kind is str and opt.choices):
        with pytest.raises(SettingsError) as screen_error:
            parse_field(name, str(value))
        assert (screen_error.value.key, screen_error.value.message) == (name, chat_expected)
    # The editors: the key is named, and the previous value kept. Their bounds may be narrower than
    # the daemon's (steps <= 1024): the message is their option's.
    settings, problems = parse_settings({"diffu": {camel(name): value}})
    kept = LSP_VIEW.get(settings, name)
    assert problems == [f"{camel(name)}: {problem(LSP_FIELDS[name], value)}; keeping {kept!r}"]


def test_the_vscode_extension_declares_each_setting_as_the_server_does() -> None:
    """package.json's settings (what VS Code's settings UI checks and offers) carry the declaration's
    type, default, bounds and choices; `python scripts/vscode_settings.py` brings them in line."""
    manifest = json.loads((REPO / "editors" / "vscode" / "package.json").read_text())
    properties = manifest["contributes"]["configuration"]["properties"]
    for key, facts in editor_schema().items():
        declared = {k: v for k, v in properties.get(key, {}).items() if k in facts}
        assert declared == facts, f"{key}: run python scripts/vscode_settings.py"
        assert properties[key].get("description") or properties[key].get("markdownDescription"), key
