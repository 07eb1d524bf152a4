"""Token sequences as the cache sees them: flat, contiguous int32 arrays."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

Tokens = npt.NDArray[np.int32]
_INT32_MAX = int(np.iinfo(np.int32).max)


def as_tokens(values: object, *, what: str = "tokens") -> Tokens:
    """Return `values` as a 1-D int32 array, or raise ValueError naming `what`.

    Accepts sequences of Python ints and integer numpy arrays; refuses floats,
    bools, strings, nested lists and values outside int32.
    """
    if type(values) is np.ndarray and values.dtype == np.int32 and values.ndim == 1 \
            and values.flags.c_contiguous:  # already tokens (a driver's arrays): check the sign
        if values.size and values.min() < 0:
            raise ValueError(f"{what}: token ids must be in [0, 2**31), got "
                             f"{values.min()}..{values.max()}")
        return values
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise ValueError(f"{what}: expected a flat list of token ids, got shape {arr.shape}")
    if arr.size and (arr.dtype.kind not in "iu"):
        raise ValueError(f"{what}: token ids must be integers, got dtype {arr.dtype}")
    if arr.size and (arr.min() < 0 or arr.max() > _INT32_MAX):
        raise ValueError(f"{what}: token ids must be in [0, 2**31), got {arr.min()}..{arr.max()}")
    return np.ascontiguousarray(arr, dtype=np.int32)
