"""Command-line helpers shared by the scripts and the package's runners."""

import json
import shlex
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def csv_list(cast: Callable[[str], T]) -> Callable[[str], list[T]]:
    """An argparse `type` for comma-separated values: csv_list(int)("1024,2048") == [1024, 2048]."""
    return lambda text: [cast(item) for item in text.split(",") if item]


def command_line(script: str, argv: Sequence[str]) -> str:
    """How the script was invoked, as typed from the repository root: recorded next to what it wrote."""
    return shlex.join(["python", f"scripts/{script}", *argv])


def write_json(path: Path, report: dict) -> None:
    """Write a benchmark's report (rewritten after every row, so a job stopped at its time limit keeps its rows)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1) + "\n")
