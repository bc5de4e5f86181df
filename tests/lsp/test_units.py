"""The language server's pure parts: context windows, post-processing, the cache, settings (the holes'
own tests are in tests/assistant/test_holes.py, beside their module)."""

from __future__ import annotations

import pytest

from assistant.infill import context as ctx
from assistant.infill.context import Mode
from assistant.infill.postprocess import (
    cut_fences,
    cut_special,
    cut_suffix_overlap,
    drop_leading_blank_lines,
    drop_repeated_lines,
    first_line,
    limit_scope,
    postprocess,
)
from assistant.wire import SamplingOptions, prompt_budget
from lsp.cache import SuggestionCache
from lsp.settings import ANSWER_SHAPING, Settings, parse_settings, settings_section
from lsp.suggest import CANDIDATE_TEMPERATURE, Cursor, clean, plan, warm_shapes


# -- context ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("before", "after", "above", "mode"),
    [
        ("    x = ", "", "def f():", Mode.SINGLE_LINE),
        ("    print(", ")", "", Mode.SINGLE_LINE),  # auto-closed bracket: still inside the line
        ("def f(x):", "", "", Mode.BLOCK),
        ("    ", "", "def f(x):", Mode.BLOCK),
        ("    ", "", "    x = 1", Mode.EMPTY_LINE),
        ("", "", "", Mode.EMPTY_LINE),
        ("fn main() {", "", "", Mode.BLOCK),
    ],
)
def test_classify(before: str, after: str, above: str, mode: Mode) -> None:
    assert ctx.classify(before, after, above) is mode


def test_canvas_follows_the_mode() -> None:
    assert ctx.canvas_tokens(Mode.SINGLE_LINE, 64) == 24
    assert ctx.canvas_tokens(Mode.EMPTY_LINE, 64) == 32
    assert ctx.canvas_tokens(Mode.BLOCK, 64) == 64
    assert ctx.canvas_tokens(Mode.SINGLE_LINE, 8) == 8


def test_window_whole_file_when_it_fits() -> None:
    assert ctx.window("abc\n", "def\n", 100, 0.75) == ("abc\n", "def\n", True)


def test_the_prompt_budget_leaves_the_canvas_its_room() -> None:
    """One rule for the suggestions, the warm-up shapes and fill-holes: the prompt fits the model's
    context beside the canvas, with 2 tokens of slack."""
    assert prompt_budget(1024, 32, None) == 1024  # the context is not known before the first answer
    assert prompt_budget(1024, 32, 4096) == 1024
    assert prompt_budget(1024, 64, 512) == 512 - 64 - 2
    assert prompt_budget(1024, 600, 512) < 0  # no prompt fits: callers ask for none or the least
    # The warm-up's shapes: the 64-token block canvas leaves no room in a 40-token context.
    shapes = warm_shapes(Settings(max_tokens=64), max_context=40, recommended=None)
    sizes = [(s.prompt_tokens, s.max_new_tokens) for s in shapes]
    assert list(dict.fromkeys(sizes)) == [(40 - 24 - 2, 24), (40 - 32 - 2, 32)]
    # Per canvas: typing (half the canvas in steps), invoked's greedy answer (every step) and its two
    # sampled candidates, together and (reaching the daemon apart) one by one.
    line = [
        (s.batch, s.sampling and s.sampling.steps, s.sampling and s.sampling.temperature) for s in shapes[:4]
    ]
    assert line == [
        (1, 12, 0.0),
        (1, 24, 0.0),
        (1, 24, CANDIDATE_TEMPERATURE),
        (2, 24, CANDIDATE_TEMPERATURE),
    ]
    few = Settings(max_tokens=64, candidates=1, steps=8)
    assert len(warm_shapes(few, max_context=40, recommended=None)) == 2


def test_window_splits_the_budget_on_line_boundaries() -> None:
    before = "".join(f"line {i}\n" for i in range(100)) + "cur = "
    after = " 1\n" + "".join(f"after {i}\n" for i in range(100))
    pre, suf, whole = ctx.window(before, after, 200, 0.75)
    assert not whole and len(pre) + len(suf) <= 200
    assert before.endswith(pre) and pre.startswith("line ") and pre.endswith("cur = ")
    assert after.startswith(suf) and suf.endswith("\n")
    assert 130 <= len(pre) <= 150  # about 75 % of the budget
    # A short suffix leaves its share to the prefix.
    pre2, suf2, _ = ctx.window(before, " 1\n", 200, 0.5)
    assert suf2 == " 1\n" and len(pre2) > 150


def test_window_keeps_the_cursor_line_whole() -> None:
    before = "x\n" + "y" * 500
    pre, _, _ = ctx.window(before, "", 100, 0.75)
    assert pre == "y" * 500


def test_header_is_a_comment_of_the_language() -> None:
    assert ctx.header_line("src/app.py", "python") == "# src/app.py (python)\n"
    assert ctx.header_line("main.rs", "rust") == "// main.rs (rust)\n"
    assert ctx.header_line("page.html", "html") == "<!-- page.html (html) -->\n"
    assert ctx.header_line("notes.txt", "plaintext") == ""


def test_snippets_pick_related_chunks_of_other_files() -> None:
    helpers = "def parse_price(text):\n    return float(text)\n\n\ndef unrelated():\n    pass\n"
    noise = "alpha = beta\ngamma = delta\n"
    picked = ctx.pick_snippets(
        [("noise.py", noise), ("helpers.py", helpers)], "total = parse_price(text)", 500
    )
    assert [s.name for s in picked] == ["helpers.py"]
    assert ctx.pick_snippets([("helpers.py", helpers)], "total = parse_price(text)", 10) == []


def test_build_prompt_tags_snippets_and_header() -> None:
    prompt = ctx.build_prompt(
        before="from helpers import parse_price\n\nprice = parse_",
        after="\n",
        path="shop/cart.py",
        language="python",
        budget_tokens=400,
        prefix_fraction=0.75,
        chars_per_token=3.0,
        snippet_tokens=100,
        other_documents=[("shop/helpers.py", "def parse_price(text):\n    return float(text)\n")],
    )
    assert prompt.prefix.startswith("<|file_sep|>shop/helpers.py\ndef parse_price(text):")
    assert "<|file_sep|>shop/cart.py\n# shop/cart.py (python)\nfrom helpers" in prompt.prefix
    assert prompt.prefix.endswith("price = parse_") and prompt.suffix == "\n"
    assert prompt.mode is Mode.SINGLE_LINE and prompt.whole_file
    alone = ctx.build_prompt(
        before="x = ",
        after="",
        path="a.py",
        language="python",
        budget_tokens=400,
        prefix_fraction=0.75,
        chars_per_token=3.0,
        snippet_tokens=100,
    )
    assert alone.prefix == "# a.py (python)\nx = " and not alone.snippets


# -- post-processing ----------------------------------------------------------------------------------
def test_special_tokens_end_the_text() -> None:
    assert cut_special("return x<|endoftext|>garbage") == "return x"
    assert cut_special("a<|dlm_pad|><|dlm_pad|>") == "a"
    assert cut_special("plain") == "plain"


def test_first_line() -> None:
    assert first_line("x + 1\nmore") == "x + 1"
    assert first_line("\n    body\nmore") == "\n    body"


def test_suffix_overlap() -> None:
    assert cut_suffix_overlap('"hello")', ")") == '"hello"'  # closes what the text did not open
    assert cut_suffix_overlap("f(x)", ")") == "f(x)"  # its own bracket: keep it
    assert cut_suffix_overlap("x = 1\n    return x", "    return x\n") == "x = 1\n"
    assert cut_suffix_overlap("a\nb\nreturn total", "\n    return total\n") == "a\nb"
    assert cut_suffix_overlap("value", "") == "value"


def test_repeated_lines_end_the_completion() -> None:
    assert drop_repeated_lines("a = 1\nb = 2\nb = 2\nb = 2", "", "x = 0") == "a = 1\nb = 2"
    assert drop_repeated_lines("x = 0\ny = 1", "", "x = 0") == ""  # repeats the line above the cursor
    assert drop_repeated_lines("1\n    total = 1", "    total = ", "") == "1"


def test_scope_by_indentation() -> None:
    body = "\n    return x\n\ndef g():\n    pass"
    assert limit_scope(body, "def f(x):", "", Mode.BLOCK) == "\n    return x\n"
    assert (
        limit_scope("y = 2\n    z = 3\nprint(z)", "    ", "    x = 1", Mode.EMPTY_LINE) == "y = 2\n    z = 3"
    )


def test_pipeline() -> None:
    kw = {
        "suffix": "\n    return result\n",
        "cursor_line": "        result = ",
        "line_above": "    for x in items:",
    }
    assert (
        postprocess("result + x\n    return result", mode=Mode.SINGLE_LINE, min_chars=4, **kw) == "result + x"
    )
    assert postprocess("x<|endoftext|>", mode=Mode.SINGLE_LINE, min_chars=4, **kw) is None  # too short
    assert postprocess("   \n", mode=Mode.SINGLE_LINE, min_chars=1, **kw) is None
    assert postprocess("\nnext line", mode=Mode.SINGLE_LINE, min_chars=1, **kw) is None


def test_leading_blank_lines_on_a_blank_cursor_line() -> None:
    """#34 G: Tab on an empty line inserted the blank lines a block suggestion started with."""
    assert drop_leading_blank_lines("\n  \n    return x\n", "    ") == "    return x\n"
    assert drop_leading_blank_lines("\n    return x", "def f(x):") == "\n    return x"  # starts the body
    assert drop_leading_blank_lines(" \n\t\n", "") == ""


def test_after_an_opener_on_the_cursor_line_the_body_starts_on_the_next_line() -> None:
    """#44 G: after ``class Mode(Enum):`` a suggestion starting with a blank line inserted one."""
    assert drop_leading_blank_lines("\n\n    RED = 1", "class Mode(Enum):") == "\n    RED = 1"
    assert drop_leading_blank_lines(" \n  \n    RED = 1", "class Mode(Enum):") == "\n    RED = 1"
    assert drop_leading_blank_lines("1\n\nx = 2", "y = ") == "1\n\nx = 2"  # the code's own blank line
    model_text = "\n\n    RED = 1\n    GREEN = 2\n"
    cursor = Cursor("a.py", "python", "from enum import Enum\n\nclass Mode(Enum):", "\n", invoked=False)
    p = plan(cursor, Settings())
    assert p.mode is Mode.BLOCK
    assert clean(model_text, p, "\n", 1) == "\n    RED = 1\n    GREEN = 2"


FENCED = [
    # (model text, cursor line, what is offered): a leading fence dropped, the text cut at the next one
    ("```python\n    y = x + 1\n```\nSome prose.", "    ", "y = x + 1"),
    ("\n```python\n    y = x + 1\n    return y\n```", "    ", "y = x + 1\n    return y"),
    ("```\n", "    ", None),  # a bare fence: nothing left
    ("```python", "    ", None),
    ("    y = x + 1\n```\n", "    ", "y = x + 1"),  # a closing fence after code
    ("\n```python\n    RED = 1\n```", "class Mode(Enum):", "\n    RED = 1"),  # a block body
    ("1\n```", "    y = ", "1"),
]


@pytest.mark.parametrize(("text", "cursor_line", "offered"), FENCED)
def test_markdown_fences_are_never_offered_as_code(text: str, cursor_line: str, offered: str | None) -> None:
    """#44 N2: a model that has seen chat answers writes ```python on empty lines; the code between the
    fences is kept, a fence line never."""
    cursor = Cursor("a.py", "python", "def f(x):\n" + cursor_line, "\n", invoked=False)
    out = clean(text, plan(cursor, Settings()), "\n", 1)
    assert out == offered
    assert out is None or not any(line.lstrip().startswith("```") for line in out.split("\n"))
    assert cut_fences("x = '```'", "") == "x = '```'"  # backticks inside a line are code


@pytest.mark.parametrize("line_above", ["    if x:", "    y = 1"])  # a block body, an empty line
def test_a_suggestion_on_an_empty_line_starts_with_code(line_above: str) -> None:
    before = f"def f(x):\n{line_above}\n        "
    cursor = Cursor("a.py", "python", before, "\n    return x\n", invoked=False)
    p = plan(cursor, Settings())
    assert p.mode in (Mode.BLOCK, Mode.EMPTY_LINE)
    model_text = "\n\n        y = x + 1\n        z = y"
    assert clean(model_text, p, "\n    return x\n", 1) == "y = x + 1\n        z = y"


# -- cache --------------------------------------------------------------------------------------------
def test_cache_exact_and_forwarding() -> None:
    cache = SuggestionCache(capacity=2)
    cache.put("def f():\n    return ", "\n", "fp", "x + 1")
    assert cache.get("def f():\n    return ", "\n", "fp") == "x + 1"
    assert cache.get("def f():\n    return ", "\n", "other settings") is None
    assert cache.get("def f():\n    return x ", "\n", "fp") == "+ 1"  # typed "x "
    assert cache.get("def f():\n    return y", "\n", "fp") is None  # typed something else
    assert cache.get("def f():\n    return ", "\nmore", "fp") is None  # the code after changed
    assert (cache.hits, cache.forward_hits) == (1, 1)
    cache.put("a", "", "fp", "1")
    cache.put("b", "", "fp", "2")
    assert cache.get("def f():\n    return ", "\n", "fp") is None  # evicted: capacity 2


def test_cache_forwarding_with_long_prefixes() -> None:
    before = "x" * 10_000
    cache = SuggestionCache()
    cache.put(before, "", "fp", "abcdef")
    assert cache.get(before + "abc", "", "fp") == "def"


# -- settings -----------------------------------------------------------------------------------------
def test_settings_parse_and_report() -> None:
    s, problems = parse_settings({"diffu": {"debounceMs": 50, "languages": ["python"], "maxTokens": 2000}})
    assert s.debounce_ms == 50 and s.languages == ("python",) and s.max_tokens == Settings().max_tokens
    assert problems == ["maxTokens: must be in 1..1024, got 2000; keeping 64"]
    s, problems = parse_settings({"enable": "yes", "nope": 1, "daemonUrl": "http://127.0.0.1:1"}, s)
    assert s.enable is True and s.url == "http://127.0.0.1:1" and s.debounce_ms == 50
    assert problems[0].startswith("enable: expected true or false") and problems[1].startswith(
        "nope: unknown"
    )
    assert parse_settings({"url": "localhost:8012"})[1] == [
        "url: must start with http:// or https://, got 'localhost:8012'; keeping None"
    ]
    assert parse_settings("nonsense")[1] == ["settings: expected an object, got str"]


def test_one_fingerprint_for_the_settings_that_shape_an_answer() -> None:
    """The cache's key and the server's clear-on-change read the same settings (they used to disagree:
    4 fields against 10), so an answer still in flight when min_chars changes is not reused after."""
    base = Settings()
    changed = {
        "max_tokens": 32,
        "steps": 8,
        "temperature": 0.5,
        "context_tokens": 512,
        "prefix_fraction": 0.5,
        "snippet_tokens": 0,
        "current_file_only": True,
        "min_chars": 3,
        "url": "http://127.0.0.1:1",
        "model": "fake:",
        "sampling": SamplingOptions(decoder="fast"),
    }
    assert set(changed) == set(ANSWER_SHAPING)
    for name, value in changed.items():
        assert base.replace(**{name: value}).fingerprint() != base.fingerprint(), name
    # Whether, when and how often to ask shapes no answer: cached suggestions survive it.
    assert base.replace(debounce_ms=0, candidates=5, max_line_suffix=0).fingerprint() == base.fingerprint()
    cache = SuggestionCache()
    cache.put("x = ", "\n", base.fingerprint(), "1")
    assert cache.get("x = ", "\n", base.fingerprint()) == "1"
    assert cache.get("x = ", "\n", base.replace(min_chars=3).fingerprint()) is None


def test_client_only_settings_are_ignored() -> None:
    """Finding 3: VS Code sends its own keys in the same section; they are not the server's to judge."""
    s, problems = parse_settings({"diffu": {"serverCommand": ["diffu", "lsp"], "trace": {"server": "off"}}})
    assert problems == [] and s == Settings()


def test_settings_section() -> None:
    assert settings_section({"diffu": {"enable": False}}) == {"enable": False}
    assert settings_section({"enable": False}) == {"enable": False}
    assert settings_section({"python": {}}) is None
    assert settings_section(None) is None


# -- daemon link --------------------------------------------------------------------------------------
def test_overflow_facts() -> None:
    """The prompt size and the context come from the error's details, never from its English message."""
    from assistant.client import APIError
    from lsp.daemon_link import is_overflow, overflow_facts

    details = {"prompt_tokens": 900, "max_new_tokens": 64, "context_length": 512}
    exc = APIError(400, "words for people", param="prompt", code="context_length_exceeded", details=details)
    assert is_overflow(exc) and overflow_facts(exc) == (900, 512)
    canvas_too_big = APIError(
        400, "...", param="max_tokens", code="context_length_exceeded", details={"context_length": 512}
    )
    assert not is_overflow(canvas_too_big)  # a smaller prompt would not help
    assert not is_overflow(APIError(400, "the prompt (900 tokens) ...", param="prompt"))
