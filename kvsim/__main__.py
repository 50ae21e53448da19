import sys

from jgpt.foundation.errors import run_guarded
from kvsim.commands import main

sys.exit(run_guarded("python -m kvsim", lambda: main("kvsim", sys.argv[1:])))
