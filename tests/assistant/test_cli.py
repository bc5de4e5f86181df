"""The ``diffu`` entry point: its version, and mistakes on the command line answered with one line that
names them (and the closest flag or value meant), exit code 2."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from assistant.cli.main import main
from tests.assistant.helpers import REPO, isolated_env, stop_background_daemons


def test_version_is_the_installed_package_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"diffu {version('diffu')}"


def one_error_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The stderr of ``diffu ARGV``, which must be one line and exit code 2."""
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "usage:" not in err, err
    return err.strip()


@pytest.mark.parametrize(
    "argv, expected",
    [
        (
            ["generate", "--promt", "x"],
            "diffu generate: error: unknown option --promt; did you mean --prompt?",
        ),
        (
            ["eval", "humaneval", "--limt", "5"],
            "diffu eval: error: unknown option --limt; did you mean --limit?",
        ),
        (
            ["generate", "--prompt", "x", "--decoder", "fastt"],
            "diffu generate: error: argument --decoder: invalid choice 'fastt' "
            "(one of reference, fast, sliding); did you mean fast?",
        ),
        (
            ["daemon", "start", "--modle", "x"],
            "diffu daemon start: error: unknown option --modle; did you mean --model?",
        ),
        (["config", "show", "--no-such-flag"], "diffu config show: error: unknown option --no-such-flag"),
        (["--verison"], "diffu: error: unknown option --verison; did you mean --version?"),
    ],
)
def test_a_mistyped_flag_or_value_gets_one_line_naming_it_and_the_closest_one(
    argv: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    prog = expected.split(": error:")[0]
    assert one_error_line(argv, capsys) == f"{expected} ({prog} --help lists the options)"


def test_flags_argparse_accepts_stay_accepted(capsys: pytest.CaptureFixture[str]) -> None:
    # A unique prefix (--max-new for --max-new-tokens), --flag=value, and a value that starts with dashes
    # but holds a space: argparse takes them, so the flag check must too; the error is the command's own.
    assert main(["generate", "--prompt", "-- x", "--max-new=4", "--infill-tokens", "4"]) == 2
    assert capsys.readouterr().err == "diffu: error: --infill-tokens needs --suffix\n"


def test_an_unknown_value_of_eval_is_named_with_the_closest_one(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["eval", "humaneval-infil"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "diffu: error: unknown benchmark 'humaneval-infil' "
        "(one of humaneval, humaneval-infill, tasks, lines); did you mean humaneval-infill?\n"
    )
    assert main(["eval", "humaneval", "--style", "instrct"]) == 2
    assert capsys.readouterr().err == (
        "diffu: error: --style: expected base or instruct, got 'instrct'; did you mean instruct?\n"
    )


@pytest.mark.parametrize("prompt", ["", "   \n"])
def test_an_empty_prompt_is_refused_before_any_model_loads(prompt, capsys):
    assert main(["generate", "--model", "/nonexistent/model", "--prompt", prompt]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "diffu: error: --prompt: empty prompt (give the text to continue or answer)"


def test_a_model_that_cannot_be_had_is_one_line_from_every_command(tmp_path: Path) -> None:
    env = isolated_env(tmp_path, DIFFU_DATA_DIR=str(tmp_path / "data"), DIFFU_PORT="0", HF_HUB_OFFLINE="1")

    def diffu(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "assistant.cli", *args],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
        )  # fmt: skip

    # A local path that is not there: said before any daemon starts for it.
    missing = diffu("chat", "--model", str(tmp_path / "missing"), "--once", "x")
    assert missing.returncode == 2
    assert missing.stderr == f"diffu: error: model directory {tmp_path / 'missing'} does not exist\n"
    assert not list((tmp_path / "run").glob("*.json"))  # no daemon was started
    # A hub id it cannot fetch (offline): the hub library's message joined into the one line.
    hub = diffu("generate", "--model", "nobody/no-such-model", "--prompt", "x")
    assert hub.returncode == 2 and hub.stderr.count("\n") == 1, hub.stderr
    assert hub.stderr.startswith("diffu: error: cannot fetch 'nobody/no-such-model' from the Hugging Face")
    # Through a daemon the chat starts: its progress line, then the daemon's error, nothing between.
    try:
        chat = diffu("chat", "--model", "nobody/no-such-model", "--once", "x")
    finally:
        stop_background_daemons(tmp_path)
    lines = chat.stderr.splitlines()
    assert chat.returncode == 2 and lines[-1].startswith(
        "diffu: error: the diffu daemon could not load its model: cannot fetch 'nobody/no-such-model'"
    )
    assert all(line.startswith("diffu: loading") for line in lines[:-1]), lines


def test_a_hub_error_spanning_lines_becomes_one(monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub

    from model_runtime.checkpoint import resolve_model_dir
    from model_runtime.errors import ModelError

    def offline(*args: object, **kwargs: object) -> str:
        raise OSError("Got: ConnectError\nAn error happened while trying to locate the files on the Hub.")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    with pytest.raises(ModelError) as error:
        resolve_model_dir("nobody/no-such-model")
    message = str(error.value)
    assert "\n" not in message and "(OSError: Got: ConnectError An error happened" in message


def test_sampler_flags_go_over_the_models_settings_over_the_built_in_ones() -> None:
    from assistant.cli.main import build_parser
    from assistant.cli.model_options import sampling_params
    from model_runtime.bundled import bundled_model_dir
    from model_runtime.generation_config import chat_defaults

    parser, _ = build_parser()

    def params(*flags: str, model: dict | None = None):  # type: ignore[no-untyped-def]
        return sampling_params(parser.parse_args(["generate", "--prompt", "x", *flags]), model=model)

    bundled = chat_defaults(bundled_model_dir())  # what the chat starts from too
    p = params(model=bundled)
    assert (p.max_new_tokens, p.steps, p.block_length, p.threshold, p.temperature, p.top_p) == (
        192, 192, 64, 0.9, 0.0, 0.95,
    )  # fmt: skip
    # A flag wins; a canvas given without steps takes one step a token, not the model's 192.
    p = params("--max-new-tokens", "64", "--block-length", "32", model=bundled)
    assert (p.max_new_tokens, p.steps, p.block_length, p.top_p) == (64, 64, 32, 0.95)
    # A model that sets nothing: the built-in settings.
    p = params(model={})
    assert (p.max_new_tokens, p.steps, p.block_length, p.top_p, p.alg) == (128, 128, 32, None, "entropy")
