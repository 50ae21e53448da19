"""The main job, end to end: answers from the default checkpoint, the default lab, its report.

`python -m experiments demo [--out DIR]` (what `make demo` runs):
1. show how the first built-in prompt becomes token ids, then generate answers with the
   catalog's default model for GenerationDefaults' built-in prompts;
2. run the default lab (model -> recorded computations -> kvsim, every arm) and replay its record;
3. write the self-contained HTML report and print where it is.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from jgpt.foundation.units import duration_us, percent

DEFAULT_LAB = "prefix-reuse-multi-turn"


def main(command: str, argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m experiments {command}", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/demo"), help="directory for the lab's record and report")
    parser.add_argument("--lab", default=DEFAULT_LAB, help=f"lab to run (default: {DEFAULT_LAB})")
    args = parser.parse_args(argv)
    # Start-up cost only: `--help` and a refused argument answer before jax and the model load.
    from experiments.experiment_design import default_catalog
    from experiments.experiment_execution import run_lab
    from experiments.experiment_replay import replay
    from experiments.generation_defaults import generation_defaults
    from experiments.lab_recording import record_workload
    from jgpt.artifacts.artifact import TOKENIZER
    from jgpt.artifacts.catalog import resolve_model
    from jgpt.kernels.plan import Kernels
    from jgpt.tokenizers.span_table import render
    from jgpt.tokenizers.tokenizer import Tokenizer
    from jgpt.tokenizers.tokenizer_file import load_tokenizer

    lab = default_catalog().lab(args.lab)
    lab.refuse_if_planned()
    defaults = generation_defaults()
    recording = record_workload(defaults.execution, defaults.workload, Kernels.auto())
    model = recording.model
    tokenizer_file = resolve_model(model["model_id"]) / TOKENIZER
    tokenizer = load_tokenizer(tokenizer_file) if tokenizer_file.is_file() else Tokenizer.bytes_only()
    first = defaults.workload.requests[0]
    print(f"== the prompt of {first.request_id!r}, framed into token ids (every id explained by its span) ==")
    print(render(tokenizer.encode_turns(first.turns, open_turn="assistant"), tokenizer) + "\n")
    print(f"== answers from {model['model_id']} (checkpoint {model['checkpoint_sha256'][:12]}) ==")
    for request, recorded in zip(defaults.workload.requests, recording.document["requests"]):
        answer = tokenizer.decode([i for i in recorded["output_ids"] if i != tokenizer.turn_end_id]).text
        print(f"  {request.text!r:28} -> {answer!r}  [{recorded['outcome']['stop_reason']}]")
    print(f"\n== lab {lab.id}: {lab.question} ==")
    run = run_lab(lab, args.out / lab.id, defaults=defaults)
    record = replay(run.directory / "record.json")
    for arm in record["arms"]:
        totals = arm["outcomes"]
        print(
            f"  {arm['label']:40} ttft p50 {duration_us(totals['latency_us']['ttft']['p50'])}, "
            f"token hit rate {percent(totals['token_hit_rate'])}, compute busy {duration_us(totals['compute_busy_us'])}"
        )
    print(f"\nrecord (replays byte for byte): {run.directory / 'record.json'}")
    print(f"report: {(run.directory / 'report.html').resolve()}")
    return 0
