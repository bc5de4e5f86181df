"""diffu chat: the Textual terminal UI that shows the denoising live.

``app`` (the ChatApp: layout, connecting, routing the prompt and its parts' messages, screens) composed of
``chat_log`` (the log, the selected code block, replay and copy), ``conversation`` (what the model sees,
and its rows in the store), ``turns`` (each answer's worker: streamed, retried, cancelled, saved),
``context`` (the files in context) and ``workbench`` (the file commands: ``/add``, ``/apply``, ``/undo``,
``/fill``..., read from a prompt by ``commands``); ``widgets`` (prompt, answers, notices, inline errors),
``denoise`` (the live canvas), ``fill_view`` (a file as the canvas), ``review`` (a change's diff, y/n),
``screens`` (replay, settings, conversations, help), ``render`` (Rich rendering of steps, shared with
``--once`` and ``diffu fill``), ``backend`` (the daemon through ``assistant.client``), ``store`` (SQLite),
``settings`` and ``keys`` (config.toml's ``[chat]`` and ``[keymap]``), ``once`` (``diffu chat --once``).
Nothing here imports JAX.
"""
