"""`python -m experiments lab ...` and `python -m experiments report ...`: the same commands as `jgpt lab` and `jgpt report`."""

import sys

from experiments.cli import main
from jgpt.errors import run_guarded

COMMANDS = ("lab", "report")

if len(sys.argv) < 2 or sys.argv[1] not in COMMANDS:
    print(f"usage: python -m experiments {{{','.join(COMMANDS)}}} ...", file=sys.stderr)
    sys.exit(2)
sys.exit(run_guarded(f"experiments {sys.argv[1]}", lambda: main(sys.argv[1], sys.argv[2:])))
