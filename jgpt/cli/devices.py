"""`jgpt devices`: the backend and devices JAX sees (check an accelerator install with it)."""

from __future__ import annotations

import argparse
import json

from jgpt.runtime.devices import describe


def main(command: str, argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog=f"jgpt {command}", description="Print the JAX backend and every device it sees."
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    devices = describe()
    print(json.dumps(devices.to_json(), indent=1) if args.json else devices.table())
    return 0
