"""Distributions of whole numbers a synthetic workload draws from: lengths, turns, think times.

Written as one option value (docs/kvsim.md, "Workload shaping"):

    N                    always N
    uniform:LO:HI        each whole number from LO to HI alike
    lognormal:MEDIAN:P90 round(e^X), X normal with mean ln MEDIAN and the standard deviation that puts
                         the 90th percentile at P90 (sigma = ln(P90 / MEDIAN) / 1.2816); a draw outside the
                         option's range is moved to its nearer end
    trace:FORMAT:PATH    a value of the trace drawn at random (the caller reads it: `kvsim.traces.lengths`)

Each draw takes its randomness from the `random.Random` it is given, so one seed makes one workload.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from statistics import NormalDist

from jgpt.foundation.errors import ApiError
from jgpt.foundation.validation import LIMIT

# The standard normal's 90th percentile: a log-normal's p90 is its median times e^(Z90 sigma).
Z90 = NormalDist().inv_cdf(0.9)


@dataclass(frozen=True)
class Fixed:
    value: int

    def draw(self, rng: random.Random) -> int:
        return self.value  # no randomness drawn: a fixed length leaves the other draws as they were

    @property
    def least(self) -> int:
        return self.value

    def spec(self) -> str:
        return str(self.value)


@dataclass(frozen=True)
class Uniform:
    low: int
    high: int

    def draw(self, rng: random.Random) -> int:
        return rng.randint(self.low, self.high)

    @property
    def least(self) -> int:
        return self.low

    def spec(self) -> str:
        return f"uniform:{self.low}:{self.high}"


@dataclass(frozen=True)
class LogNormal:
    median: float
    p90: float
    least: int  # the option's range: a draw outside it is moved to its nearer end
    most: int

    @property
    def mu(self) -> float:
        return math.log(self.median)

    @property
    def sigma(self) -> float:
        return math.log(self.p90 / self.median) / Z90

    def draw(self, rng: random.Random) -> int:
        return min(self.most, max(self.least, round(rng.lognormvariate(self.mu, self.sigma))))

    def spec(self) -> str:
        return f"lognormal:{self.median:g}:{self.p90:g}"


@dataclass(frozen=True)
class Sampled:
    """Values read from a trace, drawn with replacement."""

    values: tuple[int, ...]
    source: str  # FORMAT:PATH as given

    def draw(self, rng: random.Random) -> int:
        return self.values[rng.randrange(len(self.values))]

    @property
    def least(self) -> int:
        return min(self.values)

    def spec(self) -> str:
        return f"trace:{self.source}"


Distribution = Fixed | Uniform | LogNormal | Sampled
KINDS = ("N", "uniform:LO:HI", "lognormal:MEDIAN:P90", "trace:FORMAT:PATH")


@dataclass(frozen=True)
class TraceSource:
    """`trace:FORMAT:PATH` as written: the caller reads the trace's values and makes a Sampled."""

    form: str
    path: str


def parse(text: str, option: str, least: int, most: int = LIMIT, scale: int = 1) -> Distribution | TraceSource:
    """The distribution `text` writes, its values (times `scale`, a unit) from `least` to `most`."""
    kind, _, rest = text.partition(":")
    if not rest:
        return Fixed(_whole(kind, option, text, least, most, scale))
    if kind == "uniform":
        low, high = (_whole(value, option, text, least, most, scale) for value in _parameters(rest, 2, option, text))
        if low > high:
            raise ApiError(option, f"uniform:LO:HI needs LO <= HI, got {text!r}")
        return Uniform(low, high)
    if kind == "lognormal":
        median, p90 = (_number(value, option, text) * scale for value in _parameters(rest, 2, option, text))
        if not 0 < median <= most:
            raise ApiError(option, f"a log-normal's median must be above 0 and at most {most // scale}, got {text!r}")
        if not median < p90 <= LIMIT:
            raise ApiError(option, f"a log-normal's p90 must be above its median (sigma > 0), got {text!r}")
        return LogNormal(median, p90, least, most)
    if kind == "trace":
        form, _, path = rest.partition(":")
        if not path:
            raise ApiError(option, f"trace:FORMAT:PATH needs a format and a path, got {text!r}")
        return TraceSource(form, path)
    raise ApiError(option, f"expected one of {', '.join(KINDS)}, got {text!r}")


def sampled(values: list[int], source: TraceSource, option: str, least: int, most: int) -> Sampled:
    """A trace's values as a distribution, each checked against the option's range."""
    if not values:
        raise ApiError(option, f"the trace {source.path} holds no requests")
    for index, value in enumerate(values):
        if not least <= value <= most:
            raise ApiError(
                option, f"the trace's request {index + 1} has {value}, outside the {least} to {most} it takes"
            )
    return Sampled(tuple(values), f"{source.form}:{source.path}")


def _parameters(rest: str, count: int, option: str, text: str) -> list[str]:
    values = rest.split(":")
    if len(values) != count:
        raise ApiError(option, f"expected {count} parameters after the kind, got {text!r}")
    return values


def _number(value: str, option: str, text: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise ApiError(option, f"{value!r} is not a number in {text!r}") from None
    if not math.isfinite(number):
        raise ApiError(option, f"{value!r} is not a finite number in {text!r}")
    return number


def _whole(value: str, option: str, text: str, least: int, most: int, scale: int) -> int:
    try:
        number = int(value) * scale
    except ValueError:
        raise ApiError(option, f"{value!r} is not a whole number in {text!r}") from None
    if not least <= number <= most:
        raise ApiError(option, f"values must be from {least // scale} to {most // scale}, got {text!r}")
    return number
