"""Training metrics: one JSON object per line, and a loss-curve PNG drawn from them."""

from __future__ import annotations

import json
import os
from pathlib import Path

from jgpt.foundation.identity import read_bytes, write_atomically
from jgpt.foundation.json_input import parse_json


def read(path: Path) -> list[dict]:
    if not path.exists():
        return []
    lines = read_bytes(path, "metrics").splitlines()
    return [parse_json(line, "metrics", source=f"{path} line {n}") for n, line in enumerate(lines, 1) if line.strip()]


def truncate_after(path: Path, step: int) -> None:
    """Drop records past `step`: a resumed run rewrites what the interrupted one logged after its checkpoint."""
    kept = [record for record in read(path) if record["step"] <= step]
    write_atomically(path, "".join(json.dumps(record) + "\n" for record in kept).encode())


def append(path: Path, record: dict) -> None:
    """Add one whole line: a write the system refuses (a full disk) takes back what it wrote, so that a resumed
    run does not read half a record."""
    line = (json.dumps(record) + "\n").encode()
    with path.open("ab", buffering=0) as file:  # unbuffered: nothing is left to flush after a refusal
        size = file.tell()
        try:
            written = 0
            while written < len(line):  # a write to a nearly full disk may take part of the line
                written += file.write(line[written:]) or 0
        except OSError:
            file.truncate(size)
            raise


def plot(metrics_path: Path, png_path: Path) -> None:
    """Training loss per logged step and development loss per evaluation, on one log-scale axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read(metrics_path)
    train = [(r["step"], r["loss"]) for r in records if "loss" in r]
    development = [(r["step"], r["development_loss"]) for r in records if "development_loss" in r]
    figure, axis = plt.subplots(figsize=(7, 4))
    if train:
        axis.plot(*zip(*train), label="train loss", linewidth=1)
    if development:
        axis.plot(*zip(*development), "o-", label="development loss")
    axis.set(xlabel="step", ylabel="cross-entropy (nats/token)", yscale="log")
    axis.grid(alpha=0.3)
    axis.legend()
    figure.tight_layout()
    temporary = png_path.with_name(png_path.stem + ".tmp.png")
    try:
        figure.savefig(temporary, dpi=100)
        os.replace(temporary, png_path)
    except BaseException:
        temporary.unlink(missing_ok=True)  # a full disk leaves no half-drawn curve
        raise
    finally:
        plt.close(figure)
