"""diffu chat: the Textual terminal UI that shows the denoising live.

``app`` (the ChatApp: layout, conversations, screens) over its parts ``chat_base`` (their shared state),
``turns`` (connecting; each answer streamed, retried, cancelled) and ``answer_actions`` (replay, copy, code
blocks), ``widgets`` (prompt, live canvas, answers, inline errors), ``screens`` (replay,
settings, conversations, help), ``render`` (Rich rendering of steps, shared with ``--once``), ``backend``
(the daemon through ``assistant.client``), ``store`` (SQLite), ``settings`` and ``keys`` (config.toml's
``[chat]`` and ``[keymap]``), ``once`` (``diffu chat --once``). Nothing here imports JAX.
"""
