import sys

from jgpt.cli import main

sys.exit(main())
