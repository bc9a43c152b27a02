"""flashgpt: GPT-2 training with a fused FlashAttention kernel in Triton.

The subpackages are the repository's top-level folders: `flashgpt.kernels` (kernels/), `flashgpt.model`,
`flashgpt.data` and `flashgpt.training`. Installed, they live under this one name and claim no generic top-level
import names (`kernels` is also Hugging Face's kernel-hub package). Run from a checkout that is not installed
(e.g. `PYTHONPATH=. python scripts/bench_attention.py`), the repository root is searched for them too.
"""

from pathlib import Path

_checkout = Path(__file__).resolve().parent.parent
if (_checkout / "pyproject.toml").is_file() and (_checkout / "kernels" / "__init__.py").is_file():
    __path__.append(str(_checkout))
