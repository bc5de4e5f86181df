"""The option declarations every front end derives from: reading, checking and the messages."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from model_runtime.options import Flat, OptionError, like, mirror, option, options, validate


@dataclass(frozen=True, kw_only=True)
class Knobs:
    count: int = option(4, ge=1, le=64, help="how many")
    share: float = option(0.5, gt=0, le=1, help="a share")
    mode: str = option("a", choices=("a", "b"), help="a mode")
    budget: float | None = option(None, ge=0.001, help="seconds; unset: none")
    label: str | None = option(None, help="a name")
    on: bool = option(True, help="a switch")
    names: tuple[str, ...] = option((), help="names")
    sizes: tuple[int, ...] = option((1, 2), ge=1, help="sizes")
    even: int = option(2, rule=lambda v: "" if v % 2 == 0 else f"must be even, got {v}", help="even")

    def __post_init__(self) -> None:
        validate(self)


K = options(Knobs)


@dataclass(frozen=True, kw_only=True)
class Inner:
    count: int | None = like(Knobs, "count", default=None)
    mode: str | None = like(Knobs, "mode", default=None)


@dataclass(frozen=True, kw_only=True)
class Outer:
    count: int = like(Knobs, "count", default=8)  # its own, in place of the inner one
    inner: Inner = field(default_factory=Inner)

    def __post_init__(self) -> None:
        validate(self)


def problem(name: str, raw: object, **how: bool) -> str:
    with pytest.raises(OptionError) as info:
        K[name].read(raw, **how)
    assert info.value.field == name and str(info.value) == f"{name}: {info.value.problem}"
    return info.value.problem


def test_types_and_optional_come_from_the_annotation() -> None:
    assert [(o.kind, o.item, o.optional) for o in K.values()] == [
        (int, None, False),
        (float, None, False),
        (str, None, False),
        (float, None, True),
        (str, None, True),
        (bool, None, False),
        (tuple, str, False),
        (tuple, int, False),
        (int, None, False),
    ]
    assert K["count"].default == 4 and K["count"].help == "how many"


def test_bounds_in_words() -> None:
    assert K["count"].bounds() == "in 1..64"  # integers, both ends included
    assert K["share"].bounds() == "in (0, 1]"
    assert K["budget"].bounds() == ">= 0.001"
    assert K["mode"].bounds() == ""
    assert problem("count", 65) == "must be in 1..64, got 65"
    assert problem("share", 0) == "must be in (0, 1], got 0.0"
    assert problem("mode", "c") == "must be one of a, b; got 'c'"
    assert problem("sizes", [1, 0]) == "must be >= 1, got 0"  # bounds apply to each item
    assert problem("even", 3) == "must be even, got 3"


def test_the_three_ways_of_reading_a_value() -> None:
    # A typed value (TOML, a Python mapping): strict types, and the words the config file uses.
    assert problem("count", "3") == "must be an integer, got '3'"
    assert problem("count", 3.0) == "must be an integer, got 3.0"
    assert problem("count", True) == "must be an integer, got True"
    assert problem("count", None) == "must be set"
    assert problem("share", float("inf")) == "must be a finite number, got inf"
    assert K["share"].read(1) == 1.0 and isinstance(K["share"].read(1), float)
    assert K["label"].read("") is None and K["budget"].read(None) is None
    assert K["names"].read(["x", "y"]) == ("x", "y")
    assert problem("names", "x, y") == "must be a list of strings, got 'x, y'"
    # JSON: an integral number is an integer, a comma-separated string a list; the words of a request.
    assert K["count"].read(3.0, json=True) == 3
    assert problem("count", 3.5, json=True) == "expected an integer, got 3.5"
    assert problem("count", None, json=True) == "must not be null"
    assert problem("share", float("nan"), json=True) == "expected a finite number, got nan"
    assert problem("on", "yes", json=True) == "expected true or false, got 'yes'"
    assert K["names"].read("x, y,", json=True) == ("x", "y")
    # Text (an environment variable, a form's input): parsed, then checked alike; empty is unset.
    assert K["count"].read(" 12 ", text=True) == 12
    assert problem("count", "12.5", text=True) == "must be an integer, got '12.5'"
    assert problem("count", "", text=True) == "must be set"
    assert K["budget"].read(" ", text=True) is None
    assert problem("budget", "0", text=True) == "must be >= 0.001, got 0.0"
    assert K["on"].read("Off", text=True) is False
    assert problem("on", "maybe", text=True) == "must be a boolean (1/0, true/false), got 'maybe'"
    assert K["sizes"].read("4, 8", text=True) == (4, 8)
    assert K["names"].read("", text=True) == ()  # DIFFU_ALLOWED_HOSTS="": none
    assert problem("sizes", "4,x", text=True) == "must be a list of integers, got '4,x'"


def test_a_long_value_is_not_echoed() -> None:
    message = problem("mode", "x" * 100_000, json=True)
    assert message == "must be one of a, b; got a string of 100000 characters"


def test_validate_raises_the_front_ends_error() -> None:
    class Refused(Exception):
        def __init__(self, key: str, message: str) -> None:
            super().__init__(f"[{key}] {message}")

    with pytest.raises(OptionError, match=r"^share: must be in \(0, 1\], got 2"):
        Knobs(share=2)
    knobs = Knobs()
    object.__setattr__(knobs, "mode", "z")  # past __post_init__'s check
    with pytest.raises(Refused, match=r"^\[mode\] must be one of a, b; got 'z'$"):
        validate(knobs, Refused)


def test_like_keeps_the_declaration_and_changes_only_what_it_names() -> None:
    @dataclass(frozen=True, kw_only=True)
    class View:
        count: int | None = like(Knobs, "count", default=None, le=8)
        mode: str = like(Knobs, "mode")

    view = options(View)
    assert view["count"].optional and view["count"].default is None
    assert (view["count"].ge, view["count"].le, view["count"].help) == (1, 8, "how many")
    with pytest.raises(OptionError, match=r"count: must be in 1\.\.8, got 9"):
        view["count"].read(9)
    assert view["mode"] == K["mode"]


def test_declaration_mistakes_fail_at_import() -> None:
    @dataclass
    class BadDefault:
        count: int = option(0, ge=1, help="")

    with pytest.raises(TypeError, match=r"BadDefault.count: the default must be >= 1, got 0"):
        options(BadDefault)

    @dataclass
    class BadType:
        when: list[int] = option((), help="")

    with pytest.raises(TypeError, match="BadType.when: an option is a bool, int, float, str or tuple"):
        options(BadType)


def test_mirror_catches_a_copy_that_fell_behind() -> None:
    @dataclass(frozen=True)
    class Copy:
        count: int | None = None
        share: float | None = None

    mirror(Copy, Knobs, omit=tuple(name for name in K if name not in ("count", "share")))
    with pytest.raises(
        TypeError, match=r"Copy must have a field per option of Knobs: \['count', 'share', 'mode'"
    ):
        mirror(Copy, Knobs, omit=tuple(name for name in K if name not in ("count", "share", "mode")))

    @dataclass(frozen=True)
    class Mistyped:
        count: float | None = None

    with pytest.raises(TypeError, match="Mistyped.count must be"):
        mirror(Mistyped, Knobs, omit=tuple(name for name in K if name != "count"))


def test_a_flat_view_reads_nested_options_under_their_own_names() -> None:
    view = Flat(Outer, "inner")
    assert list(view.options) == ["count", "mode"] and view.options["count"].default == 8
    outer = view.replace(Outer(), {"count": 2, "mode": "b"})
    assert outer == Outer(count=2, inner=Inner(mode="b"))
    assert view.values(outer) == {"count": 2, "mode": "b"} and view.get(outer, "mode") == "b"
    with pytest.raises(OptionError, match="^mode: must be one of a, b; got 'c'$"):
        view.replace(outer, {"mode": "c"})  # the nested options are validated with the outer ones
    with pytest.raises(TypeError, match="Outer has no option 'nope'"):
        view.replace(outer, {"nope": 1})
