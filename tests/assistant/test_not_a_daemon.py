"""``DIFFU_URL`` pointing at a server that is not a diffu daemon (issue #45): one line naming the URL.

A real ``python -m http.server`` answers ``/health`` with its HTML 404 page; the commands that talk to the
daemon used to print that page (14 lines) as the error. The check is in the client layer
(``assistant.client.core.health_refused``), so every command and both clients say the same line.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from assistant.client import AsyncClient, Client, DaemonUnavailable
from tests.assistant.helpers import REPO, isolated_env


@contextlib.contextmanager
def serving(directory: Path) -> Iterator[str]:
    """``python3 -m http.server`` of ``directory`` on a free loopback port; its URL."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-u",
            "-m",
            "http.server",
            "0",
            "--bind",
            "127.0.0.1",
            "--directory",
            str(directory),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()  # "Serving HTTP on 127.0.0.1 port 41234 (http://127.0.0.1:41234/) ..."
    try:
        assert " port " in line, line
        yield f"http://127.0.0.1:{int(line.split(' port ', 1)[1].split()[0])}"
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture(scope="module")
def file_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with serving(tmp_path_factory.mktemp("http-server")) as url:
        yield url


@pytest.mark.parametrize(
    "command",
    [["chat", "--once", "hello"], ["generate", "--prompt", "def f():"]],
    ids=["chat --once", "generate"],
)
def test_a_server_that_is_not_diffu_is_one_line_naming_it(command, file_server, tmp_path: Path) -> None:
    env = isolated_env(tmp_path, DIFFU_URL=file_server)
    out = subprocess.run(
        [sys.executable, "-m", "assistant.cli", *command],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2, out.stderr
    assert out.stderr == f"diffu: error: {file_server} is not a diffu daemon (404 on /health)\n"
    assert out.stdout == ""


def test_both_clients_refuse_it_before_any_request(file_server: str) -> None:
    with Client(url=file_server, autostart=False) as client, pytest.raises(DaemonUnavailable) as sync:
        client.status()
    assert str(sync.value) == f"{file_server} is not a diffu daemon (404 on /health)"

    async def status() -> None:
        async with AsyncClient(url=file_server, autostart=False) as client:
            await client.status()

    with pytest.raises(DaemonUnavailable) as aio:
        asyncio.run(status())
    assert str(aio.value) == str(sync.value)


def test_a_page_that_answers_200_is_not_a_health_stream(tmp_path: Path) -> None:
    """A server with a ``health`` file answers 200 with its bytes: not the daemon's event stream either."""
    (tmp_path / "health").write_text("OK\n")
    with serving(tmp_path) as url, Client(url=url, autostart=False) as client:
        with pytest.raises(DaemonUnavailable) as exc:
            client.status()
    what = "/health answered application/octet-stream, not an event stream"
    assert str(exc.value) == f"{url} is not a diffu daemon ({what})"
