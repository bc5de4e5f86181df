"""The user's files, as the chat and ``diffu fill`` work with them: plain Python, no JAX, no HTTP, no UI.

``files``: reading a file for the prompt (one clear refusal per path that cannot be sent: missing, a
directory, binary, not UTF-8, too large), line ranges (``path:10-40``), the format files take in a
prompt, ``@path`` mentions and path completion. ``merge``: a code block's definitions put into a Python
file in place of the same ones (found with ``ast``). ``edits``: a change shown as a unified diff, written
atomically only if the file did not change since, and undone byte for byte.

Below the front ends (``tui``, the CLI), which only show what these functions decide.
"""
