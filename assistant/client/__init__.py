"""Client library for the diffu daemon: sync and async, SSE parsing, discovery, auto-start, reconnect.

Finding the daemon: ``DIFFU_URL``/``DIFFU_API_KEY`` (or ``url``/``api_key`` in config.toml) first, then the
discovery file a running daemon publishes, otherwise (``autostart``) a background daemon is started for the
configured model and its load and warm-up progress is reported through ``progress(stage, fraction,
detail)``. If the daemon goes away between calls, the next call finds or starts a new one.

The sync client lives in ``sync``, the async one in ``aio``, both made from one call table (``calls``:
every call's signature, request body and how its answer is read); events, parsing and errors live in
``core`` and finding or starting the daemon in ``locate`` (background start and stop in ``spawn``; the
discovery file the daemon publishes is ``assistant.discovery``), shared by both clients. Importing this
package must stay cheap (editors start ``diffu lsp`` on every file open): no JAX, no model_runtime beyond
its plain-Python parts, no server code.

Example::

    from assistant.client import Client
    with Client() as c:
        for event in c.stream_generate(messages=[{"role": "user", "content": "Write quicksort"}]):
            print(event)
"""

from assistant.client.aio import AsyncClient
from assistant.client.core import (
    APIError,
    DaemonUnavailable,
    Done,
    Endpoint,
    Progress,
    SamplingOptions,
    Step,
    Waiting,
    WarmShape,
)
from assistant.client.locate import client_api_key, resolve_endpoint, start_daemon, stderr_progress
from assistant.client.sync import Client

__all__ = [
    "APIError",
    "AsyncClient",
    "Client",
    "DaemonUnavailable",
    "Done",
    "Endpoint",
    "Progress",
    "SamplingOptions",
    "Step",
    "Waiting",
    "WarmShape",
    "client_api_key",
    "resolve_endpoint",
    "start_daemon",
    "stderr_progress",
]
