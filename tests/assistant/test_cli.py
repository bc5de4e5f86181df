"""The ``diffu`` entry point: its version, and errors shown with the usage of the command they belong to."""

from __future__ import annotations

from importlib.metadata import version

import pytest

from assistant.cli.main import main


def test_version_is_the_installed_package_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"diffu {version('diffu')}"


@pytest.mark.parametrize(
    "command, args", [("generate", ["--prompt", "x"]), ("eval", ["humaneval"]), ("config", ["show"])]
)
def test_an_unknown_flag_after_a_command_shows_that_commands_usage(command, args, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([command, *args, "--no-such-flag"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: diffu {command} ")
    assert err.strip().endswith(f"diffu {command}: error: unrecognized arguments: --no-such-flag")


@pytest.mark.parametrize("prompt", ["", "   \n"])
def test_an_empty_prompt_is_refused_before_any_model_loads(prompt, capsys):
    assert main(["generate", "--model", "/nonexistent/model", "--prompt", prompt]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "diffu: error: --prompt: empty prompt (give the text to continue or answer)"
