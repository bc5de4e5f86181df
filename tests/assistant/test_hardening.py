"""Daemon hardening: malformed bodies are 4xx naming the problem; a restart keeps its port."""

from __future__ import annotations

import socket

import httpx
import pytest

from assistant.client.locate import _port_free


def _time_wait_port() -> int:
    """A loopback port with a connection in TIME_WAIT (the side that closes first keeps it there)."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    conn, _ = server.accept()
    conn.close()  # the server side closes first: its end of the connection goes to TIME_WAIT
    client.close()
    server.close()
    return port


def test_a_port_in_time_wait_counts_as_free():
    port = _time_wait_port()
    assert _port_free("127.0.0.1", port)
    # A port someone listens on is still busy.
    with socket.create_server(("127.0.0.1", 0)) as busy:
        assert not _port_free("127.0.0.1", busy.getsockname()[1])


@pytest.mark.parametrize(
    "body, field",
    [
        (b'{"prompt": "\\ud800", "max_new_tokens": 4}', "prompt"),
        (b'{"messages": [{"role": "user", "content": "a\\udc00b"}]}', "messages"),
        (b'{"prompt": "x", "max_new_tokens": ' + b"9" * 5000 + b"}", None),
        (b"[" * 20_000 + b"]" * 20_000, None),
    ],
    ids=["lone-surrogate", "surrogate-in-message", "5000-digit-integer", "deep-nesting"],
)
def test_malformed_bodies_are_400_and_the_connection_stays_usable(fake_daemon, body, field):
    with httpx.Client(base_url=fake_daemon.url, headers=fake_daemon.headers, timeout=30) as http:
        for path in ("/v1/diffu/generate", "/v1/completions", "/infill"):
            response = http.post(path, content=body, headers={"content-type": "application/json"})
            assert response.status_code == 400, (path, response.text)
            error = response.json()["error"]
            assert "Traceback" not in response.text and error["message"]
            if field:
                assert error.get("param") == field
        ok = http.post("/v1/diffu/generate", json={"prompt": "x", "max_new_tokens": 4})
        assert ok.status_code == 200


def test_log_files_are_private_and_hold_no_query_string_token(tmp_path):
    import logging
    import stat

    from assistant.server.logs import setup_logging

    log_file = tmp_path / "logs" / "daemon.log"
    root = logging.getLogger()
    before = list(root.handlers)
    try:
        setup_logging(log_file, logging.INFO, to_stderr=False)
        logging.getLogger("uvicorn.access").info(
            '%s - "%s %s HTTP/%s" %d', "127.0.0.1:5", "GET", "/v1/models?api_key=s3cret&x=1", "1.1", 200
        )
        for handler in root.handlers:
            handler.flush()
    finally:
        for handler in root.handlers[len(before) :]:
            root.removeHandler(handler)
            handler.close()
    text = log_file.read_text()
    assert "s3cret" not in text and "api_key=[redacted]&x=1" in text
    assert stat.S_IMODE(log_file.stat().st_mode) == 0o600


def test_a_log_dir_that_is_a_file_is_one_line_and_exit_2(tmp_path):
    import subprocess
    import sys

    from tests.assistant.helpers import isolated_env

    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    env = isolated_env(tmp_path, DIFFU_LOG_DIR=str(not_a_dir))
    out = subprocess.run(
        [sys.executable, "-m", "assistant", "serve", "--model", "fake", "--port", "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2, out.stderr
    assert out.stderr.startswith("diffu: error: cannot use") and str(not_a_dir) in out.stderr
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_a_token_path_that_is_a_directory_is_one_line_and_exit_2(tmp_path):
    import subprocess
    import sys

    from tests.assistant.helpers import isolated_env

    env = isolated_env(tmp_path)
    token = tmp_path / "config" / "token"
    token.mkdir(parents=True)
    out = subprocess.run(
        [sys.executable, "-m", "assistant", "serve", "--model", "fake", "--port", "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2, out.stderr
    assert out.stderr.startswith(f"diffu: error: cannot read the API token {token} (Is a directory)")
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_half_sent_requests_are_closed_after_the_read_timeout_and_long_answers_are_not(tmp_path):
    import time

    from tests.assistant.helpers import isolated_env, start_daemon

    env = isolated_env(tmp_path, DIFFU_READ_TIMEOUT="1")
    daemon = start_daemon(tmp_path, "fake:step_delay=0.02", env=env)
    host, port = daemon.url.split("//", 1)[1].split(":")
    try:
        half_head = b"POST /v1/diffu/generate HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        auth = f"Authorization: Bearer {daemon.token}\r\n".encode()
        half_body = (
            b"POST /v1/diffu/generate HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            + auth
            + b'Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"prompt":'
        )
        for partial in (half_head, half_body):
            with socket.create_connection((host, int(port)), timeout=10) as sock:
                sock.sendall(partial)
                start = time.monotonic()
                # Closed by the daemon, with no response, once its read timeout passed (a daemon that never
                # closed it would leave recv to the socket's own 10 s timeout, an error).
                assert sock.recv(1024) == b""
                assert time.monotonic() - start > 0.5
        # A whole request whose answer streams for longer than the read timeout is not cut.
        with httpx.Client(base_url=daemon.url, headers=daemon.headers, timeout=30) as http:
            start = time.monotonic()
            ok = http.post(
                "/v1/diffu/generate", json={"prompt": "x", "max_new_tokens": 80, "steps": 80, "stream": False}
            )
            assert ok.status_code == 200 and time.monotonic() - start > 1.2
            assert ok.json()["finish_reason"] in ("stop", "length")
    finally:
        daemon.stop()


def test_300_idle_sockets_do_not_lock_out_a_client_with_the_token(fake_daemon):
    """More idle sockets than the 256 connection slots, opened by a local process without the token: a
    request with the token is still answered, and the daemon closed the oldest idle ones instead."""
    host, port = fake_daemon.url.split("//", 1)[1].split(":")
    idle = [socket.create_connection((host, int(port)), timeout=10) for _ in range(300)]
    try:
        with httpx.Client(base_url=fake_daemon.url, headers=fake_daemon.headers, timeout=30) as http:
            ok = http.post("/v1/diffu/generate", json={"prompt": "x", "max_new_tokens": 4, "stream": False})
            assert ok.status_code == 200, ok.text
            assert ok.json()["finish_reason"] in ("stop", "length")
        # The oldest idle sockets were the ones closed to make room: each reads end-of-file.
        closed = [i for i, sock in enumerate(idle) if _closed_by_peer(sock)]
        assert closed == list(range(len(closed))) and len(closed) >= 300 + 1 - 256
    finally:
        for sock in idle:
            sock.close()


def test_connection_slots_protect_requests_with_the_token_only():
    from assistant.server.security import ConnectionSlots

    slots = ConnectionSlots(3, "s3cret")
    token, anonymous = {b"authorization": b"Bearer s3cret"}, {b"authorization": b"Bearer wrong"}
    for conn in "abc":
        assert slots.admit(conn) == (True, None)
    slots.request("a", token)  # serving a request with the token
    slots.request("b", anonymous)  # an unauthenticated health stream, say
    # The connection idle the longest goes first (c, idle since it opened), then the unauthenticated
    # stream (b); a, serving the token, stays.
    assert slots.admit("d") == (True, "c")
    assert slots.admit("e") == (True, "b")
    slots.request("d", token)
    slots.request("e", token)
    assert slots.admit("f") == (False, None)  # every slot serves the token: the newcomer gets 503
    slots.closed("f")
    slots.idle("a")  # its response is done: it waits like any idle socket
    assert slots.admit("g") == (True, "a") and len(slots) == 3


def _closed_by_peer(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        return sock.recv(1) == b""
    except BlockingIOError:
        return False
