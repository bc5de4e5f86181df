"""The user's files as the chat and ``diffu fill`` handle them (``assistant.workspace``): reading them for a
prompt, merging a code block by its definitions, diffs, atomic writes, staleness and undo."""

from __future__ import annotations

import ast
import os
import stat
from pathlib import Path

import pytest

from assistant.workspace.edits import StaleChange, UndoStack, propose, write
from assistant.workspace.files import (
    MAX_FILE_BYTES,
    FileProblem,
    FileRef,
    complete_path,
    context_block,
    mentions,
    parse_ref,
    read_text,
    select_lines,
    with_files,
)
from assistant.workspace.merge import MergeError, forced, merge_code


# -- reading files for a prompt ------------------------------------------------------------------------
def test_every_file_that_cannot_be_sent_is_one_line_naming_it(tmp_path: Path) -> None:
    (tmp_path / "ok.py").write_text("x = 1\r\n")
    assert read_text(tmp_path / "ok.py") == "x = 1\r\n"  # line endings as they are
    (tmp_path / "pkg").mkdir()
    (tmp_path / "blob.bin").write_bytes(b"\x89PNG\r\n\x1a\n\0\0\0")
    (tmp_path / "latin.txt").write_bytes("café".encode("latin-1"))
    with open(tmp_path / "huge.txt", "wb") as f:
        f.truncate(MAX_FILE_BYTES + 1)  # sparse: refused on its size before it is read
    cases = {
        "missing.py": "missing.py: no such file",
        "pkg": "pkg: is a directory (add the files in it by name)",
        "blob.bin": "blob.bin: a binary file, not text",
        "latin.txt": "latin.txt: not UTF-8 text (byte 0xe9 at offset 3)",
        "huge.txt": f"huge.txt: {MAX_FILE_BYTES + 1:,} bytes, beyond the {MAX_FILE_BYTES:,} bytes a file "
        "may have",
    }
    for name, message in cases.items():
        with pytest.raises(FileProblem) as info:
            read_text(tmp_path / name)
        assert str(info.value) == f"{tmp_path}/{message}"


def test_line_ranges(tmp_path: Path) -> None:
    assert parse_ref("a.py") == FileRef("a.py")
    assert parse_ref("a.py:3") == FileRef("a.py", 3, 3)
    assert (
        parse_ref("src/a.py:10-40") == FileRef("src/a.py", 10, 40)
        and str(parse_ref("a.py:2-4")) == "a.py:2-4"
    )
    with pytest.raises(FileProblem, match="FIRST-LAST"):
        parse_ref("a.py:9-2")
    text = "".join(f"line {i}\n" for i in range(1, 31))
    assert select_lines(text, FileRef("a", 2, 3)) == "line 2\nline 3\n"
    assert select_lines(text, FileRef("a", 29, 99)) == "line 29\nline 30\n"  # clamped to the end
    with pytest.raises(FileProblem, match="the file has 30 lines"):
        select_lines(text, FileRef("a.py", 31, 40))


def test_the_prompt_format_names_the_file_then_fences_it() -> None:
    assert context_block("geo.py", "x = 1\n") == "geo.py\n```python\nx = 1\n```"
    assert (
        context_block("geo.py", "x = 1", FileRef("geo.py", 3, 3))
        == "geo.py (lines 3-3)\n```python\nx = 1\n```"
    )
    # A file holding a fence cannot close the block early: the block's fence is longer.
    md = "Example:\n```sh\nls\n```\n"
    assert context_block("README.md", md) == f"README.md\n````markdown\n{md}````"
    assert context_block("run.sh", "ls\n").startswith("run.sh\n```sh\n")
    assert (
        with_files(["a\n```\nx\n```", "b\n```\ny\n```"], "why?") == "a\n```\nx\n```\n\nb\n```\ny\n```\n\nwhy?"
    )
    assert with_files([], "why?") == "why?"


def test_mentions_are_files_not_decorators_or_mail(tmp_path: Path) -> None:
    (tmp_path / "notes").write_text("x")
    prompt = (
        "Compare @geo.py:2-5 with @src/util.py and @notes. Add @property to it, mail me@example.com, "
        "keep `@skip.py` and @app.route('/') as they are; @geo.py again."
    )
    assert mentions(prompt, tmp_path) == ["geo.py:2-5", "src/util.py", "notes", "geo.py"]
    assert mentions("@dataclass\nclass A: ...", tmp_path) == []


def test_path_completion_stays_under_the_working_directory(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "geometry.py").write_text("")
    (tmp_path / "src" / "geo_test.py").write_text("")
    (tmp_path / "setup.py").write_text("")
    (tmp_path / ".hidden").write_text("")
    assert complete_path("s", tmp_path) == ["setup.py", "src/"]
    assert complete_path("src/geo", tmp_path) == ["src/geo_test.py", "src/geometry.py"]
    assert complete_path("", tmp_path) == ["setup.py", "src/"]  # hidden entries only when asked for
    assert complete_path(".h", tmp_path) == [".hidden"]
    assert complete_path("../", tmp_path / "src") == []
    assert complete_path("nope/", tmp_path) == []


# -- merging a block by its definitions ------------------------------------------------------------------
FILE = '''"""Shapes."""

import math


def area(r):
    return 0


class Circle:
    def __init__(self, r):
        self.r = r

    def scale(self, k):
        return self


RATE = 1


def untouched():
    return 1
'''


def test_definitions_replace_their_namesakes_in_place() -> None:
    block = "import math\nimport os\n\ndef area(r):\n    return math.pi * r * r\n\nRATE = 2\n"
    merged = merge_code(FILE, block)
    assert merged.text == FILE.replace("    return 0\n", "    return math.pi * r * r\n").replace(
        "import math\n", "import math\nimport os\n"
    ).replace("RATE = 1", "RATE = 2")
    assert merged.summary() == "replaces area, RATE; adds 1 import"
    ast.parse(merged.text)


def test_a_method_alone_or_in_its_class_replaces_only_that_method() -> None:
    method = "def scale(self, k):\n    return Circle(self.r * k)\n"
    merged = merge_code(FILE, method)
    assert "    def scale(self, k):\n        return Circle(self.r * k)\n" in merged.text
    assert merged.replaced == ["Circle.scale"] and "def __init__" in merged.text
    in_class = (
        "class Circle:\n    # Scaled copies, not in place.\n"
        "    def scale(self, k):\n        return Circle(self.r * k)\n\n"
        "    def grow(self):\n        return self.scale(2)\n"
    )
    merged = merge_code(FILE, in_class)
    assert merged.replaced == ["Circle.scale"] and merged.added == ["Circle.grow"]
    assert "def __init__(self, r)" in merged.text  # the methods the block did not show stay
    assert "    # Scaled copies, not in place.\n    def scale(self, k):\n" in merged.text
    tree = ast.parse(merged.text)
    circle = next(n for n in tree.body if isinstance(n, ast.ClassDef))
    assert [m.name for m in circle.body if isinstance(m, ast.FunctionDef)] == ["__init__", "scale", "grow"]
    # Another header (a base class) replaces the class whole.
    rebased = merge_code(FILE, "class Circle(Shape):\n    pass\n")
    assert "class Circle(Shape):\n    pass\n" in rebased.text and "__init__" not in rebased.text


def test_new_things_go_at_the_end_and_what_the_file_holds_is_not_repeated() -> None:
    block = "import math\n\ndef double(x):\n    return 2 * x\n\nprint(double(2))\n"
    merged = merge_code(FILE, block)
    assert merged.text == FILE + "\n\ndef double(x):\n    return 2 * x\n\n\nprint(double(2))\n"
    assert merged.summary() == "adds double; adds 1 statement at the end"
    assert merge_code(merged.text, block).text == merged.text  # applying it again changes nothing


def test_line_endings_and_new_files() -> None:
    crlf = FILE.replace("\n", "\r\n")
    merged = merge_code(crlf, "def area(r):\n    return r\n")
    assert "\n" not in merged.text.replace("\r\n", "")
    assert merge_code(None, "x = 1").text == "x = 1\n"
    assert merge_code("", "def f():\n    pass\n").added == ["f"]
    # A file with no imports gets its first after its docstring, set apart.
    assert merge_code('"""Doc."""\nx = 1\n', "import os\n").text == '"""Doc."""\n\nimport os\n\nx = 1\n'


def test_a_block_that_does_not_parse_is_refused_unless_forced() -> None:
    with pytest.raises(MergeError, match=r"^the code block does not parse \(line 1: expected ':'\)$"):
        merge_code(FILE, "def area(r)\n    return r\n")
    with pytest.raises(MergeError, match="the file does not parse"):
        merge_code("def broken(:\n", "x = 1\n")
    assert forced(FILE, "def area(r)\n").text == FILE + "\ndef area(r)\n"
    assert forced(None, "oops(").text == "oops(\n"


# -- diffs, writes, staleness, undo ------------------------------------------------------------------------
def test_write_shows_a_diff_keeps_the_mode_and_undo_restores_the_bytes(tmp_path: Path) -> None:
    path = tmp_path / "geo.py"
    original = b"def area(r):\r\n    return 0\r\n"  # CRLF and no trailing text after: bytes exactly
    path.write_bytes(original)
    os.chmod(path, 0o751)
    change = propose(path, "geo.py", "def area(r):\r\n    return r * r\r\n")
    assert change.diff() == (
        "--- a/geo.py\n+++ b/geo.py\n@@ -1,2 +1,2 @@\n def area(r):\r\n-    return 0\r\n+    return r * r\r\n"
    )
    assert change.counts() == (1, 1)
    undo = UndoStack()
    write(change)
    undo.push(change)
    assert path.read_bytes() == b"def area(r):\r\n    return r * r\r\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o751
    assert [p.name for p in tmp_path.iterdir()] == ["geo.py"]  # no temporary file left behind
    undone = undo.undo()
    assert undone.name == "geo.py" and path.read_bytes() == original and len(undo) == 0
    with pytest.raises(FileProblem, match="nothing to undo"):
        undo.undo()


def test_a_file_changed_after_its_diff_was_shown_is_not_written(tmp_path: Path) -> None:
    path = tmp_path / "geo.py"
    path.write_text("x = 1\n")
    change = propose(path, "geo.py", "x = 2\n")
    path.write_text("x = 1  # edited meanwhile\n")
    with pytest.raises(StaleChange, match="geo.py changed on disk since its diff was shown; nothing written"):
        write(change)
    assert path.read_text() == "x = 1  # edited meanwhile\n"


def test_undo_refuses_to_lose_a_later_edit_and_removes_a_file_it_created(tmp_path: Path) -> None:
    new = tmp_path / "new.py"
    undo = UndoStack()
    created = propose(new, "new.py", "x = 1\n")
    assert created.creates and created.diff().startswith("--- /dev/null\n+++ b/new.py\n")
    write(created)
    undo.push(created)
    assert stat.S_IMODE(new.stat().st_mode) == 0o666 & ~_umask()
    new.write_text("x = 1\ny = 2\n")  # the user edits it after diffu wrote it
    with pytest.raises(StaleChange, match="new.py changed since diffu wrote it; /undo --force"):
        undo.undo()
    assert new.exists() and len(undo) == 1
    undo.undo(force=True)
    assert not new.exists()


def test_a_symbolic_link_stays_a_link(tmp_path: Path) -> None:
    target = tmp_path / "real.py"
    target.write_text("x = 1\n")
    link = tmp_path / "link.py"
    link.symlink_to(target)
    write(propose(link, "link.py", "x = 2\n"))
    assert link.is_symlink() and target.read_text() == "x = 2\n"
    with pytest.raises(FileProblem, match="its directory .* does not exist"):
        propose(tmp_path / "no" / "dir.py", "no/dir.py", "")


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask
