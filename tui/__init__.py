"""diffu chat: the Textual terminal UI that shows the denoising live.

``app`` (the ChatApp: layout, connecting, routing the prompt and its parts' messages, screens) composed of
``chat_log`` (the log and the selected code block), ``conversation`` (what the model sees, and its rows
in the store) and ``turns`` (each answer's worker: streamed, retried, cancelled, saved); ``widgets``
(prompt, answers, notices, inline errors), ``denoise`` (the live canvas), ``screens`` (replay,
settings, conversations, help), ``render`` (Rich rendering of steps, shared with ``--once``), ``backend``
(the daemon through ``assistant.client``), ``store`` (SQLite), ``settings`` and ``keys`` (config.toml's
``[chat]`` and ``[keymap]``), ``once`` (``diffu chat --once``). Nothing here imports JAX.
"""
