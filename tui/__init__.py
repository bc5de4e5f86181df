"""diffu chat: the Textual terminal UI that shows the denoising live. Built in the tui issue."""
