"""Another copy of the kernel package (`kernels/` at an earlier commit, or a variant) imported beside the installed
one, for same-process A/B timing: scripts/ab_kernels.py and the A/B scripts kept under results/tuning/."""

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def load_launch(directory: str | Path, name: str) -> ModuleType:
    """The `launch` module of the kernel package in `directory`, imported as package `name` (its modules' relative
    imports resolve inside that copy; its __init__ is not run)."""
    package = ModuleType(name)
    package.__path__ = [str(directory)]
    sys.modules[name] = package
    spec = importlib.util.spec_from_file_location(f"{name}.launch", Path(directory) / "launch.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
