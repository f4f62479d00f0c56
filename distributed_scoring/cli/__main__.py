"""`python -m distributed_scoring.cli ...`: the `dscore` command without its console script (tests and
benchmarks run it so in a fresh interpreter)."""

from ..console import run

if __name__ == "__main__":  # importing the module (the torch-import test walks every module) runs nothing
    run()
