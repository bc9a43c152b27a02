"""Python source trees as documents, one `.py` file a document: long files, where a long context helps most (a
name is often defined thousands of tokens before it is used). Files are only read as text; nothing from them runs.

- `python_stdlib`: CPython's standard library and test suite, from Debian's packages of CPython 3.11
  (`libpython3.11-minimal`, `libpython3.11-stdlib`, `libpython3.11-testsuite`; Python Software Foundation License),
  fetched with `apt-get download`. Version 3.11.2-6+deb12u8 holds 1,515 files under `usr/lib/python3.11/`; 4 are
  deliberately not UTF-8, 25 empty and 16 repeats (all skipped): 1,472 documents, 14.1M GPT-2 tokens, 245 of 16K
  tokens or more, 8.3M of the tokens in `test/`. Debian replaces point releases on its mirrors, so instead of
  pinning one the files are checked by their structure, and meta.json records each package's version and sha256.
- `sympy`: the `sympy/` package of the PyPI sdist `sympy==1.13.3` (BSD-3-Clause), pinned by sha256: 1,517 files,
  80 of them empty: 1,437 documents, 12.5M GPT-2 tokens, 200 of 16K tokens or more.

The unit of the train/val split (the document's `work`) is the package: the modules of `asyncio/` are one work,
the files of `test/test_asyncio/` another, a top-level module (`os.py`) or test file (`test/test_os.py`) its own;
in sympy, a package with its `tests/` and `benchmarks/` (`sympy/polys/` and `sympy/polys/tests/` are one work). The
modules of one package, which share their names and idioms, never sit on both sides of the split.
"""

import shutil
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

from flashgpt.data.fetch import apt_debs, pypi_sdist, sha256_of

STDLIB_PACKAGES = ("libpython3.11-minimal", "libpython3.11-stdlib", "libpython3.11-testsuite")
LIBRARY_ROOT = PurePosixPath("usr/lib/python3.11")
# Files any CPython 3.11 build of these packages holds, one from each; a changed layout fails here, not later.
EXPECTED_FILES = ("os.py", "asyncio/base_events.py", "test/test_typing.py")
MIN_FILES = 1400


def stdlib_debs(download_dir: Path) -> dict[str, Path]:
    """The .deb file of each of STDLIB_PACKAGES (package name -> path), fetched with `apt-get download` if absent."""
    how_to = (
        f"On a Debian 12 machine run `apt-get download {' '.join(STDLIB_PACKAGES)}` and copy the .deb files "
        f"to {download_dir}."
    )
    return apt_debs(download_dir, STDLIB_PACKAGES, "data=python_stdlib", how_to)


def stdlib_sources(debs: dict[str, Path]) -> tuple[dict[str, str], int]:
    """Path under the library root -> text of every `.py` file of the packages, sorted by path; and how many
    files were skipped as not UTF-8 (some test inputs are Latin-1 or invalid on purpose)."""
    if shutil.which("dpkg-deb") is None:
        raise FileNotFoundError("reading the CPython .deb files needs dpkg-deb (apt-get install dpkg)")
    texts: dict[str, str] = {}
    n_not_utf8 = 0
    for deb in debs.values():
        for path, raw in _python_files(deb):
            try:
                texts[path] = raw.decode("utf-8").replace("\r\n", "\n")
            except UnicodeDecodeError:
                n_not_utf8 += 1
    missing = [name for name in EXPECTED_FILES if name not in texts]
    if len(texts) < MIN_FILES or missing:
        raise ValueError(
            f"the CPython packages {[deb.name for deb in debs.values()]} hold {len(texts)} UTF-8 .py files under "
            f"{LIBRARY_ROOT} (expected at least {MIN_FILES}), missing {missing}; is this Debian's python3.11?"
        )
    return dict(sorted(texts.items())), n_not_utf8


def _python_files(deb: Path) -> Iterator[tuple[str, bytes]]:
    """(path relative to the library root, bytes) of each regular `.py` file in a .deb's data archive."""
    with (
        subprocess.Popen(["dpkg-deb", "--fsys-tarfile", str(deb)], stdout=subprocess.PIPE) as proc,
        tarfile.open(fileobj=proc.stdout, mode="r|") as archive,  # a stream: members in archive order
    ):
        for member in archive:
            path = PurePosixPath(member.name.removeprefix("./"))
            if member.isfile() and path.suffix == ".py" and path.is_relative_to(LIBRARY_ROOT):
                yield str(path.relative_to(LIBRARY_ROOT)), archive.extractfile(member).read()
    if proc.returncode != 0:
        raise ValueError(f"dpkg-deb could not read {deb} (exit {proc.returncode}); delete it and run again")


def stdlib_package_of(path: str) -> str:
    """The split unit of a library file: its package, or for the test suite its test package or file."""
    parts = PurePosixPath(path).parts
    stem = PurePosixPath(path).stem
    if parts[0] == "test":
        return f"test/{parts[1] if len(parts) > 2 else stem}"
    return parts[0] if len(parts) > 1 else stem


def stdlib_provenance(debs: dict[str, Path], n_not_utf8: int) -> dict[str, Any]:
    return {
        "python_stdlib": {deb.name: f"sha256 {sha256_of(deb)}" for deb in debs.values()},
        "python_stdlib_skipped_not_utf8": n_not_utf8,
    }


# --- sympy: a PyPI sdist ---

SYMPY_REQUIREMENT = "sympy==1.13.3"
SYMPY_SDIST = "sympy-1.13.3.tar.gz"
SYMPY_SDIST_SHA256 = "b27fd2c6530e0ab39e275fc9b683895367e51d5da91baa8d3d64db2565fec4d9"
SYMPY_ROOT = PurePosixPath("sympy-1.13.3")
SYMPY_FILES = 1517  # .py files under sympy-1.13.3/sympy/, all UTF-8


def sympy_sources(download_dir: Path) -> tuple[dict[str, str], dict[str, Any]]:
    """Path under the sdist root (sympy/...) -> text of every `.py` file of the `sympy` package; and provenance."""
    sdist = pypi_sdist(download_dir, SYMPY_REQUIREMENT, SYMPY_SDIST, SYMPY_SDIST_SHA256)
    texts = {}
    with tarfile.open(sdist) as archive:
        for member in archive:
            path = PurePosixPath(member.name)
            if member.isfile() and path.suffix == ".py" and path.is_relative_to(SYMPY_ROOT / "sympy"):
                texts[str(path.relative_to(SYMPY_ROOT))] = archive.extractfile(member).read().decode("utf-8")
    if len(texts) != SYMPY_FILES:
        raise ValueError(f"{sdist} holds {len(texts)} .py files under sympy/, expected {SYMPY_FILES}")
    return dict(sorted(texts.items())), {"sympy": f"PyPI sdist {SYMPY_SDIST}, sha256 {SYMPY_SDIST_SHA256}"}


def sympy_package_of(path: str) -> str:
    """The split unit of a sympy file: the package it belongs to, its tests/ and benchmarks/ folded into it."""
    folders = list(PurePosixPath(path).parent.parts)
    while folders[-1] in ("tests", "benchmarks"):
        folders.pop()
    return "/".join(folders)
