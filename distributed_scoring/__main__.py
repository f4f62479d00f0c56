"""`python -m distributed_scoring ...`: the `dscore` command without its console script, its signals handled
from the start as the script's are (`python -m distributed_scoring.cli` imports the CLI first)."""

from .console import run

if __name__ == "__main__":  # importing the module (the torch-import test walks every module) runs nothing
    run()
