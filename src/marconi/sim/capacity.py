"""`check_capacity`: a cache size that could hold something, or a clear error."""

from __future__ import annotations

from marconi.core.spec import ModelSpec
from marconi.core.units import format_size, parse_size

VANILLA = "vanilla"  # caches nothing: any capacity, 0 included, is its capacity


def check_capacity(spec: ModelSpec, capacity: int | str, system: str | None = None) -> int:
    """`capacity` in bytes; ValueError when it is 0 or smaller than one SSM checkpoint of
    `spec` (nothing could ever be cached: every figure would be a silent zero), unless
    `system` is vanilla, which caches nothing whatever its size."""
    size = parse_size(capacity)
    if system == VANILLA:
        return size
    if size <= 0:
        raise ValueError(f"capacity {capacity!r} is 0 bytes: nothing could be cached "
                         "(use --system vanilla to replay without a cache)")
    if size < spec.ssm_bytes:
        raise ValueError(f"capacity {capacity!r} ({format_size(size)}) is smaller than one "
                         f"SSM state of {spec.name} ({format_size(spec.ssm_bytes)}): nothing "
                         "could be cached")
    return size
