"""User-facing options, declared once: a dataclass field's annotation is its type, and :func:`option`
adds its default, help, bounds, choices and any further rule. Every front end reads the same
declaration (:func:`options`) and checks values with the same code (:meth:`Option.read`,
:func:`validate`): the CLI flags, the client's options, the daemon's request fields, the chat's settings
and the editors' settings. Plain Python (no JAX): clients import it.

A front end that shows an option under another default or with narrower bounds declares its own field
with :func:`like`, which starts from the declared option (``like(SamplingParams, "temperature",
default=0.4)``): the checks stay the declaration's, and a change there reaches every front end.

How a value is written depends on where it comes from, so reading has three conventions (the checks
after it are the same):

- a typed value (a Python mapping, TOML): ``must be an integer, got 'x'``;
- JSON (a request body, an editor's settings): an integral number is an integer, a list of strings may
  be one comma-separated string, null is unset, and a wrong type reads ``expected an integer, got 'x'``
  as the daemon's other fields do;
- text (an environment variable, a settings-screen input): parsed to the type; empty is unset.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

_KEY = "diffu.option"  # the dataclass field metadata key of a declaration
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")
_SCALARS = (bool, int, float, str)
_NOUNS: dict[type, str] = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}


class OptionError(ValueError):
    """A value an option does not take: ``field`` names the option, ``problem`` says what is wrong."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


@dataclass(frozen=True, kw_only=True)
class _Declared:
    """What :func:`option` records in a field's metadata (the type is the field's annotation)."""

    default: Any
    help: str
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    choices: tuple[Any, ...] | None = None
    rule: Callable[[Any], str] | None = None
    # The values of the owner's selector (for sampling: the decoder) under which this option is read; None:
    # under every one. A front end shows and sends it for those alone.
    read_by: tuple[str, ...] | None = None


@dataclass(frozen=True, kw_only=True)
class Option(_Declared):
    """One declared option: its name and type (from the annotation) with the rest of the declaration.

    ``kind`` is bool, int, float, str or tuple (``item`` then says of what: str or int); ``optional``:
    None is a value (unset: the next layer decides). Bounds (``ge``/``gt``/``le``/``lt``) and
    ``choices`` apply to a tuple's items; ``rule(value)`` returns what is wrong with a value ("" for
    nothing), for checks that are neither.
    """

    name: str
    kind: type
    item: type | None = None
    optional: bool = False

    @property
    def base(self) -> type:
        """The type of a value, or of a tuple's items."""
        return self.item if self.item is not None else self.kind

    def noun(self, *, text: bool = False) -> str:
        """How a message names this option's type: ``an integer``, ``a list of strings``, ..."""
        if text and self.kind is bool:
            return "a boolean (1/0, true/false)"
        if self.kind is tuple:
            return "a list of integers" if self.item is int else "a list of strings"
        return _NOUNS[self.kind]

    def bounds(self) -> str:
        """The bounds in words (``>= 1``, ``in (0, 1]``, ``in 1..1024``), or "" when there are none."""
        lo = [(op, b) for op, b in ((">=", self.ge), (">", self.gt)) if b is not None]
        hi = [(op, b) for op, b in (("<=", self.le), ("<", self.lt)) if b is not None]
        if not (lo and hi):
            return " and ".join(f"{op} {self._number(b)}" for op, b in lo + hi)
        (lo_op, lo_b), (hi_op, hi_b) = lo[0], hi[0]
        if self.base is int and lo_op == ">=" and hi_op == "<=":
            return f"in {self._number(lo_b)}..{self._number(hi_b)}"
        left, right = "[" if lo_op == ">=" else "(", "]" if hi_op == "<=" else ")"
        return f"in {left}{self._number(lo_b)}, {self._number(hi_b)}{right}"

    def _number(self, bound: float) -> str:
        return str(int(bound)) if self.base is int else f"{float(bound):g}"

    # -- reading and checking ----------------------------------------------------------------------
    def read(self, raw: Any, *, json: bool = False, text: bool = False) -> Any:
        """``raw`` as this option's value, checked; an :class:`OptionError` naming the option otherwise.

        ``json``: JSON's conventions (see the module docstring); ``text``: ``raw`` is text to parse.
        An empty string is unset for an optional string option (an editor's or a file's empty field).
        """
        value = self._parse(raw) if text else self._convert(raw, json=json)
        if value is not None:
            self.check(value)
        return value

    def check(self, value: Any) -> None:
        """Raise an :class:`OptionError` unless ``value``, as a dataclass field holds it, is one this
        option takes: of its type (or None when optional), within its bounds, choices and rule."""
        if value is None:
            self._unset()
            return
        if not self._holds(value):
            raise self._wrong(value)
        problem = self.problem(value)
        if problem:
            raise OptionError(self.name, problem)

    def problem(self, value: Any) -> str:
        """What is wrong with a value of the right type ("" when nothing is): bounds, choices, rule."""
        for item in value if self.kind is tuple else (value,):
            item = float(item) if self.base is float else item  # 0 and 0.0 read alike: "got 0.0"
            lo_ok = (self.ge is None or item >= self.ge) and (self.gt is None or item > self.gt)
            hi_ok = (self.le is None or item <= self.le) and (self.lt is None or item < self.lt)
            if not (lo_ok and hi_ok):
                return f"must be {self.bounds()}, got {shown(item)}"
            if self.choices is not None and item not in self.choices:
                return f"must be one of {', '.join(map(str, self.choices))}; got {shown(item)}"
        return self.rule(value) if self.rule is not None else ""

    def _unset(self, *, json: bool = False) -> None:
        if not self.optional:
            raise OptionError(self.name, "must not be null" if json else "must be set")

    def _wrong(self, raw: Any, *, json: bool = False, text: bool = False) -> OptionError:
        noun = self.noun(text=text)
        if self.kind is float and isinstance(raw, float) and not math.isfinite(raw):
            noun = "a finite number"
        return OptionError(self.name, f"{'expected' if json else 'must be'} {noun}, got {shown(raw)}")

    def _convert(self, raw: Any, *, json: bool) -> Any:
        if raw is None or (raw == "" and self.optional and self.kind is str):
            self._unset(json=json)
            return None
        if self.kind is tuple:
            if json and self.item is str and isinstance(raw, str):
                raw = [part.strip() for part in raw.split(",") if part.strip()]
        elif json and self.kind is int and isinstance(raw, float) and raw.is_integer():
            raw = int(raw)
        if not self._holds(raw):
            raise self._wrong(raw, json=json)
        return tuple(raw) if self.kind is tuple else float(raw) if self.kind is float else raw

    def _holds(self, value: Any) -> bool:
        """Whether ``value`` is of this option's type (a list or tuple of its items' type for a tuple)."""
        if self.kind is tuple:
            return isinstance(value, list | tuple) and all(self._is(item, self.base) for item in value)
        return self._is(value, self.kind)

    @staticmethod
    def _is(value: Any, kind: type) -> bool:
        if kind is float:
            return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        if kind is int:
            return isinstance(value, int) and not isinstance(value, bool)
        return isinstance(value, kind)

    def _parse(self, raw: str) -> Any:
        text = raw.strip()
        if not text and self.kind is tuple and not self.optional:
            return ()  # an empty list
        if not text:
            self._unset()
            return None
        try:
            if self.kind is tuple:
                return tuple(self._word(part.strip()) for part in text.split(",") if part.strip())
            return self._word(text if self.kind is not str else raw)
        except ValueError:
            raise self._wrong(raw, text=True) from None

    def _word(self, text: str) -> Any:
        if self.base is bool:
            if text.lower() in _TRUE + _FALSE:
                return text.lower() in _TRUE
            raise ValueError(text)
        value = self.base(text)
        if self.base is float and not math.isfinite(value):
            raise ValueError(text)
        return value


def option(
    default: Any,
    *,
    help: str,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
    choices: tuple[Any, ...] | None = None,
    rule: Callable[[Any], str] | None = None,
    read_by: tuple[str, ...] | None = None,
) -> Any:
    """A dataclass field declaring a user-facing option (its type is the field's annotation)."""
    declared = _Declared(
        default=default, help=help, ge=ge, gt=gt, le=le, lt=lt, choices=choices, rule=rule, read_by=read_by
    )
    return dataclasses.field(default=default, metadata={_KEY: declared})


def like(owner: type, name: str, **changes: Any) -> Any:
    """A field declaring ``owner``'s option ``name`` again, with ``changes`` (another ``default``,
    ``help``, narrower bounds, ...): a front end's view of an option declared elsewhere."""
    base = options(owner)[name]
    declared = {f.name: getattr(base, f.name) for f in dataclasses.fields(_Declared)}
    return option(**{**declared, **changes})


@functools.cache
def options(cls: type) -> Mapping[str, Option]:
    """The options a dataclass declares, by name, in declaration order.

    Raises TypeError for a declaration no front end could read (an unsupported annotation) or whose
    default its own checks refuse: a mistake in a declaration fails at import, not in a user's hands.
    """
    hints = typing.get_type_hints(cls)
    out: dict[str, Option] = {}
    for f in dataclasses.fields(cls):
        declared = f.metadata.get(_KEY)
        if declared is None:
            continue
        kind, item, optional = _kind(hints[f.name], f"{cls.__name__}.{f.name}")
        values = {g.name: getattr(declared, g.name) for g in dataclasses.fields(_Declared)}
        opt = Option(name=f.name, kind=kind, item=item, optional=optional, **values)
        try:
            opt.check(opt.default)
        except OptionError as exc:
            raise TypeError(f"{cls.__name__}.{f.name}: the default {exc.problem}") from None
        out[f.name] = opt
    return types.MappingProxyType(out)


def _kind(hint: Any, where: str) -> tuple[type, type | None, bool]:
    """(kind, item, optional) of an annotation: ``int | None`` is (int, None, True)."""
    optional = False
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        optional = len(args) < len(typing.get_args(hint))
        hint = args[0] if len(args) == 1 else hint
    if typing.get_origin(hint) is tuple:
        item, *rest = typing.get_args(hint)
        if rest == [Ellipsis] and item in (int, str):
            return tuple, item, optional
    elif hint in _SCALARS:
        return hint, None, optional
    raise TypeError(f"{where}: an option is a bool, int, float, str or tuple of int or str, not {hint}")


def mirror(cls: type, of: type, *, omit: tuple[str, ...] = ()) -> None:
    """Check that dataclass ``cls`` has one field per option of ``of`` (but ``omit``), in the same order,
    each typed as the option or None: for a typed copy that mypy must see field by field (the client's
    ``SamplingOptions``), called where it is defined, so a copy that falls behind fails at import."""
    want = [name for name in options(of) if name not in omit]
    have = [f.name for f in dataclasses.fields(cls)]
    if have != want:
        raise TypeError(f"{cls.__name__} must have a field per option of {of.__name__}: {want}, not {have}")
    hints = typing.get_type_hints(cls)
    for name in want:
        opt, (kind, item, optional) = options(of)[name], _kind(hints[name], f"{cls.__name__}.{name}")
        if (kind, item) != (opt.kind, opt.item) or not optional:
            raise TypeError(f"{cls.__name__}.{name} must be {opt.base.__name__} or None, as {of.__name__}'s")


def validate(obj: Any, error: Callable[[str, str], Exception] = OptionError) -> None:
    """Check every declared option of a dataclass instance (its ``__post_init__`` calls this), and those
    of a dataclass it holds (a :class:`Flat` view's inner options); the first bad one raises
    ``error(field, problem)``."""
    cls: Any = type(obj)  # a class is hashable, whatever its instances are
    for opt in options(cls).values():
        try:
            opt.check(getattr(obj, opt.name))
        except OptionError as exc:
            raise error(exc.field, exc.problem) from None
    for f in dataclasses.fields(cls):
        inner = getattr(obj, f.name)
        if _KEY not in f.metadata and dataclasses.is_dataclass(inner) and not isinstance(inner, type):
            validate(inner, error)


T = TypeVar("T")


@dataclass(frozen=True)
class Flat:
    """The options of a settings dataclass seen as one flat set: its own, then, under their own names,
    those of its field ``inner`` (a dataclass of options) that it does not declare itself.

    The chat and the editors keep the sampling knobs they give no meaning of their own in a nested
    ``SamplingOptions`` this way, so a knob the runtime gains is a setting of theirs (a key, a row of the
    settings screen) with no change there.
    """

    cls: type
    inner: str

    @functools.cached_property
    def options(self) -> Mapping[str, Option]:
        own = options(self.cls)
        nested = options(typing.get_type_hints(self.cls)[self.inner])
        return types.MappingProxyType({**own, **{n: o for n, o in nested.items() if n not in own}})

    def get(self, obj: Any, name: str) -> Any:
        """The value of the option ``name`` in ``obj``, its own or its inner one."""
        return getattr(obj if name in options(self.cls) else getattr(obj, self.inner), name)

    def values(self, obj: Any) -> dict[str, Any]:
        """Every option's value, by name."""
        return {name: self.get(obj, name) for name in self.options}

    def replace(self, obj: T, changes: Mapping[str, Any]) -> T:
        """``obj`` with ``changes`` (by option name) applied, to its own fields or its inner ones."""
        own = {k: v for k, v in changes.items() if k in options(self.cls) or k == self.inner}
        nested = {k: v for k, v in changes.items() if k not in own}
        unknown = sorted(set(nested) - set(self.options))
        if unknown:
            raise TypeError(f"{self.cls.__name__} has no option {unknown[0]!r}")
        if nested:
            own[self.inner] = dataclasses.replace(own.get(self.inner, getattr(obj, self.inner)), **nested)
        return dataclasses.replace(obj, **own)  # type: ignore[type-var]


def shown(value: Any) -> str:
    """A value as a message shows it: itself when short, else cut (a request may send a megabyte where
    a word belongs; the message should not echo it)."""
    text = repr(value)
    if len(text) < 60:
        return text
    return f"a string of {len(value)} characters" if isinstance(value, str) else text[:50] + "..."
