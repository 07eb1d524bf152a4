"""The simulator from Python (notebooks): one call per replay, results as DataFrames.

```python
import marconi.api as mc
result = mc.simulate("synthetic:multi-turn", system="marconi", capacity="2GB", sessions=20)
result.summary["token_hit_rate"]     # the JSON of `marconi simulate`
result.figures.token_hit_rate        # the same figures, typed (`marconi.sim.summary`)
result.to_pandas()                   # one row per request (needs pandas)
mc.compare("synthetic:agent", ["sglang+", "marconi"], capacity="1GB")   # one row per system
```
Every run setting is a keyword of its name: trace settings (`sessions=`, `sps=`,
`tokenizer=`, ...) and replay settings (`bounds=`, `multiplier=`, `page_size=`, ...).
A system registered from user code (`@marconi.systems.system(...)`, see
docs/architecture.md) is usable here by name at once.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from marconi.core.spec import ModelSpec
from marconi.settings import DEFAULT
from marconi.sim.config import SETTINGS, configure, split, unknown
from marconi.sim.result import SimResult, ttft_seconds
from marconi.sim.run import run
from marconi.sim.summary import Summary
from marconi.workload import Trace, TraceOptions, load_trace

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["Result", "compare", "load", "simulate", "write_records"]


@dataclass(frozen=True, slots=True)
class Result:
    """One replay: its summary and its per-request records."""

    result: SimResult  # everything the replay returned

    @property
    def summary(self) -> dict[str, Any]:
        """The JSON of `marconi simulate --json` (docs/architecture.md, "Metrics")."""
        return self.result.summary().to_json()

    @property
    def figures(self) -> Summary:
        """The same summary, typed: one attribute per figure."""
        return self.result.summary()

    def records(self) -> dict[str, np.ndarray]:
        """One column per field, one row per request (what `--records` writes)."""
        return record_columns(self.result)

    def to_pandas(self) -> pd.DataFrame:
        """The records as a DataFrame (needs pandas)."""
        return _pandas().DataFrame(self.records())


def load(trace: str | Path | Trace, *, format: str | None = None, **options: Any) -> Trace:
    """A trace from a path or name (`load_trace`), with `TraceOptions` fields as keywords."""
    if isinstance(trace, Trace):
        return trace
    return load_trace(trace, format=format, options=TraceOptions(**options))


def simulate(trace: str | Path | Trace, *, system: str = DEFAULT.system,
             capacity: str | int = DEFAULT.capacity, model: str | ModelSpec = DEFAULT.model,
             alpha: float | None = DEFAULT.alpha,
             format: str | None = None, **settings: Any) -> Result:
    """Replay `trace` through one system (`--system`), as `marconi simulate` does. Every
    run setting is a keyword of its name (docs/architecture.md, "Settings"): trace
    settings (`sessions=`, `sps=`, ...) shape the trace, replay settings (`bounds=`,
    `multiplier=`, ...) the replay; `params`, `use_cache` and `cache_dir` are passed to
    the load."""
    trace_settings, replay, rest = split(settings)
    unknown(rest, [*SETTINGS, *LOADING], "keyword")
    config = configure(model=model, capacity=capacity, system=system, alpha=alpha, **replay)
    return Result(run(load(trace, format=format, **trace_settings, **rest), config))


def compare(trace: str | Path | Trace, systems: Sequence[str], **kwargs: Any) -> pd.DataFrame:
    """`simulate` once per system over one load of the trace: one summary row each."""
    trace_settings, replay, rest = split(kwargs)
    loading = {k: rest.pop(k) for k in [*rest] if k in LOADING}
    loaded = load(trace, format=rest.pop("format", None), **trace_settings, **loading)
    rows = [simulate(loaded, system=name, **replay, **rest).summary for name in systems]
    frame = _pandas().DataFrame([_flat(row) for row in rows])
    from marconi.report.comparison import FIRST_COLUMNS, Comparison  # (imports pandas)

    first = [c for c in FIRST_COLUMNS if c in frame.columns]  # what a reader looks for
    return Comparison(frame[first + [c for c in frame.columns if c not in first]])


def _flat(summary: dict[str, Any]) -> dict[str, Any]:
    """A summary's scalar fields (alpha None, NaN in the frame, for a system without one)."""
    return {k: v for k, v in summary.items() if not isinstance(v, dict | list)}


LOADING = ("params", "use_cache", "cache_dir")  # what `load` takes beside trace settings


def record_columns(result: SimResult) -> dict[str, Any]:
    columns: dict[str, Any] = {"session": np.array(result.sessions, dtype=object),
                               "arrival": result.arrivals}
    return columns | result.records.columns() | {"ttft_s": ttft_seconds(result)}


def write_records(result: SimResult, path: Path) -> None:
    """Per-request records as CSV (a real CSV writer: any session id survives) or Parquet."""
    columns = record_columns(result)
    if path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({k: v.tolist() for k, v in columns.items()}), path)
        return
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(columns)
        writer.writerows(zip(*(_cells(v) for v in columns.values()), strict=True))


def _cells(column: np.ndarray) -> list[Any]:
    if column.dtype.kind == "f":
        return [repr(float(x)) for x in column]
    return column.tolist()


def _pandas() -> Any:
    try:
        import pandas
    except ImportError:
        raise ValueError("DataFrames need pandas: pip install 'marconi[api]'") from None
    return pandas
