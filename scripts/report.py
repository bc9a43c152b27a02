"""Turn training runs and kernel benchmarks into results/<name>/ (report.md, plots, raw/): the command line of
`flashgpt.training.run_report`, whose docstring lists the uses.

    python scripts/report.py --from-raw results/long_context
"""

import sys

from flashgpt.training.run_report import main

if __name__ == "__main__":
    sys.exit(main())
