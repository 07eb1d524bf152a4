"""Deterministic pseudo-random token ids: a counter-based hash (splitmix64), vectorized.

`pseudo_tokens(key, n)` depends only on (key, n, salt, vocab): the same hash id always
gives the same block, in any process, without a random generator's state.
"""

from __future__ import annotations

import numpy as np

from marconi.workload.types import Tokens

FIRST_ID = 3  # ids 0..2 are <unk>, <s>, </s> in sentencepiece vocabularies
_MASK = (1 << 64) - 1


def _splitmix64(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def pseudo_tokens(key: int, n: int, *, vocab: int, salt: int = 0) -> Tokens:
    """`n` ids in `[FIRST_ID, vocab)`, a pure function of `(key, salt)`."""
    seed = _splitmix64(np.array([(key * 0x100000001B3 + salt) & _MASK], dtype=np.uint64))[0]
    with np.errstate(over="ignore"):
        counters = seed + np.arange(n, dtype=np.uint64) * np.uint64(0xD1B54A32D192ED03)
    ids = _splitmix64(counters) % np.uint64(vocab - FIRST_ID) + np.uint64(FIRST_ID)
    return ids.astype(np.int32)


def block_tokens(
    ids: list[int] | tuple[int, ...], block: int, *, vocab: int, salt: int = 0
) -> Tokens:
    """The concatenated blocks of `ids`: block `h` is `pseudo_tokens(h, block, ...)`."""
    keys = np.array(ids, dtype=np.uint64).reshape(-1, 1)
    with np.errstate(over="ignore"):
        seeds = _splitmix64(keys * np.uint64(0x100000001B3) + np.uint64(salt & _MASK))
        counters = seeds + np.arange(block, dtype=np.uint64) * np.uint64(0xD1B54A32D192ED03)
    ids_out = _splitmix64(counters.reshape(-1)) % np.uint64(vocab - FIRST_ID) + np.uint64(FIRST_ID)
    return ids_out.astype(np.int32)
