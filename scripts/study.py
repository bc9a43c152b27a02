"""Run a context study (configs/study/<name>.yaml) in pieces, evaluate its models, and ship its data and results:
the command line of `flashgpt.training.study`, which says how.

    python scripts/study.py pack-data context            # CPU machine: tokenize, write .cache/ship/<shards>.tar.xz
    python scripts/study.py run context --budget-min 9 --export $OUT/context-raw.tar.gz   # GPU; repeat until done
    python scripts/study.py import context-raw.tar.gz     # CPU machine: into results/context/raw/
    python scripts/study_report.py results/context        # report.md and plots from raw/, no GPU
"""

import sys

from flashgpt.training.study import main

if __name__ == "__main__":
    sys.exit(main())
