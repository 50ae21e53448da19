"""Human units for the summaries a person reads: bytes in KiB/MiB/GiB, times in us/ms/s, large counts in k/M/G,
rates in B/s (decimal, as link and memory bandwidths are quoted) and FLOP/s, fractions in percent.

Only text for reading: records and every `--json` keep the exact numbers. Each figure keeps three
significant digits (at least: 512 B, 850 us and 123 M are exact to the unit), so a value read back
from its text is within 0.5% of the value (or exact, below the first step).
"""

from __future__ import annotations

BYTES = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")
MICROSECONDS = (("us", 1), ("ms", 1e3), ("s", 1e6))
COUNTS = ("", "k", "M", "G", "T", "P", "E")
FLOPS = ("FLOP", "kFLOP", "MFLOP", "GFLOP", "TFLOP", "PFLOP", "EFLOP")


def byte_size(n: int | float | None) -> str:
    """A size in bytes, e.g. 2515464192 -> '2.34 GiB', 512 -> '512 B'; None -> '-'."""
    if n is None:
        return "-"
    return _scaled(n, [(unit, 1024.0**k) for k, unit in enumerate(BYTES)], 1024)


def duration_us(us: int | float | None) -> str:
    """A duration given in microseconds, e.g. 850 -> '850 us', 12345 -> '12.3 ms', 4.5e6 -> '4.50 s'."""
    if us is None:
        return "-"
    return _scaled(us, MICROSECONDS, 1000)


def count(n: int | float | None) -> str:
    """A large count with an SI prefix, e.g. 1234567 -> '1.23 M', 950 -> '950'; None -> '-'."""
    if n is None:
        return "-"
    return _scaled(n, [(unit, 1000.0**k) for k, unit in enumerate(COUNTS)], 1000).rstrip()


def byte_rate(bytes_per_us: int | float | None) -> str:
    """A bandwidth given in bytes per microsecond, in decimal bytes per second: 3000 -> '3.00 GB/s'."""
    if bytes_per_us is None:
        return "-"
    per_second = bytes_per_us * 1e6
    return _scaled(per_second, [(f"{p}B/s", 1000.0**k) for k, p in enumerate(COUNTS)], 1000)


def flop_count(n: int | float | None) -> str:
    """A number of floating-point operations, e.g. 1158834176 -> '1.16 GFLOP'."""
    if n is None:
        return "-"
    return _scaled(n, [(unit, 1000.0**k) for k, unit in enumerate(FLOPS)], 1000)


def flop_rate(flops_per_us: int | float | None) -> str:
    """A compute rate given in FLOPs per microsecond, per second: 100000 -> '100 GFLOP/s'."""
    if flops_per_us is None:
        return "-"
    return _scaled(flops_per_us * 1e6, [(f"{unit}/s", 1000.0**k) for k, unit in enumerate(FLOPS)], 1000)


def percent(fraction: int | float | None) -> str:
    """A fraction as a percentage with one decimal: 0.59209 -> '59.2%'; None -> '-'."""
    return "-" if fraction is None else f"{100 * fraction:.1f}%"


def _scaled(value: int | float, units, step: float) -> str:
    """`value` in the largest unit it reaches (at least 1 of it), with 3 significant digits."""
    if value < 0:
        return "-" + _scaled(-value, units, step)
    name, size = units[0]
    for candidate, candidate_size in units[1:]:
        # A value that rounds up to a full step shows in the next unit: 1.00 MiB, not 1024 KiB.
        if value / candidate_size >= 1 or round(value / size, _decimals(value / size)) >= step:
            name, size = candidate, candidate_size
    scaled = value / size
    if size == 1 and float(value).is_integer():
        return f"{int(value)} {name}"
    return f"{scaled:.{_decimals(scaled)}f} {name}"


def _decimals(scaled: float) -> int:
    return 2 if scaled < 10 else 1 if scaled < 100 else 0
