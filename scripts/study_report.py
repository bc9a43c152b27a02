"""Build results/<study>/report.md and its plots from a study's raw files alone (no GPU, no torch): the command line
of `flashgpt.training.study_report`.

    python scripts/study_report.py results/context
"""

import sys

from flashgpt.training.study_report import main

if __name__ == "__main__":
    sys.exit(main())
