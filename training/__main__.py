"""`python -m training train|eval ...`: the same commands as `jgpt train` and `jgpt eval`."""

import sys

from training.commands import module_main

sys.exit(module_main())
