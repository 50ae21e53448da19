"""`python -m inference generate|record ...`: the inference commands without the umbrella `jgpt`."""

import sys

from inference.commands import SUMMARIES, main
from jgpt.foundation.errors import run_guarded

if __name__ == "__main__":
    args = sys.argv[1:]
    if not args or args[0] not in SUMMARIES:
        print(f"usage: python -m inference {{{','.join(SUMMARIES)}}} [ARGS...]", file=sys.stderr)
        sys.exit(0 if args and args[0] in ("-h", "--help") else 2)
    sys.exit(run_guarded(f"python -m inference {args[0]}", lambda: main(args[0], args[1:])))
