import sys

from jgpt.cli.main import main

sys.exit(main())
