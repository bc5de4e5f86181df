"""``diffu lsp`` starts like an editor needs: ``initialize`` answered at once, nothing heavy imported."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.assistant.helpers import isolated_env
from tests.lsp.conftest import LSP_COMMAND

INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"processId": None, "rootUri": None, "capabilities": {}},
}


def test_initialize_answers_at_once_without_jax_or_httpx(tmp_path) -> None:
    """An editor starting ``diffu lsp`` gets ``initialize`` answered before anything else happens: no
    model, no HTTP stack, no daemon (none runs, none is started). How fast is a benchmark's business
    (``scripts/lsp_latency.py``; about 0.6 s on an idle 2-core machine, most of it importing lsprotocol)."""
    probe = (
        "import sys, lsp.server; "
        "print(sorted(m for m in ('jax', 'httpx', 'model_runtime.runtime') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    body = json.dumps(INITIALIZE).encode()
    proc = subprocess.Popen(
        LSP_COMMAND,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=isolated_env(tmp_path, DIFFU_AUTOSTART="0"),
    )
    try:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
        proc.stdin.flush()
        header = proc.stdout.readline()
    finally:
        proc.kill()
        proc.wait()
    assert header.startswith(b"Content-Length")
