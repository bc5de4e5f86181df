"""Bring the VS Code extension's settings (editors/vscode/package.json) in line with the language
server's declaration (lsp.settings.editor_schema): every server setting offered, with its type, default,
bounds and choices. Descriptions already written for the settings UI are kept; a new setting gets its
declared help. The test in tests/assistant/test_option_front_ends.py fails until this is run.

    python scripts/vscode_settings.py          # rewrite package.json
    python scripts/vscode_settings.py --check  # exit 1 if it is out of date
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lsp.settings import FIELDS, KEYS, SECTION, editor_schema  # noqa: E402

MANIFEST = Path(__file__).resolve().parents[1] / "editors" / "vscode" / "package.json"
_WORDS = ("description", "markdownDescription", "enumDescriptions")


def described(key: str) -> str:
    """A new setting's description: its declared help, as markdown, saying what unset means."""
    opt = FIELDS[KEYS[key.removeprefix(f"{SECTION}.")]]
    text = opt.help.replace("``", "`")
    if opt.default is not None or "unset" in text:
        return text
    return f"{text.rstrip('.')}; unset: the daemon's default."


def updated(manifest: dict[str, Any]) -> dict[str, Any]:
    properties = manifest["contributes"]["configuration"]["properties"]
    for key, facts in editor_schema().items():
        old = properties.get(key, {})
        words = {k: v for k, v in old.items() if k in _WORDS}
        # 0 and 0.0 are one value: keep how the file writes it
        facts = {k: old[k] if old.get(k, ...) == v else v for k, v in facts.items()}
        properties[key] = {**facts, **(words or {"markdownDescription": described(key)})}
    return manifest


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only say whether package.json is current")
    args = parser.parse_args()
    text = MANIFEST.read_text(encoding="utf-8")
    new = json.dumps(updated(json.loads(text)), indent=2, ensure_ascii=False) + "\n"
    if args.check:
        print("current" if new == text else f"{MANIFEST} is out of date: run {sys.argv[0]}")
        return 0 if new == text else 1
    MANIFEST.write_text(new, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
