"""The options that shape `kvsim synthesize`'s workload, read into a ConversationMix (docs/kvsim.md,
"Workload shaping"): the rate and how conversations start, turns, think times, the length distributions
(`kvsim.distributions`, a trace's lengths read here), the budget and the system prompts."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from jgpt.foundation.errors import ApiError
from jgpt.foundation.identity import read_bytes
from kvsim import distributions, traces
from kvsim.analytic_documents import DIMENSION_LIMIT
from kvsim.distributions import Distribution
from kvsim.synthetic import FRAMING, Arrivals, ConversationMix, check_fits

# `synthesize`'s default rate, requests a second: the labs' default system (experiments/generation_defaults.json)
# serves the default workload at it well under half busy, rejecting none (tests/test_kvsim_synthesize.py).
DEFAULT_RATE = 20.0
RATE_RANGE = (1e-3, 1e6)  # at the slowest, 100,000 requests arrive within 2^53 us, what kvsim reads
TURNS_LIMIT, THINK_MS_LIMIT, SYSTEMS_LIMIT = 1000, 3_600_000, 1000  # a conversation within 2^53 us too
# The options that shape a synthesized workload, in the order its provenance writes them.
SHAPE = ("requests", "seed", "rate", "arrivals", "turns", "think_ms", "prompt_tokens", "output_tokens",
         "max_new_tokens", "system_prompts", "system_tokens")  # fmt: skip


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The shaping options, one group of `synthesize`'s --help."""
    shape = parser.add_argument_group(
        "workload shape",
        "DIST is N, uniform:LO:HI, lognormal:MEDIAN:P90 (the median and 90th percentile of a log-normal) or "
        "trace:mooncake|azure:PATH (a trace's prompt or output lengths, drawn at random); docs/kvsim.md",
    )
    shape.add_argument(
        "--rate",
        type=float,
        default=DEFAULT_RATE,
        metavar="R",
        help=f"requests a second on average, {RATE_RANGE[0]:g} to {RATE_RANGE[1]:g}; conversations start at "
        "R / mean turns. At the default the labs' default system serves the default workload well under half "
        "busy, rejecting none",
    )
    shape.add_argument(
        "--arrivals",
        choices=tuple(Arrivals),
        default=Arrivals.POISSON,
        help="conversation starts: a Poisson process (exponential gaps), or fixed spacing",
    )
    shape.add_argument(
        "--turns", default="uniform:1:6", metavar="N|uniform:LO:HI", help=f"turns per conversation, 1 to {TURNS_LIMIT}"
    )
    shape.add_argument(
        "--think-ms",
        default="uniform:20:80",
        metavar="N|uniform:LO:HI",
        help=f"milliseconds between a conversation's turns (0 to {THINK_MS_LIMIT:,}); turns arrive on this "
        "schedule whether or not the previous reply is done",
    )
    shape.add_argument(
        "--prompt-tokens",
        default=f"uniform:{8 + FRAMING}:{40 + FRAMING}",
        metavar="DIST",
        help=f"ids each turn adds to its conversation's prompt: the user's message and its {FRAMING} framing "
        f"ids, so at least {FRAMING + 1}; cut to what the model's context leaves",
    )
    shape.add_argument(
        "--output-tokens",
        default="uniform:3:13",
        metavar="DIST",
        help="ids each reply selects, its turn end included; a reply longer than --max-new-tokens stops there",
    )
    shape.add_argument("--max-new-tokens", type=int, default=12, metavar="N", help="each request's generation budget")
    shape.add_argument(
        "--system-prompts",
        type=int,
        default=4,
        metavar="N",
        help=f"shared system prompts conversations open with, one drawn for each (0: none; at most {SYSTEMS_LIMIT})",
    )
    shape.add_argument("--system-tokens", type=int, default=32, metavar="N", help="ids of each system prompt's text")


def command_line(args: argparse.Namespace) -> str:
    """The synthesize command that makes the workload again (its model options aside): the document's provenance."""
    return "kvsim synthesize " + " ".join(f"--{name.replace('_', '-')} {getattr(args, name)}" for name in SHAPE)


def mix(args: argparse.Namespace, context: int) -> tuple[ConversationMix, list[Path]]:
    """The ConversationMix the shaping options write, and the traces it samples (read here)."""
    if not (RATE_RANGE[0] <= args.rate <= RATE_RANGE[1]):  # NaN too
        raise ApiError(
            "--rate", f"must be from {RATE_RANGE[0]:g} to {RATE_RANGE[1]:g} requests a second, got {args.rate}"
        )
    traces_read: list[Path] = []

    def lengths(option: str, least: int, pick: Callable[[traces.Lengths], list[int]]) -> Distribution:
        """A length option's distribution, a trace's read here."""
        # Lengths past the context are cut (a prompt) or stopped (a reply) as they are drawn; check_fits refuses
        # a shape that cannot fit at all. The bound keeps a drawn reply's ids within memory.
        most = DIMENSION_LIMIT
        parsed = distributions.parse(getattr(args, option.removeprefix("--").replace("-", "_")), option, least, most)
        if not isinstance(parsed, distributions.TraceSource):
            return parsed
        if parsed.form not in traces.FORMATS:
            raise ApiError(option, f"trace formats are {', '.join(traces.FORMATS)}, got {parsed.form!r}")
        path = Path(parsed.path)
        traces_read.append(path)
        text = read_bytes(path, option).decode("utf-8", errors="replace")
        return distributions.sampled(pick(traces.lengths(parsed.form, text)), parsed, option, least, most)

    mix = ConversationMix(
        system_prompts=args.system_prompts,
        system_tokens=args.system_tokens,
        turns=_range(args.turns, "--turns", 1, TURNS_LIMIT, 1),
        prompt_tokens=lengths("--prompt-tokens", FRAMING + 1, lambda t: t.prompts),
        output_tokens=lengths("--output-tokens", 1, lambda t: t.outputs),
        max_new_tokens=args.max_new_tokens,
        arrivals=Arrivals(args.arrivals),
        think_us=_range(args.think_ms, "--think-ms", 0, THINK_MS_LIMIT, 1000),
        context=context,
    )
    if args.max_new_tokens > context:
        raise ApiError("--max-new-tokens", f"must be at most the model's context {context}, got {args.max_new_tokens}")
    check_fits(mix, "--prompt-tokens")
    return mix.with_rate(args.rate), traces_read


def _range(text: str, option: str, least: int, most: int, scale: int) -> tuple[int, int]:
    """A fixed or uniform count as the (first, last) a ConversationMix draws between."""
    parsed = distributions.parse(text, option, least * scale, most * scale, scale)
    if isinstance(parsed, distributions.Fixed):
        return parsed.value, parsed.value
    if isinstance(parsed, distributions.Uniform):
        return parsed.low, parsed.high
    raise ApiError(option, f"takes N or uniform:LO:HI, got {text!r}")
