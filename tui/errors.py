"""How the chat words an error from the daemon or the connection, and which ones a setting can fix."""

from __future__ import annotations

from assistant.client import APIError, DaemonUnavailable
from tui.settings import FIELDS, SettingsError


def describe_error(exc: Exception) -> str:
    """One readable line for an error from the daemon or the connection."""
    if isinstance(exc, APIError):
        where = "the daemon refused the request" if exc.status < 500 else "the daemon failed"
        return f"{where} ({exc.status}): {exc.message}"
    if isinstance(exc, DaemonUnavailable | SettingsError):
        return str(exc)
    return f"unexpected error: {type(exc).__name__}: {exc}"


def is_settings_error(exc: Exception) -> bool:
    """Whether the daemon refused one of the settings (so the Settings button can fix it): the error's
    ``param`` names the field, whichever layer refused it."""
    if not isinstance(exc, APIError) or exc.status >= 500:
        return False
    return exc.param in FIELDS or exc.param == "max_tokens"
