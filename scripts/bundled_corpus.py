"""Build the bundled demo model's training corpus: Python source under permissive licences.

    python scripts/bundled_corpus.py OUT_DIR [--wheels CACHE_DIR]

OUT_DIR/stdlib/ gets the ``.py`` files of this interpreter's standard library; OUT_DIR/pypi/NAME/ gets the
``.py`` files of the pinned wheels below, fetched with ``pip download`` (PyPI or your index) into the
wheel cache. Every wheel is a pure-Python ``py3-none-any`` build, so the corpus is the same on any
machine; the script writes OUT_DIR/manifest.json with each package's version, licence, file count and
bytes. ``diffu train OUT_DIR`` then applies its own filters (test directories, files over 300 kB).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

# (distribution, version, licence): permissively licensed, idiomatic, mostly pure-Python code bases.
PACKAGES = (
    ("Django", "5.2.8", "BSD-3-Clause"),
    ("sympy", "1.14.0", "BSD-3-Clause"),
    ("networkx", "3.5", "BSD-3-Clause"),
    ("Pygments", "2.19.2", "BSD-2-Clause"),
    ("setuptools", "80.9.0", "MIT"),
    ("pip", "25.3", "MIT"),
    ("requests", "2.32.5", "Apache-2.0"),
    ("urllib3", "2.5.0", "MIT"),
    ("Flask", "3.1.2", "BSD-3-Clause"),
    ("Werkzeug", "3.1.3", "BSD-3-Clause"),
    ("Jinja2", "3.1.6", "BSD-3-Clause"),
    ("click", "8.3.0", "BSD-3-Clause"),
    ("attrs", "25.4.0", "MIT"),
    ("rich", "14.2.0", "MIT"),
    ("textual", "6.5.0", "MIT"),
    ("pytest", "8.4.2", "MIT"),
    ("docutils", "0.22.2", "BSD-2-Clause / public domain"),
    ("Sphinx", "8.2.3", "BSD-2-Clause"),
    ("Twisted", "25.5.0", "MIT"),
    ("SQLAlchemy", "2.0.44", "MIT"),
    ("jax", "0.8.0", "Apache-2.0"),
    ("flax", "0.12.0", "Apache-2.0"),
    ("optax", "0.2.6", "Apache-2.0"),
    ("huggingface_hub", "0.36.0", "Apache-2.0"),
    ("pydantic", "2.12.3", "MIT"),
    ("fonttools", "4.60.1", "MIT"),
    ("ipython", "9.6.0", "BSD-3-Clause"),
    ("prompt_toolkit", "3.0.52", "BSD-3-Clause"),
    ("black", "25.9.0", "MIT"),
    ("markdown-it-py", "4.0.0", "MIT"),
    ("sqlparse", "0.5.3", "BSD-3-Clause"),
)


def copy_py(src_root: Path, dest: Path, names: list[str] | None = None) -> tuple[int, int]:
    files, size = 0, 0
    for path in sorted(src_root.rglob("*.py")):
        rel = path.relative_to(src_root)
        if "site-packages" in rel.parts or "__pycache__" in rel.parts:
            continue
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
        files, size = files + 1, size + path.stat().st_size
    return files, size


def extract_py(wheel: Path, dest: Path) -> tuple[int, int]:
    files, size = 0, 0
    with zipfile.ZipFile(wheel) as zf:
        for info in sorted(zf.infolist(), key=lambda i: i.filename):
            if not info.filename.endswith(".py") or ".data/" in info.filename:
                continue
            target = dest / info.filename
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(zf.read(info))
            files, size = files + 1, size + info.file_size
    return files, size


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("out", type=Path)
    parser.add_argument("--wheels", type=Path, default=Path("/tmp/diffu-corpus-wheels"))
    args = parser.parse_args()
    out: Path = args.out
    if out.exists():
        shutil.rmtree(out)
    (out / "pypi").mkdir(parents=True)
    args.wheels.mkdir(parents=True, exist_ok=True)

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files, stdlib_size = copy_py(stdlib, out / "stdlib")
    stdlib_entry = {
        "python": sys.version.split()[0],
        "licence": "PSF-2.0",
        "files": files,
        "bytes": stdlib_size,
    }
    packages: dict[str, dict[str, str | int]] = {}
    total = stdlib_size
    for name, version, licence in PACKAGES:
        spec = f"{name}=={version}"
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
             "--platform", "any", "--python-version", "3.11", "--implementation", "py",
             "-d", str(args.wheels), spec],
            check=True,
        )  # fmt: skip
        norm = name.lower().replace("-", "_")
        wheel = next(
            w for w in sorted(args.wheels.glob("*.whl"))
            if w.name.lower().startswith(f"{norm}-{version}-")
        )  # fmt: skip
        files, size = extract_py(wheel, out / "pypi" / norm)
        packages[name] = {"version": version, "licence": licence, "files": files, "bytes": size}
        total += size
        print(f"{spec:32} {files:6d} files {size / 1e6:8.2f} MB", file=sys.stderr)
    manifest = {"stdlib": stdlib_entry, "packages": packages, "total_bytes": total}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"corpus in {out}: {total / 1e6:.1f} MB of Python before diffu train's filters", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
