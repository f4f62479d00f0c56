"""`python -m distributed_scoring.cli ...`: the `dscore` command without its console script (tests and
benchmarks run it so in a fresh interpreter)."""

import sys

from . import main

sys.exit(main())
