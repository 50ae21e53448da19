"""`jgpt train` and `jgpt eval` (also `python -m training train|eval`)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from jgpt.errors import ApiError
from jgpt.output_paths import output_directory

# Command-line flag -> TrainingConfig field, for the fields a user commonly overrides.
OVERRIDES = {
    "data": str, "out": str, "tokenizer": str, "vocab_size": int, "seed": int, "steps": int,
    "batch_size": int, "learning_rate": float, "warmup_steps": int, "context": int, "selection": str,
    "log_every": int, "eval_every": int, "checkpoint_every": int, "train_conversations": int,
}  # fmt: skip
ARCHITECTURE_OVERRIDES = ("layers", "heads", "width", "ffn")


class _Parser(argparse.ArgumentParser):
    """Usage errors become ApiError, so every bad input leaves the same way."""

    def error(self, message: str):
        raise ApiError("arguments", message)


def _train_parser(prog: str) -> argparse.ArgumentParser:
    parser = _Parser(prog=prog, description="Train a model; writes checkpoints, metrics.jsonl, loss.png and model/ under --out.")
    parser.add_argument("--config", help="JSON file of TrainingConfig fields (unknown keys are an error)")
    parser.add_argument("--resume", action="store_true", help="continue from the latest checkpoint under --out")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    for name, kind in OVERRIDES.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=kind, dest=name)
    for name in ARCHITECTURE_OVERRIDES:
        parser.add_argument(f"--{name}", type=int, help=f"architecture {name}")
    return parser


def train_command(prog: str, argv: list[str]) -> int:
    from training.config import TrainingConfig, from_json, load

    args = _train_parser(prog).parse_args(argv)
    base = load(args.config) if args.config else TrainingConfig()
    changes = {name: getattr(args, name) for name in OVERRIDES if getattr(args, name) is not None}
    architecture = {name: getattr(args, name) for name in ARCHITECTURE_OVERRIDES if getattr(args, name) is not None}
    if architecture:
        changes["architecture"] = {**base.architecture, **architecture}
    config = from_json({**base.to_json(), **changes})
    output_directory(config.out, "out", [args.config, config.data])

    from jgpt.artifact import save_artifact
    from training.run_lock import run_lock
    from training.trainer import train

    with run_lock(Path(config.out)):
        result = train(config, resume=args.resume, progress=not args.quiet)
        artifact = save_artifact(
            result.run.model.absolute(), config.model_architecture, result.weights, result.provenance,
            result.corpus.tokenizer, overwrite=True,
        )  # fmt: skip
    summary = {
        "model": str(artifact.path),
        "checkpoint_sha256": artifact.checkpoint_sha256,
        "provenance": result.provenance.to_json() | {"source_sha256": "(see manifest.json)"},
        "devices": result.devices,
        "metrics": str(result.run.metrics),
        "loss_curve": str(result.run.loss_curve),
    }
    print(json.dumps(summary, indent=2))
    return 0


def eval_command(prog: str, argv: list[str]) -> int:
    parser = _Parser(prog=prog, description="Development loss and held-out exact match of a model.")
    parser.add_argument("--model", help="catalog id or artifact directory (default: the catalog's default model)")
    parser.add_argument("--data", help="UTF-8 text file: evaluate on its development part instead of the conversations")
    parser.add_argument("--development-fraction", type=float, default=0.1)
    parser.add_argument("--conversations", type=int, default=500, help="held-out conversations to generate")
    parser.add_argument("--seed", type=int, help="conversation seed (default: the model's training seed)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)

    from training.report import evaluate_model

    report = evaluate_model(
        args.model, data=args.data, development_fraction=args.development_fraction,
        conversations=args.conversations, seed=args.seed,
    )  # fmt: skip
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"model {report['model']}  development loss {report['development_loss']:.4f} nats/token  "
              f"{report['development_bits_per_byte']:.4f} bits/byte")  # fmt: skip
        for skill, result in report.get("skills", {}).items():
            print(f"  {skill:<8} exact match {result['exact_match']:7.2%} of {result['exercises']}")
    return 0


COMMANDS = {"train": train_command, "eval": eval_command}


def main(command: str, argv: list[str]) -> int:
    return COMMANDS[command](f"jgpt {command}", argv)


def module_main(argv: list[str] | None = None) -> int:
    """`python -m training train|eval ...`."""
    from jgpt.errors import run_guarded

    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] not in COMMANDS:
        print(f"usage: python -m training {{{','.join(COMMANDS)}}} [ARGS...]", file=sys.stderr)
        return 2
    return run_guarded(f"python -m training {args[0]}", lambda: main(args[0], args[1:]))
