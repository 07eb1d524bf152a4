"""Progress of a long run: a bar on a terminal, plain lines in a log file.

tqdm redraws its bar with carriage returns, which a log file keeps as one long line of
frames; when the stream is not a terminal, `Progress` writes a line at most every
`every` seconds (and at the end) instead.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

from tqdm import tqdm


class Progress:
    """Counts finished items out of `total`; `write` prints a message above the bar."""

    def __init__(self, total: int, desc: str, *, enabled: bool = True,
                 stream: TextIO | None = None, every: float = 10.0) -> None:
        self.total, self.desc, self.done, self.failed = total, desc, 0, 0
        self.stream = stream or sys.stderr
        self.enabled, self.every = enabled, every
        self.start = self.last = time.monotonic()
        terminal = enabled and self.stream.isatty()
        self.bar = tqdm(total=total, desc=desc, unit="cell", file=self.stream) \
            if terminal else None

    def update(self, failed: bool = False) -> None:
        self.done += 1
        self.failed += failed
        if self.bar is not None:
            self.bar.update(1)
        elif self.enabled and (time.monotonic() - self.last >= self.every
                               or self.done == self.total):
            self.last = time.monotonic()
            self._line()

    def _line(self) -> None:
        failed = f", {self.failed} failed" if self.failed else ""
        elapsed = time.monotonic() - self.start
        print(f"{self.desc}: {self.done}/{self.total} done{failed}, {elapsed:.0f} s",
              file=self.stream, flush=True)

    def write(self, message: str) -> None:
        """A message that does not break the bar (always shown)."""
        if self.bar is not None:
            self.bar.write(message, file=self.stream)
        else:
            print(message, file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
