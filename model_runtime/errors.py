"""Errors the runtime raises for bad input; each message names what is wrong and how to fix it."""

from __future__ import annotations


class DiffuError(Exception):
    """Base class of the user-facing errors of the runtime."""


class ModelError(DiffuError):
    """A model directory, hub id, config, tokenizer or weight file is missing or invalid."""


class ConfigError(ModelError):
    """A ``config.json`` field is missing or invalid; ``key`` names it."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"config.json: {key}: {message}")
        self.key = key


class WeightsError(ModelError):
    """A checkpoint tensor is unknown, missing, duplicated or mis-shaped; ``tensor`` names it."""

    def __init__(self, tensor: str, message: str) -> None:
        super().__init__(f"{tensor}: {message}")
        self.tensor = tensor


class InputError(DiffuError, ValueError):
    """A request cannot run as given (prompt beyond the context, empty batch, ...).

    ``field`` names the request field at fault when there is one; ``details`` holds the facts of the
    message as data (token counts, limits) for clients that act on them.
    """

    def __init__(self, message: str, *, field: str | None = None, details: dict[str, object] | None = None):
        super().__init__(message)
        self.field = field
        self.details = dict(details or {})
