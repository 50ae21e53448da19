import sys

from jgpt.cli import exit_now
from jgpt.errors import run_guarded
from kvsim.commands import main

exit_now(run_guarded("python -m kvsim", lambda: main("kvsim", sys.argv[1:])))
