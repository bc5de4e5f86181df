"""Topic changes (issue #45): multi-turn training conversations, held-out two-turn ones, and the leak."""

from __future__ import annotations

import pytest

from assistant.evals import topic_change as tc


def conv(path: str, name: str, request: str | None = None, answer: str | None = None) -> dict:
    request = request or f"Write a Python function named `{name}`."
    answer = answer or f"```python\ndef {name}(x):\n    return x\n```"
    return {
        "messages": [{"role": "user", "content": request}, {"role": "assistant", "content": answer}],
        "source": {"path": path, "name": name, "kind": "function", "framing": "summary"},
    }


POOL = [conv(f"pkg/m{i % 7}.py", f"name_{i}") for i in range(40)]


def test_topic_changes_put_unrelated_requests_with_their_answers_before_the_last_one() -> None:
    short = {id(c) for c in POOL[:10]}  # the final requests may only be these

    def make() -> list[dict]:
        return tc.topic_changes(POOL, 60, last=lambda c: id(c) in short, fits=lambda c: True, seed=3)

    made = make()
    assert len(made) == 60 and make() == made  # a pure function of its inputs and seed
    turns = {len(c["messages"]) // 2 for c in made}
    assert turns == {2, 3}
    by_name = {c["source"]["name"]: c for c in POOL}
    for c in made:
        sources = c["source"]["turns"]
        assert by_name[sources[-1]["name"]] in POOL[:10]
        assert len({s["path"] for s in sources}) == len(sources)  # every turn from another file
        # Each turn is a training request followed by its own answer, in the order of the sources.
        for k, s in enumerate(sources):
            assert c["messages"][2 * k : 2 * k + 2] == by_name[s["name"]]["messages"]
        assert [m["role"] for m in c["messages"]] == ["user", "assistant"] * len(sources)


def test_topic_changes_respect_the_length_limit() -> None:
    def fits(c: dict) -> bool:
        return len(c["messages"]) <= 4  # two turns at most

    made = tc.topic_changes(POOL, 30, last=lambda c: True, fits=fits, three_turns=1.0)
    assert made and all(len(c["messages"]) == 4 for c in made)
    assert tc.topic_changes(POOL, 30, last=lambda c: True, fits=lambda c: False) == []


def test_a_request_that_names_another_is_not_put_with_it() -> None:
    a = conv("a.py", "parse", "Write `parse`, the inverse of `render`.")
    b = conv("b.py", "render")
    c = conv("c.py", "other")
    assert not tc._unrelated(a, b) and not tc._unrelated(b, a)
    assert tc._unrelated(a, c) and not tc._unrelated(a, conv("a.py", "other"))  # same file
    assert not tc._unrelated(c, conv("d.py", "other"))  # same name


def test_every_held_out_request_is_asked_second_once_after_another() -> None:
    two = tc.two_turn(POOL, seed=1)
    assert [c["source"]["second"] for c in two] != [p["source"] for p in POOL]  # shuffled
    assert sorted(c["source"]["second"]["name"] for c in two) == sorted(p["source"]["name"] for p in POOL)
    firsts = [c["source"]["first"]["name"] for c in two]
    assert max(firsts.count(n) for n in set(firsts)) <= 2
    for c in two:
        first, second = c["source"]["first"], c["source"]["second"]
        assert first["path"] != second["path"] and first["name"] != second["name"]
        assert len(c["messages"]) == 4 and c["messages"][2]["content"].endswith(f"`{second['name']}`.")
    assert tc.two_turn(POOL, seed=1) == two
    with pytest.raises(ValueError, match="no request unrelated"):
        tc.two_turn([conv("a.py", "f"), conv("a.py", "g")])


def test_the_leak_is_the_first_requests_name_in_the_second_answer() -> None:
    two = tc.two_turn(POOL[:4])
    first = [c["source"]["first"]["name"] for c in two]
    second = [c["source"]["second"]["name"] for c in two]
    answers = [
        f"```python\ndef {first[0]}(x):\n    return x\n```",  # the previous request again: the leak
        f"Sure.\n\n```python\nclass {second[1]}:\n    def {first[1]}(self):\n",  # open block, both: answered
        "```python\nx = 1\n```",  # neither
        f"def {first[3]}(x): pass",  # no fence: the whole answer is read
    ]
    assert [tc.answered(c, a) for c, a in zip(two, answers, strict=True)] == [
        "first",
        "second",
        "neither",
        "first",
    ]
    found = tc.leak(two, answers)
    assert found["leak"]["count"] == 2 and found["leak"]["share"] == 0.5
    low, high = found["leak"]["ci95"]
    assert 0.1 < low < 0.5 < high < 0.9  # Wilson's interval of 2 in 4
    assert found["answers_second"]["count"] == 1 and found["neither"]["count"] == 1
    assert found["verdicts"] == ["first", "second", "neither", "first"]
    assert tc.defined_names(
        "```python\nasync def  go():\n    pass\n```\n```python\ndef later(): pass\n```"
    ) == {"go"}
