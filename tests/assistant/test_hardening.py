"""Daemon hardening: malformed bodies are 4xx naming the problem; a restart keeps its port."""

from __future__ import annotations

import socket

import httpx
import pytest

from assistant.client import _port_free


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
