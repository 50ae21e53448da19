"""`python -m experiments lab|report|demo ...`: `jgpt lab`, `jgpt report`, and the end-to-end demo."""

import sys

from experiments.commands import demo, lab
from jgpt.foundation.errors import run_guarded

COMMANDS = {"lab": lab.main, "report": lab.main, "demo": demo.main}

if len(sys.argv) < 2 or sys.argv[1] not in COMMANDS:
    print(f"usage: python -m experiments {{{','.join(COMMANDS)}}} ...", file=sys.stderr)
    sys.exit(2)
sys.exit(run_guarded(f"experiments {sys.argv[1]}", lambda: COMMANDS[sys.argv[1]](sys.argv[1], sys.argv[2:])))
