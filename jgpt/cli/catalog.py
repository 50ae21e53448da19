"""`jgpt catalog`: list the ModelCatalog, or add an artifact to it."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from jgpt.artifacts.catalog import DEFAULT_CATALOG, DEFAULT_ROLE, add_model, describe, read_catalog, write_catalog
from jgpt.foundation.command_line import ArgumentParser
from jgpt.foundation.errors import ApiError, one_line

EXAMPLES = """\
examples:
  jgpt catalog                                  list the models of checkpoints/catalog.json
  jgpt catalog --json                           the catalog as JSON
  jgpt catalog add checkpoints/tiny --id tiny --label "tiny GPT" --role default
                                                verify an artifact and list it (as the default model)
"""


def parser(prog: str) -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog=prog,
        epilog=EXAMPLES,
        description="List the models a checkout knows about, or add a verified artifact to the catalog.",
    )
    p.add_argument("--catalog", type=Path, default=DEFAULT_CATALOG, metavar="FILE", help="catalog file")
    p.add_argument("--json", action="store_true", help="print the catalog as JSON")
    sub = p.add_subparsers(dest="action")
    add = sub.add_parser("add", help="add an artifact directory under the catalog's storage")
    add.add_argument("artifact", type=Path, metavar="ARTIFACT_DIR", help="a jgpt artifact directory (manifest.json)")
    add.add_argument("--id", required=True, help="model id")
    add.add_argument("--label", required=True, help="one-line human label")
    add.add_argument("--role", metavar="ROLE", help=f'"{DEFAULT_ROLE}" marks the model used when none is named')
    add.add_argument("--inspection", metavar="TEXT", help="the text offered for inspecting this model")
    add.add_argument("--stop-ids", type=int, nargs="*", default=[], metavar="ID", help="ids that end generation")
    return p


def _table(catalog) -> str:
    if not catalog.models:
        return f"{catalog.path}: no models (storage {catalog.base_url})"
    rows = [("id", "role", "parameters", "architecture", "checkpoint_sha256", "label")]
    for m in catalog.models:
        a = m.architecture
        shape = (
            f"{a.get('position')}/{a.get('normalization')} L{a.get('layers')} C{a.get('width')} V{a.get('vocabulary')}"
        )
        rows.append((m.id, m.role or "", f"{m.parameters:,}", shape, m.weights["sha256"][:12], m.label))
    shown = [[one_line(cell) for cell in row] for row in rows]  # a crafted label must not send escapes to the terminal
    widths = [max(len(r[i]) for r in shown) for i in range(len(shown[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in shown]
    return "\n".join([one_line(f"{catalog.path} (storage {catalog.base_url})"), *lines])


def _check_addition(args: argparse.Namespace) -> None:
    """What `catalog add` can refuse before loading the artifact (the ModelDescriptor checks it all again)."""
    if not args.id.strip():
        raise ApiError("--id", "must be a non-empty model id")
    if args.role not in (None, DEFAULT_ROLE):
        raise ApiError("--role", f"must be {DEFAULT_ROLE!r} or absent, got {args.role!r}")
    if any(stop_id < 0 for stop_id in args.stop_ids):
        raise ApiError("--stop-ids", f"token ids are >= 0, got {min(args.stop_ids)}")


def main(command: str, argv: list[str]) -> int:
    args = parser(f"jgpt {command}").parse_args(argv)
    catalog = read_catalog(args.catalog)
    if args.action == "add":
        from jgpt.artifacts.artifact import load_artifact

        _check_addition(args)
        artifact = load_artifact(args.artifact)
        for stop_id in args.stop_ids:
            if stop_id >= artifact.architecture.vocabulary:
                raise ApiError(
                    "--stop-ids",
                    f"{stop_id} is not a token id of this model (0..{artifact.architecture.vocabulary - 1})",
                )
        model = describe(
            artifact,
            catalog,
            model_id=args.id,
            label=args.label,
            role=args.role,
            inspection=args.inspection,
            stop_ids=tuple(args.stop_ids),
        )
        catalog = add_model(catalog, model)
        write_catalog(catalog)
    print(json.dumps(catalog.to_json(), indent=2) if args.json else _table(catalog))
    return 0
