"""`python -m training train|eval ...`: the same commands as `jgpt train` and `jgpt eval`."""

from jgpt.cli import exit_now
from training.commands import module_main

exit_now(module_main())
