"""Units: byte sizes and counts (parsing and printing) and channel ratios as fractions.
``kB``/``MB``/``GB`` are 1000-based, ``KiB``/``MiB``/``GiB`` 1024-based.

``KB`` (capital K, as in "256KB SRAM") is read as 1000-based kB, following the SI prefix
rule; use ``KiB`` for 1024. Every parsed budget is echoed back in bytes by the CLI.

FLOP counts (``parse_flops``, ``fmt_flops``) are 1000-based: k, M, G, T, optionally followed by
"FLOP" / "FLOPs" ("5MFLOPs", "2.5e6", "1G"); a bare number is FLOPs.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

from .errors import BadOption

UNITS: dict[str, int] = {
    "b": 1,
    "": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}
_BUDGET = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*$")


def parse_bytes(text: str | int | float) -> int:
    """Parse "100KB", "100 kB", "100KiB", "0.1MB" or plain bytes into an int number of bytes.

    Fractional results are rounded down to whole bytes. Raises BadOption on anything else.
    """
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value, unit = float(text), ""
    else:
        m = _BUDGET.match(str(text))
        if not m:
            raise BadOption(
                f"cannot read {text!r} as a size",
                'write e.g. "100KB" (1000-based), "100KiB" (1024-based) or plain bytes',
            )
        value, unit = float(m.group(1)), m.group(2)
    key = unit.lower()
    if key not in UNITS:
        raise BadOption(
            f"unknown size unit {unit!r} in {text!r}", "use B, kB/KB, MB, GB (1000-based) or KiB, MiB, GiB (1024-based)"
        )
    nbytes = value * UNITS[key]
    if not math.isfinite(nbytes) or nbytes > 2**62:
        raise BadOption(f"size {text!r} is too large")
    if nbytes <= 0:
        raise BadOption(f"size {text!r} must be positive")
    return int(nbytes)


#: FLOP-count prefixes, 1000-based (case-insensitive: "5mflops" is 5 MFLOPs, never milli)
FLOP_PREFIXES: dict[str, int] = {"": 1, "k": 1000, "m": 1000**2, "g": 1000**3, "t": 1000**4}


def parse_flops(text: str | int | float) -> int:
    """Parse "5MFLOPs", "5 MFLOP", "2.5e6", "1G", "300k" or plain FLOPs into an int number of FLOPs.

    Prefixes k, M, G, T are 1000-based; fractional results are rounded down. Raises BadOption on
    anything else."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value, unit = float(text), ""
    else:
        m = _BUDGET.match(str(text))
        if not m:
            raise BadOption(f"cannot read {text!r} as a FLOP count", 'write e.g. "5MFLOPs", "2.5e6" or "1G"')
        value, unit = float(m.group(1)), m.group(2)
    key = unit.lower()
    for suffix in ("flops", "flop"):
        if key.endswith(suffix):
            key = key[: -len(suffix)]
            break
    if key not in FLOP_PREFIXES:
        raise BadOption(f"unknown FLOP unit {unit!r} in {text!r}", "use k, M, G or T (1000-based), e.g. 5MFLOPs")
    flops = value * FLOP_PREFIXES[key]
    if not math.isfinite(flops) or flops > 2**62:
        raise BadOption(f"FLOP count {text!r} is too large")
    if flops < 1:
        raise BadOption(f"FLOP count {text!r} must be at least 1 FLOP")
    return int(flops)


def fmt_flops(n: float) -> str:
    """A FLOP count with a 1000-based prefix: ``5_000_000 -> '5.00 MFLOPs'``."""
    for div, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= div:
            return f"{n / div:.2f} {prefix}FLOPs"
    return f"{int(n)} FLOPs"


def fmt_bytes(n: float, binary: bool = False) -> str:
    """Human-readable size: 1000-based kB/MB/GB by default, KiB/MiB/GiB with ``binary``."""
    base, names = (1024, ["B", "KiB", "MiB", "GiB", "TiB"]) if binary else (1000, ["B", "kB", "MB", "GB", "TB"])
    value, i = float(n), 0
    while abs(value) >= base and i < len(names) - 1:
        value /= base
        i += 1
    return f"{int(value)} B" if i == 0 else f"{value:.1f} {names[i]}"


def fmt_count(n: float) -> str:
    """Count with a metric suffix (K = 1e3, M = 1e6, G = 1e9)."""
    for div, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "K")):
        if abs(n) >= div:
            return f"{n / div:.2f}{suffix}"
    return str(int(n))


def ratio_label(r: float) -> str:
    """A channel ratio as a fraction: ``0.125 -> '1/8'``, ``1.0 -> '1'`` (denominators up to 64)."""
    return str(Fraction(r).limit_denominator(64))
