"""The DataFrame `marconi.api.compare` returns: one row per system, printed as the figures a
reader compares (`FIRST_COLUMNS`). It imports pandas; `marconi.api` imports it only when it
makes one."""

from __future__ import annotations

from typing import Any

import pandas as pd

# the columns `compare` puts first, and what `print(compare(...))` shows
FIRST_COLUMNS = ("system", "token_hit_rate", "flops_saved_rate", "request_hit_rate",
                 "alpha", "refused_commits", "ttft_p50")

_Frame: Any = pd.DataFrame


class Comparison(_Frame):
    """A DataFrame whose printout is the figures a reader compares (a plain DataFrame of
    34 columns prints as `[2 rows x 34 columns]` and little else); every column stays."""

    @property
    def _constructor(self) -> type:
        return Comparison

    def __repr__(self) -> str:
        shown = [c for c in FIRST_COLUMNS if c in self.columns]
        rest = len(self.columns) - len(shown)
        return (pd.DataFrame(self[shown]).to_string(index=False)
                + f"\n({len(self)} rows; {rest} more columns in .columns)")
