"""The hole logic every front end shares (``assistant.infill.holes``): finding, masking, finishing and
putting in fills; the language server's, ``diffu fill``'s and the chat's ``/fill``."""

from __future__ import annotations

import ast

import pytest

from assistant.infill.holes import (
    MASK,
    FillOptions,
    Hole,
    HoleError,
    apply_fills,
    find_holes,
    finish_fill,
    masked_prompt,
    plan_fill,
    split_by_range,
    target_fills,
)


def test_find_holes() -> None:
    text = f"a = {MASK}{MASK}{MASK}\nb = ???\nc = ???\n"
    holes = find_holes(text, "???", 16)
    assert [(h.tokens, text[h.start : h.end]) for h in holes] == [(3, MASK * 3), (16, "???"), (16, "???")]
    assert len(find_holes(text, "???", 16, start=text.index("b"), end=text.index("c"))) == 1
    assert len(find_holes(text, "", 16)) == 1  # no marker: only masks


def test_masked_prompt_windows_around_the_holes() -> None:
    text = (
        "".join(f"line {i}\n" for i in range(200))
        + "x = ???\ny = ???\n"
        + "".join(f"t {i}\n" for i in range(200))
    )
    holes = find_holes(text, "???", 4)
    prompt = masked_prompt(text, holes, path="a.py", language="python", budget_chars=300)
    assert prompt.text.startswith("# a.py (python)\n")
    assert f"x = {MASK * 4}\ny = {MASK * 4}\n" in prompt.text
    assert len(prompt.text) - 8 * len(MASK) + 8 <= 300 + 20


def test_masked_prompt_keeps_holes_outside_the_selection_as_masks() -> None:
    """Finding 4: a hole outside the selection is a mask the model sees, not literal text."""
    text = f"a = {MASK}{MASK}\nb = ???\nc = ???\n"
    holes = find_holes(text, "???", 3)
    prompt = masked_prompt(
        text, [holes[1]], others=[holes[0], holes[2]], path="a", language="", budget_chars=500
    )
    assert prompt.text == f"a = {MASK * 2}\nb = {MASK * 3}\nc = {MASK * 3}\n"
    assert prompt.holes == holes  # one fill comes back per hole, in order


def test_finish_fill() -> None:
    doc = "x = ???\n    ???\n"
    inline, alone = Hole(4, 7, 8), Hole(12, 15, 8)
    assert finish_fill(" 42\nextra", doc, inline) == "42"
    assert finish_fill("a = 1\n    b = 2\n\n", doc, alone) == "a = 1\n    b = 2"
    assert finish_fill("<|endoftext|>", doc, alone) == ""
    # A BPE token with a leading space at the hole's column: the fill starts at the column (finding 2).
    assert finish_fill(" return x", doc, alone) == "return x"


def test_finish_fill_goes_through_the_suggestion_pipeline() -> None:
    """Finding 2: fills are cut where they repeat the code around them, as suggestions are."""
    doc = "def f(x):\n    ???\n\n\ndef g():\n    pass\n"
    hole = find_holes(doc, "???", 8)[0]
    # The model repeats the line above the hole: nothing is left worth inserting (the marker stays).
    assert finish_fill("def f(x):\n    return x", doc, hole) == ""
    # The fill runs on into the code after the hole: cut where it repeats it.
    assert finish_fill("return x\n\n\ndef g():\n    pass", doc, hole) == "return x"
    inline = find_holes("y = f(???)\n", "???", 8)[0]
    assert finish_fill("1)\n", "y = f(???)\n", inline) == "1"  # the ) after the hole is not doubled


def test_split_by_range_selects_the_holes_wholly_inside() -> None:
    text = "a = ???\nb = ???\nc = ???\n"
    holes = find_holes(text, "???", 4)
    inside, others = split_by_range(holes, text.index("b"), text.index("c"))
    assert inside == [holes[1]] and others == [holes[0], holes[2]]
    # A range cutting through a hole leaves it out; an empty range selects every hole.
    assert split_by_range(holes, text.index("b") + 5, len(text))[0] == [holes[2]]
    assert split_by_range(holes, 3, 3) == (holes, [])


SOURCE = """import math


def area(r):
    return ???


def double(x):
    return ???
"""


def test_a_plan_sends_the_whole_file_and_places_the_live_region() -> None:
    plan = plan_fill(SOURCE, path="geo.py", language="python", options=FillOptions(hole_tokens=5))
    assert plan.prompt.text == "# geo.py (python)\n" + SOURCE.replace("???", MASK * 5)
    assert plan.masks == 10 and len(plan.targets) == 2
    # A step's canvas covers the first hole to the last; the live view puts it between these.
    assert plan.before == SOURCE[: SOURCE.index("???")]
    assert plan.after == "\n"
    ranged = plan_fill(
        SOURCE, path="geo.py", language="python", options=FillOptions(), start=SOURCE.index("def double")
    )
    assert ranged.targets == [find_holes(SOURCE, "???", 16)[1]] and len(ranged.prompt.holes) == 2


def test_nothing_to_fill_is_one_line_naming_the_file_and_the_markers() -> None:
    with pytest.raises(
        HoleError, match=r"^geo.py: no holes to fill \(mark them with <\|mask\|> or \?\?\?\)$"
    ):
        plan_fill("x = 1\n", path="geo.py", language="python", options=FillOptions())
    with pytest.raises(HoleError, match="no holes to fill in that range"):
        plan_fill(SOURCE, path="geo.py", language="python", options=FillOptions(), start=0, end=10)


def test_fills_go_in_with_every_character_outside_the_holes_kept() -> None:
    plan = plan_fill(SOURCE, path="geo.py", language="python", options=FillOptions())
    fills = target_fills(SOURCE, plan.prompt, plan.targets, [" math.pi * r * r\n\nextra", "x * 2"])
    assert fills == ["math.pi * r * r", "x * 2"]
    filled = apply_fills(SOURCE, plan.targets, fills)
    assert filled == SOURCE.replace("???", "math.pi * r * r", 1).replace("???", "x * 2", 1)
    ast.parse(filled)
    # An empty fill leaves its marker where it was.
    assert apply_fills(SOURCE, plan.targets, ["", "x * 2"]) == SOURCE[::-1].replace("???", "2 * x", 1)[::-1]


def test_a_daemon_answer_with_the_wrong_number_of_fills_is_an_error() -> None:
    plan = plan_fill(SOURCE, path="geo.py", language="python", options=FillOptions())
    with pytest.raises(HoleError, match="filled 1 holes of the 2 sent"):
        target_fills(SOURCE, plan.prompt, plan.targets, ["1"])
    with pytest.raises(HoleError, match="filled none holes"):
        target_fills(SOURCE, plan.prompt, plan.targets, None)
