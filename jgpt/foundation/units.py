"""Human units for the summaries a person reads: bytes in KiB/MiB/GiB, times in us/ms/s, large counts in k/M/G.

Only text for reading: records and every `--json` keep the exact numbers. Each figure keeps three
significant digits (at least: 512 B, 850 us and 123 M are exact to the unit), so a value read back
from its text is within 0.5% of the value (or exact, below the first step).
"""

from __future__ import annotations

BYTES = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")
MICROSECONDS = (("us", 1), ("ms", 1e3), ("s", 1e6))
COUNTS = ("", "k", "M", "G", "T", "P", "E")


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
