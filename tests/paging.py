"""A paged store whose pages hold token ids: the physical twin of the cache's page books.

`PagedListStore` runs the same `PagePool` a tensor store would, with pages of token ids
instead of K/V, so a test can check both that pages in use times page bytes equal the
cache's KV bytes and that the pages along a path spell its prefix.
"""

from __future__ import annotations

from typing import Any

from marconi.core.pages import PagePool, PageRun


class PagedListStore:
    """KV in a `PagePool` of token pages; states are plain handles, counted while held."""

    def __init__(self, page_size: int) -> None:
        self.pool = PagePool(page_size)
        self.content: dict[int, list[int | None]] = {}  # physical page -> its slots
        self.states = 0  # state handles handed to the cache and not released

    def kv_slice(self, source: Any, start: int, stop: int) -> PageRun:
        run, fresh = self.pool.slice(source, start, stop)
        size = self.pool.page_size
        for logical, page in fresh:
            slots: list[int | None] = list(source[logical * size : (logical + 1) * size])
            self.content[page] = slots + [None] * (size - len(slots))
        return run

    def kv_split(self, kv: PageRun, at: int) -> tuple[PageRun, PageRun]:
        return self.pool.split(kv, at)

    def kv_join(self, first: PageRun, second: PageRun) -> PageRun:
        joined, copy = self.pool.join(first, second)
        if copy is not None:
            target, source = self.content[copy.target], self.content[copy.source]
            target[copy.first : copy.last] = source[copy.first : copy.last]
        return joined

    def release(self, kv: Any, state: Any) -> None:
        if kv is not None:
            self.pool.release(kv)
        if state is not None:
            self.states -= 1

    def track(self, states: dict[int, Any]) -> dict[int, Any]:
        """Count handles the caller is about to give `commit` (the cache owns them)."""
        self.states += len(states)
        return states

    def tokens(self, run: PageRun) -> list[int | None]:
        """The token ids `run` holds, read back from its pages."""
        size = self.pool.page_size
        first = run.start // size
        return [self.content[run.pages[p // size - first]][p % size]
                for p in range(run.start, run.stop)]
