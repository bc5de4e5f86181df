"""Token file, Host/Origin rules, the per-model lock and discovery file, stale detection, import cost."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from assistant import api_token, discovery, paths
from assistant.server import security

REPO = Path(__file__).resolve().parents[2]


def test_token_is_created_once_with_mode_0600(diffu_dirs: Path) -> None:
    token = api_token.load_or_create_token()
    path = paths.token_file()
    assert len(token) >= 32 and path.read_text().strip() == token
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert api_token.load_or_create_token() == token  # stable across starts


def test_a_token_file_others_can_read_is_tightened(diffu_dirs: Path) -> None:
    path = paths.token_file()
    path.parent.mkdir(parents=True)
    path.write_text("my-token\n")
    os.chmod(path, 0o644)
    assert api_token.read_token() == "my-token"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


@pytest.mark.parametrize(
    ("host", "ok"),
    [
        ("127.0.0.1:8012", True),
        ("localhost:8012", True),
        ("[::1]:8012", True),
        ("app.localhost", False),
        ("LOCALHOST", True),
        ("127.0.0.2", False),
        ("evil.example:8012", False),
        ("192.168.1.10", False),
        ("", False),
        ("localhost.evil.example", False),
        ("devbox", True),
    ],
)
def test_host_allowlist(host: str, ok: bool) -> None:
    assert security.host_allowed(host, ("devbox",)) is ok


@pytest.mark.parametrize(
    ("origin", "ok"),
    [
        ("http://localhost:3000", True),
        ("https://127.0.0.1", True),
        ("http://[::1]:8080", True),
        ("vscode-webview://abc", True),
        ("https://evil.example", False),
        ("http://localhost.evil.example", False),
        ("null", False),
        ("https://app.example", True),
    ],
)
def test_cors_origins(origin: str, ok: bool) -> None:
    assert security.origin_allowed(origin, ("https://app.example",)) is ok


def test_loopback_bind_detection() -> None:
    assert all(security.is_loopback(h) for h in ("127.0.0.1", "::1", "localhost"))
    assert not security.is_loopback("0.0.0.0") and not security.is_loopback("192.168.0.2")


HOLDER = textwrap.dedent("""
    import sys, time
    from assistant import discovery
    lock = discovery.DaemonLock(sys.argv[1])
    lock.acquire()
    lock.publish(discovery.DaemonInfo(url="http://127.0.0.1:1", pid=__import__("os").getpid(),
                                      model=sys.argv[1], key=lock.key, host="127.0.0.1", port=1,
                                      started=time.time(), log_file=""))
    print("locked", flush=True)
    sys.stdin.read()  # hold the lock until stdin closes (or we are killed)
    lock.release()
""")


def _holder(model: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, model],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=os.environ.copy(),
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
    return proc


def test_one_daemon_per_model_and_clean_release(diffu_dirs: Path, tmp_path: Path) -> None:
    model = str(tmp_path)
    holder = _holder(model)
    try:
        info = discovery.find_daemon(model)
        assert info is not None and info.pid == holder.pid
        assert discovery.find_daemon(None) == info  # with no model configured, any running daemon
        assert stat.S_IMODE(discovery.discovery_path(info.key).stat().st_mode) == 0o600
        running = f"running at http://127.0.0.1:1 .pid {holder.pid}"
        with pytest.raises(discovery.AlreadyRunning, match=running):
            discovery.DaemonLock(model + "/").acquire()  # the same directory, spelt differently
        other = discovery.DaemonLock("fake:other")
        other.acquire()  # another model is fine
        other.release()
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(10)
    key = discovery.model_key(model)
    assert not discovery.discovery_path(key).exists() and not discovery.lock_path(key).exists()
    assert discovery.find_daemon(model) is None


def test_kill_9_leaves_a_stale_file_that_is_detected_and_removed(diffu_dirs: Path, tmp_path: Path) -> None:
    model = str(tmp_path)
    holder = _holder(model)
    holder.send_signal(signal.SIGKILL)
    holder.wait(10)
    key = discovery.model_key(model)
    assert discovery.discovery_path(key).exists()  # nobody cleaned up...
    assert discovery.find_daemon(model) is None  # ...but the lock is free and the pid dead: stale
    assert not discovery.discovery_path(key).exists()
    lock = discovery.DaemonLock(model)
    lock.acquire()  # and a new daemon may start
    lock.release()


def test_garbage_discovery_files_are_ignored(diffu_dirs: Path) -> None:
    paths.runtime_dir().mkdir(parents=True)
    (paths.runtime_dir() / "junk.json").write_text("{not json")
    (paths.runtime_dir() / "other.json").write_text(json.dumps({"url": "x"}))
    assert discovery.running_daemons() == []


def test_importing_the_client_loads_no_jax() -> None:
    code = (
        "import sys, assistant.client, assistant.client.spawn, assistant.discovery, assistant.config; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('jax', 'jaxlib', 'flax', 'numpy', "
        "'starlette', 'uvicorn')))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_discovery_files_planted_by_another_user_are_ignored(diffu_dirs: Path) -> None:
    if os.getuid() != 0:
        pytest.skip("needs root to create a file owned by another user")
    run = paths.ensure_private_dir(paths.runtime_dir())
    planted = run / "evil.json"
    planted.write_text(
        json.dumps(
            {
                "url": "http://127.0.0.1:9",
                "pid": os.getpid(),
                "model": "m",
                "key": "evil",
                "host": "127.0.0.1",
                "port": 9,
                "started": 0.0,
                "log_file": "",
            }
        )
    )
    os.chown(planted, 12345, 12345)
    assert discovery.DaemonInfo.from_file(planted) is None
    foreign = diffu_dirs / "foreign"
    foreign.mkdir()
    os.chown(foreign, 12345, 12345)
    with pytest.raises(paths.UnsafeDirectory, match="belongs to another user"):
        paths.ensure_private_dir(foreign)


@pytest.mark.parametrize("case", ["unset", "missing", "mode-0755", "valid"])
def test_runtime_dir_is_decided_once_from_the_environment(case, tmp_path, monkeypatch):
    import tempfile as tf

    from assistant import paths as p

    monkeypatch.delenv("DIFFU_RUNTIME_DIR", raising=False)
    xdg = tmp_path / "xdg"
    fallback = Path(tf.gettempdir()) / f"runtime-{os.getuid()}" / "diffu"
    if case == "unset":
        monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    else:
        monkeypatch.setenv("XDG_RUNTIME_DIR", str(xdg))
        if case != "missing":
            xdg.mkdir(mode=0o755 if case == "mode-0755" else 0o700)
            xdg.chmod(0o755 if case == "mode-0755" else 0o700)
    expected = xdg / "diffu" if case == "valid" else fallback
    first = p.runtime_dir()
    created = p.ensure_private_dir(first)
    assert first == expected and created == expected
    assert stat.S_IMODE(created.stat().st_mode) == 0o700
    # The same answer after the directory exists (the lock and the discovery file share it).
    assert p.runtime_dir() == first
    if case == "missing":
        assert not xdg.exists()  # never created on the user's behalf
