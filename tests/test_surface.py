"""No behaviour change users or editors can see: every ``diffu`` command's ``--help`` and the language
server's ``initialize`` answer are byte for byte the golden copies in ``tests/golden/``, captured from
the tree before issue #41 (``tests/surface.py`` says how to capture them again for an intended change).

One intended change since: ``help/diffu_train.txt``, whose flags are derived from the training options'
declarations (#41): the defaults its help restated by hand read ``(default: X)`` as every derived flag's
do (``(8192)`` is ``(default: 8192)``, ``(1e-3)`` is ``(default: 0.001)``, the --rl group's ``1e-6`` is
``1e-06``), and ``--rollout-decoder`` lists the sampling option's decoders (``{reference,fast,sliding}``,
any of which samples rollouts). The features of the same round since: ``diffu fill`` and the chat's
``--once [PROMPT]``, ``--file`` and ``--json`` (#42), and the sampling option ``block_scope`` with
``max_lines`` now read by every decoder (#44, #45), in every command that takes sampling flags.
Everything else is as captured.
"""

from __future__ import annotations

import difflib
import json

import pytest

from tests.assistant.helpers import REPO
from tests.surface import LSP_PROFILES, help_tree, lsp_initialize

GOLDEN = REPO / "tests" / "golden"


def _differences(want: dict[str, str], have: dict[str, str]) -> list[str]:
    """A unified diff per file that differs, and a line per file only one side has."""
    out = [f"{name}: no longer generated" for name in sorted(set(want) - set(have))]
    out += [f"{name}: new, not in {GOLDEN}" for name in sorted(set(have) - set(want))]
    for name in sorted(set(want) & set(have)):
        if want[name] != have[name]:
            diff = difflib.unified_diff(
                want[name].splitlines(keepends=True), have[name].splitlines(keepends=True), name, "now"
            )
            out.append("".join(diff))
    return out


def _golden(kind: str) -> dict[str, str]:
    return {
        f"{kind}/{path.name}": path.read_text(encoding="utf-8") for path in sorted((GOLDEN / kind).iterdir())
    }


def test_every_help_text_is_the_golden_one() -> None:
    have = {f"help/{prog.replace(' ', '_')}.txt": text for prog, text in help_tree(REPO).items()}
    differences = _differences(_golden("help"), have)
    assert not differences, "diffu --help changed:\n" + "\n".join(differences)


@pytest.mark.parametrize("profile", LSP_PROFILES)
def test_the_language_servers_capabilities_are_the_golden_ones(profile: str) -> None:
    name = f"lsp_initialize/{profile}.json"
    have = json.dumps(lsp_initialize(REPO, profile), indent=2) + "\n"
    differences = _differences({name: (GOLDEN / name).read_text(encoding="utf-8")}, {name: have})
    assert not differences, "initialize changed:\n" + "\n".join(differences)


def test_the_comparison_sees_a_changed_byte() -> None:
    """The golden files hold something, and one changed character is a difference."""
    golden = _golden("help")
    assert len(golden) >= 10 and "diffu train" in golden["help/diffu_train.txt"]
    changed = dict(golden, **{"help/diffu.txt": golden["help/diffu.txt"].replace("diffu", "diffv", 1)})
    assert _differences(golden, changed) and not _differences(golden, dict(golden))
