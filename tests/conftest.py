"""Kernels run on the CPU through the Triton interpreter; it must be on before triton kernels are defined."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
