"""Byte sizes as users write them: `2GB` (10^9), `2GiB` (2^30), or plain bytes."""

from __future__ import annotations

import re

_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(value: str | int | float) -> int:
    """Bytes in `value`; ValueError naming the value when it is not a size >= 0."""
    if isinstance(value, bool):
        raise ValueError(f"size must be a number of bytes or like '2GB', got {value!r}")
    if isinstance(value, int | float):
        if value < 0 or value != value:
            raise ValueError(f"size must be >= 0 bytes, got {value!r}")
        return int(value)
    if str(value).strip().startswith("-"):
        raise ValueError(f"size must be >= 0 bytes, got {value!r}")
    match = _SIZE.match(str(value))
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _UNITS:
        raise ValueError(f"bad size {value!r}: expected bytes or a number with a unit "
                         "(B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)")
    return int(float(match.group(1)) * _UNITS[unit])


def format_size(n: int | float) -> str:
    """`2.00 GB` style, decimal units (the units sizes are given in)."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)} B"
