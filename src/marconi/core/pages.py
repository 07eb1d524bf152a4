"""`PagePool`: reference-counted KV pages, the bookkeeping a paged `StateStore` needs.

No tensors: a store pairs the pool with its own page tensors and writes or copies what the
pool tells it. The pool realizes the page sharing `marconi.core.layout.PageBooks` counts,
so pages in use times page bytes equal the cache's KV bytes (docs/embedding.md).

```
P = 4    positions | 4 5 6 7 | 8 9 . . |
PageRun(start=6, stop=10, pages=(7, 2)): slots 6, 7 of physical page 7, then 8, 9 of page 2
```
- `slice`: the pages of [start, stop) of the sequence a commit reads (`source`); pages the
  same commit already wrote (the previous slice ended where this one starts) are shared,
  the others are fresh and the store fills them from the source, whole (so a fresh first
  page also holds the parent's tokens before `start`: a copy).
- `split`: head and tail share the page at the cut.
- `join`: a node merged into its child; when both hold the page at the seam, the child's
  slots are copied into the node's page (which may be shared with the node's ancestors)
  and the child's copy is freed.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PageRun:
    """KV of positions [start, stop): `pages[i]` holds logical page `start // P + i`."""

    start: int
    stop: int
    pages: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class PageCopy:
    """Slots [first, last) of physical page `source` go to page `target` (a `join`)."""

    source: int
    target: int
    first: int
    last: int


class PagePool:
    """Physical pages, each with a reference count; `limit` pages at most (None: any)."""

    def __init__(self, page_size: int, limit: int | None = None) -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size!r}")
        self.page_size = page_size
        self.limit = limit
        self.refs: dict[int, int] = {}  # physical page -> references (runs holding it)
        self._free: list[int] = []
        self._next = 0  # pages ever created
        self._source: object = None  # the sequence the last slice read, and what it wrote:
        self._stop = -1  # where that slice ended
        self._written: dict[int, int] = {}  # logical page -> physical page

    @property
    def in_use(self) -> int:
        return len(self.refs)

    def slice(self, source: object, start: int, stop: int) -> tuple[PageRun, list[tuple[int, int]]]:
        """Pages for [start, stop) of `source`; returns the run and the (logical, physical)
        pages newly allocated, which the caller fills from the source. Holds a reference
        to `source` until the next slice of another one."""
        if not 0 <= start < stop:
            raise ValueError(f"page slice [{start}, {stop}) is empty or negative")
        if source is not self._source or start != self._stop:
            self._source, self._written = source, {}
        fresh, pages = [], []
        for logical in range(start // self.page_size, -(-stop // self.page_size)):
            page = self._written.get(logical)
            if page is None:
                page = self._written[logical] = self._allocate()
                fresh.append((logical, page))
            else:
                self.refs[page] += 1
            pages.append(page)
        self._stop = stop
        return PageRun(start, stop, tuple(pages)), fresh

    def split(self, run: PageRun, at: int) -> tuple[PageRun, PageRun]:
        """`run` cut after `at` tokens: (head, tail), sharing the page at the cut."""
        cut = run.start + at
        if not run.start < cut < run.stop:
            raise ValueError(f"split at {at} outside a run of {run.stop - run.start} tokens")
        first = run.start // self.page_size
        head_pages = run.pages[: -(-cut // self.page_size) - first]
        tail_pages = run.pages[cut // self.page_size - first :]
        if cut % self.page_size:
            self.refs[tail_pages[0]] += 1  # one more run holds the page at the cut
        return PageRun(run.start, cut, head_pages), PageRun(cut, run.stop, tail_pages)

    def join(self, first: PageRun, second: PageRun) -> tuple[PageRun, PageCopy | None]:
        """`first` followed by `second` as one run; consumes both. Returns the copy the
        caller must make (before the next `slice`) when each held its own seam page."""
        if first.stop != second.start:
            raise ValueError(f"join of runs ending at {first.stop} and starting at {second.start}")
        seam = first.stop % self.page_size
        if not seam:
            return PageRun(first.start, second.stop, first.pages + second.pages), None
        mine, theirs = first.pages[-1], second.pages[0]
        copy = None
        if mine != theirs:
            last = min(self.page_size, second.stop - first.stop + seam)
            copy = PageCopy(theirs, mine, seam, last)
        self._unref(theirs)
        return PageRun(first.start, second.stop, first.pages + second.pages[1:]), copy

    def release(self, run: PageRun) -> None:
        """Drop `run`'s references; pages no run holds go back to the free list."""
        for page in run.pages:
            self._unref(page)

    def _allocate(self) -> int:
        if self._free:
            page = self._free.pop()
        elif self.limit is None or self._next < self.limit:
            page, self._next = self._next, self._next + 1
        else:
            raise MemoryError(f"page pool exhausted: all {self.limit} pages in use")
        self.refs[page] = 1
        return page

    def _unref(self, page: int) -> None:
        self.refs[page] -= 1
        if not self.refs[page]:
            del self.refs[page]
            self._free.append(page)
