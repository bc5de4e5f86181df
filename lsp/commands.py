"""The commands about the server itself: ``diffu.toggle`` and ``diffu.snooze`` (pausing suggestions
while typing) and ``diffu.status`` (where it stands). The editors' status items and menus call them; the
commands of a feature live with it (``diffu.accepted`` in ``lsp.server``, ``diffu.fillHoles`` in
``lsp.code_actions``). :func:`register` adds them to the server.
"""

from __future__ import annotations

from typing import Any

from pygls.exceptions import JsonRpcInvalidParams

from lsp.core import DiffuLanguageServer
from lsp.settings import context_budget, row_limit

STATUS = "diffu.status"
TOGGLE = "diffu.toggle"
SNOOZE = "diffu.snooze"


def register(server: DiffuLanguageServer) -> None:
    """Add ``diffu.toggle``, ``diffu.snooze`` and ``diffu.status`` to ``server``."""
    server.command(TOGGLE)(toggle)
    server.command(SNOOZE)(snooze)
    server.command(STATUS)(status)


def toggle(ls: DiffuLanguageServer, *args: Any) -> dict[str, Any]:
    """``diffu.toggle``: pause suggestions while typing until toggled again, or resume them (a snooze
    included). Explicit requests still ask while paused. Returns the new status item."""
    del args
    if ls.paused is None:
        ls.pause(None)
    else:
        ls.resume()
    return ls.status_item()


def snooze(ls: DiffuLanguageServer, *args: Any) -> dict[str, Any]:
    """``diffu.snooze(minutes?)``: pause suggestions while typing for a while (the ``snoozeMinutes``
    setting when no duration is given). Returns the new status item."""
    minutes = args[0] if args else None
    if minutes is None:
        minutes = ls.settings.snooze_minutes
    if isinstance(minutes, bool) or not isinstance(minutes, int | float) or not 0 < minutes <= 1440:
        raise JsonRpcInvalidParams(
            f"{SNOOZE}: expected minutes, more than 0 and at most 1440 (or none), got {minutes!r}"
        )
    ls.pause(float(minutes))
    return ls.status_item()


def status(ls: DiffuLanguageServer, *args: Any) -> dict[str, Any]:
    """Where the server stands: the status item, daemon, model, settings, counters, latency and cache."""
    del args
    link = ls.link
    return {
        "status": ls.status_item(),
        "paused": ls.paused is not None,
        "connected": link.connected,
        "model": link.model,
        "max_context": link.max_context,
        # The prompt budget in use, and the longest row a suggestion takes (the model's recommended one
        # for editors when the user sets no contextTokens).
        "editor_context": link.editor_context,
        "context_tokens": context_budget(ls.settings),
        "row_limit": row_limit(ls.settings, link.max_context, link.editor_context),
        "daemon_features": sorted(link.features),
        "warm_request": link.warmed,
        "url": link.url,
        "provider": ls.provider.name,
        "dynamic": ls.provider.dynamic,
        "chars_per_token": round(link.chars_per_token, 3),
        "settings": ls.settings.to_json(),
        "counters": dict(ls.counters),
        "latency": ls.timings.summary(),
        "timings": [t.to_json() for t in ls.timings.recent],
        "cache": {"entries": len(ls.cache), "hits": ls.cache.hits, "forward_hits": ls.cache.forward_hits},
        "recent_chunks": len(ls.recent),
    }
