"""The two ways a run can end early that are results rather than bugs: out of memory, and a diverged loss."""

import re

_OOM_REQUEST = re.compile(r"Tried to allocate ([\d.]+) (bytes|KiB|MiB|GiB|TiB)")
_BYTES_PER_UNIT = {"bytes": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}


class NonFiniteLossError(RuntimeError):
    """The loss or the gradient norm of a step is nan or inf; raised before the optimizer applies it."""

    def __init__(self, what: str, value: float, step: int) -> None:
        super().__init__(f"{what} became {value} at step {step}")


def oom_request_gib(message: str) -> float | None:
    """The allocation that failed, in GiB, from a torch.cuda.OutOfMemoryError message ("Tried to allocate 2.50
    GiB. GPU 0 has ..."); None when the message does not say."""
    match = _OOM_REQUEST.search(message)
    if match is None:
        return None
    return float(match.group(1)) * _BYTES_PER_UNIT[match.group(2)] / 2**30
