"""`jgpt train` and `jgpt eval` (also `python -m training train|eval`)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from jgpt.foundation import progress
from jgpt.foundation.command_line import ArgumentParser
from jgpt.foundation.errors import ApiError
from jgpt.foundation.output_paths import output_directory
from jgpt.model.architecture import PRECISION_NAMES

# Command-line flag -> TrainingConfig field, for the fields a user commonly overrides.
OVERRIDES = {
    "data": str, "init_from": str, "out": str, "tokenizer": str, "vocab_size": int, "seed": int, "steps": int,
    "batch_size": int, "learning_rate": float, "warmup_steps": int, "schedule_steps": int, "context": int, "selection": str,
    "log_every": int, "eval_every": int, "checkpoint_every": int, "train_conversations": int,
    "products": str, "attention": str,
}  # fmt: skip
ARCHITECTURE_OVERRIDES = ("layers", "heads", "width", "ffn")
# flag -> (metavar, help); the help ends with TrainingConfig's default, since the flag itself defaults to
# "not given" (so a --config file's value stands unless a flag overrides it).
HELP = {
    "data": ("FILE.txt", "UTF-8 text file to train on (default: the built-in multi-turn conversations)"),
    "init_from": (
        "MODEL",
        "fine-tune: start from this catalog id or artifact directory (e.g. chat, or a `jgpt import-hf` output):"
        " its weights, tokenizer and architecture (which the architecture flags may not change; --precision may),"
        " with this run's data and recipe; its provenance names the parent (default: initialized weights)",
    ),
    "out": ("DIR", "directory for checkpoints, metrics.jsonl, loss.png and model/"),
    "tokenizer": (
        None,
        "bytes: the 260-id byte tokenizer; bpe: merges learned from --data; parent: the --init-from model's"
        " (default: bytes, or parent with --init-from)",
    ),
    "vocab_size": ("N", "vocabulary of a bpe tokenizer (default: 512, or the parent's with --init-from)"),
    "seed": ("N", "seed of the initialization (none with --init-from), the batches and the built-in conversations"),
    "steps": (
        "N",
        "optimizer steps; with --resume, more than the run was started for extends it (the learning-rate"
        " schedule keeps its span and the steps past it hold its final rate)",
    ),
    "batch_size": ("N", "sequences per step"),
    "learning_rate": ("LR", "peak learning rate of the warm-up + cosine schedule"),
    "warmup_steps": ("N", "linear warm-up steps (default: min({WARMUP_STEPS}, steps // 10))"),
    "schedule_steps": (
        "N",
        "steps the learning-rate schedule spans; the steps after it hold its final rate (default: steps, or what"
        " the run recorded when --resume extends it)",
    ),
    "context": ("N", "training window in tokens (default: the architecture's context)"),
    "selection": (None, "which checkpoint becomes model/: the best development loss or the last"),
    "log_every": ("N", "steps between metrics.jsonl lines"),
    "eval_every": ("N", "steps between development-loss evaluations"),
    "checkpoint_every": ("N", "steps between checkpoints"),
    "train_conversations": ("N", "built-in conversations to generate for training"),
    "products": (
        None,
        "the train step's dense products: xla (XLA's dot, the pure-JAX reference the shipped models were trained"
        " with) or blas (numpy's bundled OpenBLAS, one CPU device only: faster at some widths, but it rounds"
        " differently, so a run is reproduced only with the same choice)",
    ),
    "attention": (
        None,
        "the train step's attention: full (every score computed and the later keys masked, what the shipped"
        " models were trained with), causal_blocks (the keys wholly after each block of 64 queries skipped:"
        " faster at long contexts) or causal_blas (those blocks by a BLAS kernel that never stores the"
        " [T, T] weights: one CPU device only, faster at every context measured); the last two round"
        " differently, so a run is reproduced only with the same choice",
    ),
    "layers": ("N", "transformer blocks"),
    "heads": ("N", "attention heads"),
    "width": ("N", "channels of the residual stream"),
    "ffn": ("N", "hidden units of each feed-forward block"),
}
EXAMPLES = """\
examples:
  jgpt train --out runs/chat                       the shipped model's recipe, from initialized weights
  jgpt train --init-from chat --data notes.txt --learning-rate 3e-4 --steps 300 --out runs/notes
                                                   fine-tune the shipped model on a text file
  jgpt train --out runs/notes --resume             continue an interrupted run as its run.json records it
  jgpt train --out runs/notes --resume --steps 600 extend a run: steps past its 300 hold the final rate
"""
CHOICES = {
    "tokenizer": "TOKENIZERS",
    "selection": "SELECTIONS",
    "products": "PRODUCTS",
    "attention": "ATTENTIONS",
}  # names in training.config


class _Parser(ArgumentParser):
    """Usage errors become ApiError, so every bad input leaves the same way."""

    def error(self, message: str):
        raise ApiError("arguments", message)


def _train_parser(prog: str) -> argparse.ArgumentParser:
    parser = _Parser(
        prog=prog,
        description="Train a model, from initialized weights or from another model's (--init-from); writes\n"
        "checkpoints, metrics.jsonl, loss.png and model/ under --out.",
        epilog=EXAMPLES,
    )
    parser.add_argument(
        "--config", metavar="FILE.json", help="JSON file of TrainingConfig fields (unknown keys are an error)"
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue the run under --out from its latest checkpoint, with the configuration its run.json "
        "records (a flag or --config field that differs is refused naming it; only --steps may grow)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    _override_arguments(parser)
    parser.add_argument(
        "--precision",
        choices=PRECISION_NAMES,
        help="compute precision: bf16 rounds matmul operands; weights and Adam state stay f32 (default: the config's)",
    )
    parser.add_argument(
        "--model-axis",
        type=int,
        default=1,
        metavar="N",
        help="devices that split each weight's heads and hidden units (the rest split the batch)",
    )
    return parser


def _override_arguments(parser: argparse.ArgumentParser) -> None:
    """A flag per field of OVERRIDES and ARCHITECTURE_OVERRIDES, its help ending with TrainingConfig's default."""
    import training.config as config  # no jax: `jgpt train --help` stays quick

    defaults = {
        **{f.name: f.default for f in dataclasses.fields(config.TrainingConfig)},
        **config.default_architecture(),
    }
    for name, kind in [*OVERRIDES.items(), *((name, int) for name in ARCHITECTURE_OVERRIDES)]:
        metavar, text = HELP[name]
        text = text.format(WARMUP_STEPS=config.WARMUP_STEPS)
        if "(default" not in text:
            text += f" (default: {defaults[name]})"
        choices = getattr(config, CHOICES[name]) if name in CHOICES else None
        parser.add_argument(
            f"--{name.replace('_', '-')}", type=kind, dest=name, metavar=metavar, choices=choices, help=text
        )


def train_command(prog: str, argv: list[str]) -> int:
    args = _train_parser(prog).parse_args(argv)
    config = training_config(args)
    output_directory(config.out, "out", [args.config, config.data])

    from jgpt.artifacts.artifact import save_artifact
    from jgpt.tokenizers.prompt_format import CHAT, PLAIN
    from training.run_lock import run_lock
    from training.sharding import main_process
    from training.trainer import train

    with run_lock(Path(config.out)):
        result = train(config, resume=args.resume, progress=not args.quiet, model_axis=args.model_axis)
        if not main_process():  # one of several processes: process 0 writes the artifact and the summary
            return 0
        # A model trained on a text file continues text; one trained on the conversations answers turns.
        prompt_format = PLAIN if result.corpus.kind == "text" else CHAT
        artifact = save_artifact(
            result.run.model.absolute(), config.architecture, result.weights, result.provenance,
            result.corpus.tokenizer, prompt_format=prompt_format, overwrite=True,
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


def training_config(args: argparse.Namespace):
    """The TrainingConfig of `jgpt train`: the --config file's fields, overridden by the flags given."""
    from jgpt.foundation.json_input import read_json
    from training.config import TrainingConfig, architecture_settings, from_json

    # The file's own fields, not a completed config: a field it leaves out (the warm-up) follows the flags.
    document = read_json(args.config, "config") if args.config else {}
    if args.resume:  # the flags and the file restate the recorded run, which fills in every field they leave out
        document = _recorded_document(args.out or document.get("out") or TrainingConfig.out) | document
    base = from_json(document)
    changes = {name: getattr(args, name) for name in OVERRIDES if getattr(args, name) is not None}
    architecture = {name: getattr(args, name) for name in ARCHITECTURE_OVERRIDES if getattr(args, name) is not None}
    if args.precision is not None:
        architecture["precision"] = PRECISION_NAMES[args.precision]
    if architecture:
        changes["architecture"] = {**architecture_settings(base.architecture), **architecture}
    return from_json({**document, **changes})


def _recorded_document(out: str) -> dict:
    """The configuration the run under `out` records (its run.json), as a resume starts from; nothing when
    there is none (the run then says there is nothing to resume)."""
    from training.resume import resumable_document
    from training.trainer import RunDirectory, recorded_config

    run = RunDirectory(Path(out))
    return resumable_document(recorded_config(run, "resume")) if run.config.is_file() else {}


def _eval_parser(prog: str) -> argparse.ArgumentParser:
    parser = _Parser(
        prog=prog,
        description="Development loss and bits per byte of a model on held-out data, and held-out exact match per "
        "skill of a chat model. What applies is measured: a chat model on held-out built-in conversations (and its "
        "skills); a model trained on a text file on that text's held-out part, the split its run used; any model on "
        "--data's development part (an imported model needs --data).",
    )
    parser.add_argument(
        "--model", metavar="MODEL", help="catalog id or artifact directory (default: the catalog's default model)"
    )
    parser.add_argument(
        "--data",
        metavar="FILE.txt",
        help="UTF-8 text file: evaluate on its development part (no chat skills) instead of the model's own data",
    )
    parser.add_argument(
        "--development-fraction",
        type=float,
        metavar="F",
        help="the share of the text that is its development part (default: the model's training run's split "
        "where its run.json is beside it, else 0.1, as `jgpt train` splits)",
    )
    parser.add_argument(
        "--conversations", type=int, default=500, metavar="N", help="held-out conversations to generate"
    )
    parser.add_argument("--seed", type=int, metavar="N", help="conversation seed (default: the model's training seed)")
    parser.add_argument(
        "--kernels",
        choices=("auto", "xla"),
        default="auto",
        help="the kernel plan the exact-match generation runs under (auto: jgpt's decode kernels where this CPU "
        "runs them; xla: the pure-JAX reference); recorded in the report",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--quiet", action="store_true", help="no progress on the terminal")
    return parser


def eval_command(prog: str, argv: list[str]) -> int:
    args = _eval_parser(prog).parse_args(argv)
    with progress.shown(args.quiet):
        with progress.stage("starting jax"):
            from training.evaluation_report import evaluate_model

        report = evaluate_model(
            args.model, data=args.data, development_fraction=args.development_fraction,
            conversations=args.conversations, seed=args.seed, kernels=args.kernels,
        )  # fmt: skip
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"model {report['model']}  development loss {report['development_loss']:.4f} nats/token  "
              f"{report['development_bits_per_byte']:.4f} bits/byte  on {report['data']}")  # fmt: skip
        for skill, result in report.get("skills", {}).items():
            print(f"  {skill:<8} exact match {result['exact_match']:7.2%} of {result['exercises']}")
        if "skills" not in report:
            print(f"  no chat skills: measured on a chat model's held-out conversations only "
                  f"(prompt_format {report['prompt_format']})")  # fmt: skip
    return 0


COMMANDS = {"train": train_command, "eval": eval_command}


def main(command: str, argv: list[str]) -> int:
    return COMMANDS[command](f"jgpt {command}", argv)


def module_main(argv: list[str] | None = None) -> int:
    """`python -m training train|eval ...`."""
    from jgpt.foundation.errors import run_guarded

    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] not in COMMANDS:
        print(f"usage: python -m training {{{','.join(COMMANDS)}}} [ARGS...]", file=sys.stderr)
        return 2
    return run_guarded(f"python -m training {args[0]}", lambda: main(args[0], args[1:]))
