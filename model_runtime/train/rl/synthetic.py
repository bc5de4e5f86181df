"""Small programming tasks in AceCode's format, generated from a seed (the recipe's data needs a download).

Each family is a one-function problem (arithmetic, strings, lists, dictionaries) with a reference
solution; a task is a family with a constant and a function name picked by the seed, and four asserts
whose expected values come from running the reference solution on seeded inputs. The same seed gives the
same file, byte for byte; the held-out split is a seeded share of the tasks (other constants and names
of the same families), kept out of training.

    python -m model_runtime.train.rl.synthetic --out DIR [--seed 0] [--per-family 10] [--heldout 0.2]

writes ``DIR/train.jsonl`` and ``DIR/heldout.jsonl``. Every line also carries its ``solution`` (a column
the trainer passes to reward functions and otherwise ignores), so anyone can check the tests.
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from model_runtime.train.rl.tasks import Task, write_tasks

WORDS = (
    "apple",
    "banana",
    "cherry",
    "delta",
    "echo",
    "level",
    "noon",
    "python",
    "river",
    "stats",
    "xyz",
    "a",
)
Args = tuple[object, ...]  # one call's arguments


@dataclass(frozen=True)
class Family:
    """``names``: function-name templates; ``ks``: the constants; ``question`` (what the function
    returns) and ``body`` use {k}; ``inputs(rng, k)`` draws one call's arguments."""

    category: str
    names: tuple[str, ...]
    params: str
    question: str
    body: str
    inputs: Callable[[random.Random, object], Args]
    ks: tuple[object, ...] = (None,)


def _ints(lo: int = -20, hi: int = 20) -> Callable[[random.Random, object], Args]:
    return lambda rng, k: (rng.randint(lo, hi),)


def _two_ints(rng: random.Random, k: object) -> Args:
    return (rng.randint(-50, 50), rng.randint(-50, 50))


def _word(rng: random.Random, k: object) -> Args:
    return (rng.choice(WORDS),)


def _text(rng: random.Random, k: object) -> Args:
    return (" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 4))),)


def _list(rng: random.Random, k: object) -> Args:
    return ([rng.randint(-9, 9) for _ in range(rng.randint(0, 6))],)


def _nonempty_list(rng: random.Random, k: object) -> Args:
    return ([rng.randint(-9, 9) for _ in range(rng.randint(1, 6))],)


def _dict(rng: random.Random, k: object) -> Args:
    keys = rng.sample(WORDS, rng.randint(1, 4))
    return ({key: rng.randint(0, 9) for key in keys},)


K = (2, 3, 4, 5, 6, 7, 9, 10, 11, 12)
FAMILIES: tuple[Family, ...] = (
    # -- arithmetic
    Family("arithmetic", ("add_{k}", "plus_{k}"), "x", "x plus {k}.", "return x + {k}", _ints(), K),
    Family("arithmetic", ("times_{k}", "multiply_by_{k}"), "x", "x multiplied by {k}.", "return x * {k}",
           _ints(), K),
    Family("arithmetic", ("minus_{k}", "subtract_{k}"), "x", "x minus {k}.", "return x - {k}", _ints(), K),
    Family("arithmetic", ("is_divisible_by_{k}", "divisible_by_{k}"), "n",
           "True if n is divisible by {k}, else False.", "return n % {k} == 0", _ints(-40, 40), K),
    Family("arithmetic", ("square", "squared", "sq", "second_power"), "x", "x squared.", "return x * x",
           _ints()),
    Family("arithmetic", ("larger", "max_of_two", "bigger", "greater_of"), "a, b", "the larger of a and b.",
           "return max(a, b)", _two_ints),
    Family("arithmetic", ("smaller", "min_of_two", "lesser", "least_of"), "a, b", "the smaller of a and b.",
           "return min(a, b)", _two_ints),
    Family("arithmetic", ("sum_to", "triangle", "sum_up_to", "total_to"), "n",
           "the sum of the integers from 1 to n (0 when n < 1).", "return sum(range(1, n + 1))",
           _ints(0, 30)),
    Family("arithmetic", ("abs_diff", "distance", "gap", "spread"), "a, b",
           "the absolute difference of a and b.", "return abs(a - b)", _two_ints),
    Family("arithmetic", ("mod_{k}", "remainder_{k}"), "n", "the remainder of n divided by {k}.",
           "return n % {k}", _ints(0, 60), K),
    # -- strings
    Family("strings", ("reverse", "reverse_string", "backwards", "flip"), "s", "the string s reversed.",
           "return s[::-1]", _word),
    Family("strings", ("shout", "to_upper", "upper", "caps"), "s", "s in upper case.", "return s.upper()",
           _text),
    Family("strings", ("count_{k}", "how_many_{k}"), "s", "how many times the letter '{k}' occurs in s.",
           "return s.count('{k}')", _text, tuple("aeilnorst")),
    Family("strings", ("starts_with_{k}", "begins_with_{k}"), "s", "True if s starts with the letter '{k}'.",
           "return s.startswith('{k}')", _word, tuple("abcdelnprsx")),
    Family("strings", ("repeat_{k}", "times_{k}_text"), "s", "s repeated {k} times.", "return s * {k}", _word,
           (2, 3, 4)),
    Family("strings", ("is_palindrome", "palindrome", "reads_same_backwards", "mirrored"), "s",
           "True if s reads the same backwards.", "return s == s[::-1]", _word),
    Family("strings", ("first_letter", "initial", "head_char", "first_char"), "s",
           "the first character of the non-empty string s.", "return s[0]", _word),
    Family("strings", ("word_count", "count_words", "n_words", "words_in"), "s",
           "the number of words in s (split on spaces).", "return len(s.split())", _text),
    Family("strings", ("add_suffix_{k}", "with_{k}"), "s", "s followed by the text '{k}'.",
           "return s + '{k}'", _word, ("ing", "ed", "s", "er", "ly", "_x")),
    Family("strings", ("count_vowels", "vowels", "vowel_count", "n_vowels"), "s",
           "the number of vowels (a, e, i, o, u) in s.", "return sum(1 for c in s if c in 'aeiou')", _text),
    # -- lists
    Family("lists", ("sum_list", "total", "list_sum", "add_all"), "xs", "the sum of the list xs.",
           "return sum(xs)", _list),
    Family("lists", ("largest", "max_list", "biggest", "top_value"), "xs",
           "the largest number in the non-empty list xs.", "return max(xs)", _nonempty_list),
    Family("lists", ("count_above_{k}", "how_many_over_{k}"), "xs",
           "how many numbers in xs are greater than {k}.", "return sum(1 for x in xs if x > {k})", _list,
           (0, 1, 2, 3, 5)),
    Family("lists", ("evens", "only_even", "keep_even", "even_numbers"), "xs",
           "the even numbers of xs, in order.", "return [x for x in xs if x % 2 == 0]", _list),
    Family("lists", ("scale_{k}", "multiply_all_{k}"), "xs",
           "a list with every number of xs multiplied by {k}.", "return [x * {k} for x in xs]", _list, K),
    Family("lists", ("last", "last_item", "final_element", "tail_value"), "xs",
           "the last element of the non-empty list xs.", "return xs[-1]", _nonempty_list),
    Family("lists", ("contains_{k}", "has_{k}"), "xs", "True if {k} is in the list xs.", "return {k} in xs",
           _list, (0, 1, 2, 3, 4, 5)),
    Family("lists", ("sorted_desc", "sort_descending", "high_to_low", "largest_first"), "xs",
           "the numbers of xs sorted from largest to smallest.", "return sorted(xs, reverse=True)", _list),
    Family("lists", ("without_{k}", "remove_all_{k}"), "xs", "xs without any occurrence of {k}.",
           "return [x for x in xs if x != {k}]", _list, (0, 1, 2, 3)),
    Family("lists", ("length", "list_length", "size", "count_items"), "xs", "the number of elements in xs.",
           "return len(xs)", _list),
    # -- dictionaries
    Family("dicts", ("get_{k}", "lookup_{k}"), "d",
           "the value of key '{k}' in the dict d, or 0 if it is missing.", "return d.get('{k}', 0)", _dict,
           ("apple", "echo", "noon", "river", "xyz")),
    Family("dicts", ("sum_values", "total_values", "values_sum", "add_values"), "d",
           "the sum of the values of the dict d.", "return sum(d.values())", _dict),
    Family("dicts", ("sorted_keys", "keys_in_order", "key_list", "ordered_keys"), "d",
           "the keys of the dict d as a sorted list.", "return sorted(d)", _dict),
    Family("dicts", ("word_counts", "count_each_word", "frequencies", "tally_words"), "s",
           "a dict mapping each word of s (split on spaces) to how many times it occurs.",
           "return {{w: s.split().count(w) for w in s.split()}}", _text),
    Family("dicts", ("has_key_{k}", "knows_{k}"), "d", "True if the dict d has the key '{k}'.",
           "return '{k}' in d", _dict, ("apple", "banana", "delta", "level", "stats")),
    Family("dicts", ("key_of_max", "argmax_key", "best_key", "top_key"), "d",
           "the key with the largest value in the non-empty dict d (the first such key on ties).",
           "return max(d, key=d.get)", _dict),
    Family("dicts", ("add_{k}_to_values", "bump_values_{k}"), "d",
           "a new dict with {k} added to every value of d.",
           "return {{key: v + {k} for key, v in d.items()}}", _dict, (1, 2, 5, 10)),
    Family("dicts", ("count_keys", "n_keys", "dict_size", "key_count"), "d",
           "the number of keys in the dict d.", "return len(d)", _dict),
)  # fmt: skip


def _task(family: Family, name_tpl: str, k: object, rng: random.Random, n_tests: int) -> Task:
    name = name_tpl.format(k=k)
    solution = f"def {name}({family.params}):\n    {family.body.format(k=k)}\n"
    scope: dict[str, object] = {}
    exec(solution, scope)  # our own reference solution, never model output
    fn = cast(Callable[..., object], scope[name])
    tests, seen = [], set()
    for _ in range(50 * n_tests):
        args = family.inputs(rng, k)
        call = f"{name}({', '.join(repr(a) for a in args)})"
        if call in seen:
            continue
        seen.add(call)
        tests.append(f"assert {call} == {fn(*args)!r}")
        if len(tests) == n_tests:
            break
    question = f"Write a Python function `{name}({family.params})` that returns {family.question.format(k=k)}"
    return Task(name, question, tuple(tests), {"category": family.category, "solution": solution})


def generate(seed: int = 0, per_family: int = 10, n_tests: int = 4) -> list[Task]:
    """Up to ``per_family`` tasks per family (fewer where names x constants run out), ids unique."""
    rng = random.Random(seed)
    tasks: list[Task] = []
    used: set[str] = set()
    for family in FAMILIES:
        combos = [(n, k) for n in family.names for k in family.ks]
        rng.shuffle(combos)
        made = 0
        for name_tpl, k in combos:
            name = name_tpl.format(k=k)
            if name in used or made == per_family:
                continue
            used.add(name)
            tasks.append(_task(family, name_tpl, k, rng, n_tests))
            made += 1
    return tasks


def split(tasks: list[Task], heldout: float, seed: int) -> tuple[list[Task], list[Task]]:
    """(train, held-out): a seeded ``heldout`` share of every category, the rest in file order."""
    rng = random.Random(seed + 1)
    held: set[str] = set()
    for category in sorted({t.extra["category"] for t in tasks}):
        ids = [t.task_id for t in tasks if t.extra["category"] == category]
        held |= set(rng.sample(ids, round(heldout * len(ids))))
    return [t for t in tasks if t.task_id not in held], [t for t in tasks if t.task_id in held]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description="Write generated AceCode-format tasks: OUT/train.jsonl, OUT/heldout.jsonl"
    )
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--per-family", type=int, default=10, help="tasks per family, at most (10)")
    p.add_argument("--heldout", type=float, default=0.2, help="share of each category held out (0.2)")
    args = p.parse_args(argv)
    if args.per_family < 1 or not 0 <= args.heldout < 1:
        p.error("--per-family must be >= 1 and --heldout in [0, 1)")
    train, held = split(generate(args.seed, args.per_family), args.heldout, args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    write_tasks(args.out / "train.jsonl", train)
    write_tasks(args.out / "heldout.jsonl", held)
    print(f"{len(train)} training and {len(held)} held-out tasks in {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
