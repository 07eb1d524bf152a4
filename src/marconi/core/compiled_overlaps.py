"""An overlap distribution's books and sparse prefix caching's placement on the compiled
core (`peers.sparse_prefix`: the sparse-prefix peer's, marconi+'s planner's; its Python
classes are their oracles): `SequenceTree`, the sequences seen; `DepthBooks`, the overlap
depths learnt; `place`, the checkpoints placed under a budget. `compiled.chosen()` says
whether they run; each needs the compiled core built."""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from typing import Any, cast

from marconi.core.tree import TOKEN_BYTES

try:
    from marconi.core import _native  # type: ignore[attr-defined]
except ImportError:  # not built: `compiled.chosen()` never picks these
    _native = None


class SequenceTree:
    """The sequences an overlap distribution has seen (`peers.sparse_prefix.Overlaps`:
    the sparse-prefix peer's, marconi+'s planner's) on the compiled core: a cache that never
    evicts, told each sequence (`spell`) and asked how far an input matches one (`depth`);
    `peers.sparse_prefix.PySequences` is its oracle."""

    def __init__(self, core: Any = None) -> None:
        assert _native is not None
        self._core = core if core is not None else _native.NativeCore(
            {"kv_per_token": 1, "ssm_bytes": 0, "attention": 0, "mlp": 0, "ssm": 1,
             "d_model": 1, "d_state": 1}, 1 << 62, "placed", "keep", 0.0)
        if core is None:  # each sequence kept whole (its branch point and end placed)
            self._core.set_placement(True, 0, True)

    def depth(self, key: builtins.bytes) -> int:
        """Tokens of `key` (int32 bytes) that some sequence spelled."""
        return int(self._core.peek(key)[1]) if key else 0

    def spell(self, key: builtins.bytes) -> None:
        """Add the sequence `key` (int32 bytes)."""
        if key:
            self._core.commit(key, len(key) // TOKEN_BYTES)

    def __deepcopy__(self, memo: dict[int, object]) -> SequenceTree:
        return SequenceTree(self._core.copy())

    def __getstate__(self) -> tuple[Any, ...]:
        """Pickled as its tree (the sequences' edges in walk order), reloaded whole."""
        return (*self._core.take(), self._core.clock)

    def __setstate__(self, state: tuple[Any, ...]) -> None:
        self.__init__()  # type: ignore[misc]
        self._core.load(*state)


class DepthBooks:
    """The overlap depths an overlap distribution has learnt (`peers.sparse_prefix.
    Overlaps`: the sparse-prefix peer's, marconi+'s planner's) on the compiled core: each
    distinct depth with its count, the requests that overlapped nothing, and what `place`
    is given from them (`distribution`, `thinned`); `peers.sparse_prefix.PyDepthBooks` is
    its oracle. Depths below 2^53."""

    def __init__(self) -> None:
        assert _native is not None
        self._books = _native.DepthBooks()

    @property
    def overlapped(self) -> int:
        """Requests learnt that overlapped something."""
        return int(self._books.overlapped)

    @property
    def zeros(self) -> int:
        """Requests learnt that overlapped nothing."""
        return int(self._books.zeros)

    def add(self, depth: int) -> None:
        """Count a request that overlapped `depth` tokens."""
        self._books.add(depth)

    def depths(self) -> list[int]:
        """The distinct depths learnt, ascending."""
        return cast("list[int]", self._books.depths())

    def end(self, n: int) -> int:
        """How many distinct depths are at most `n`."""
        return int(self._books.end(n))

    def distribution(self, n: int, pending: int | None) -> tuple[list[int], list[float]]:
        """`Overlaps.distribution`."""
        return cast("tuple[list[int], list[float]]", self._books.distribution(n, pending))

    def thinned(self, end: int, step: float) -> tuple[list[int], list[float]]:
        """`PyDepthBooks.thinned`."""
        return cast("tuple[list[int], list[float]]", self._books.thinned(end, step))

    def __deepcopy__(self, memo: dict[int, object]) -> DepthBooks:
        out = DepthBooks()
        out._books.load(*self._books.take())
        return out

    def __getstate__(self) -> tuple[Any, ...]:
        return cast("tuple[Any, ...]", self._books.take())

    def __setstate__(self, state: tuple[Any, ...]) -> None:
        self.__init__()  # type: ignore[misc]
        self._books.load(*state)


def place(depths: Sequence[int], survival: Sequence[float], budget: int
          ) -> tuple[float, tuple[int, ...]]:
    """`peers.sparse_prefix.place` on the compiled core (depths below 2^53; built)."""
    assert _native is not None
    return cast("tuple[float, tuple[int, ...]]",
                _native.place(list(depths), list(survival), budget))
