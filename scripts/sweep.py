"""Run an experiment preset over attention backends x context lengths in budgeted, resumable pieces: the command
line of `flashgpt.training.sweep`, which says how.

    python scripts/sweep.py long_context_speed --budget-min 8
    python scripts/sweep.py long_context_ppl --attention flash --budget-min 8
"""

import sys

from flashgpt.training.sweep import main

if __name__ == "__main__":
    sys.exit(main())
