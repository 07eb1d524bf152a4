"""What the research scripts of experiments/ share: where the data and the reproduction
sweep are, the named traces they replay, FLOPs saved by one run, the sweep's
configurations as cells, and the variants' plugin.

Each script runs alone (`python experiments/X.py`): its own folder is first on sys.path,
so `from common import ...` finds this module. The only script another one loads is the
plugin of marconi+'s variants, `bench_plus_variants`, by the plugin mechanism
(`load_variants`), so that its systems work by name, in sweep workers too.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import os
import sys
import tempfile
from collections.abc import Callable
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

from marconi.core.spec import PAPER_7B, resolve_model
from marconi.sim.replay import simulate
from marconi.sim.result import SimConfig
from marconi.sim.run import run
from marconi.sim.sweep import Cell
from marconi.systems import System, load_plugin
from marconi.workload import load_trace
from marconi.workload.options import TraceOptions
from marconi.workload.types import Trace

HERE = Path(__file__).resolve().parent
DATA = HERE.parents[1] / "shared" / "data"  # the shared data folder beside the repository
TRAJS = DATA / "mini-swe-agent" / "trajs"
MOONCAKE = DATA / "mooncake" / "conversation_trace.jsonl"
MOONCAKE_SYNTHETIC = DATA / "mooncake" / "synthetic_trace.jsonl"  # no design looked at it
SWEEP = HERE / "results" / "sweep.csv"  # `marconi reproduce --out experiments/results`
PEERS = ("sglang+", "sglang-2026", "vllm-2026", "marconi")
VARIANTS = "bench_plus_variants"  # the plugin registering marconi+'s variants


def load_variants() -> ModuleType:
    """Register marconi+'s variants (`bench_plus_variants.py`) as systems, once."""
    return load_plugin(VARIANTS)


def grid_parser(doc: str | None) -> argparse.ArgumentParser:
    """The options of a script over a grid of traces and capacities: `--quick` (its small
    grid), `--plot PNG` and `--workers N`."""
    parser = argparse.ArgumentParser(description=(doc or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--plot", default=None, help="also draw the table (a PNG path)")
    parser.add_argument("--workers", type=int, default=2)
    return parser


def save_figure(fig: Any, path: Path) -> None:
    """Lay out `fig`, write it to `path` (its folder made) and say where on stderr."""
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    print(f"plot written to {path}", file=sys.stderr)


# --- traces by name ------------------------------------------------------------------

def available(grid: tuple[tuple[str, tuple[str, ...]], ...]) -> list[tuple[str, tuple[str, ...]]]:
    """The (trace, capacities) of `grid` whose data is here; each one skipped is said."""
    kept = []
    for name, capacities in grid:
        needs = TRAJS if "swe-agent" in name else MOONCAKE if name.startswith("mooncake") \
            else None
        if needs is not None and not needs.exists():
            print(f"{name}: skipped, {needs} not present", file=sys.stderr)
            continue
        kept.append((name, capacities))
    return kept


@cache
def trace(name: str) -> Trace:
    """`sharegpt` (>= 10 rounds), `sharegpt(turns=T,seed=S)`, `swe-agent`,
    `swe-agent(seed=S)`, `mooncake[A:B]`, or `shift:sharegpt+swe-agent` (the chats, then
    the trajectories: a workload that shifts midway)."""
    if name.endswith(")"):
        kind, args = name[:-1].split("(")
        opts = {k: int(v) for k, v in (a.split("=") for a in args.split(","))}
        if kind == "sharegpt":
            return load_trace("sharegpt", options=TraceOptions(
                min_turns=opts["turns"], seed=opts["seed"]))
        return load_trace(TRAJS, options=TraceOptions(seed=opts["seed"], sessions=None))
    if name == "sharegpt":
        return load_trace("sharegpt", options=TraceOptions(min_turns=10))
    if name == "swe-agent":
        return load_trace(TRAJS)
    if name.startswith("mooncake"):
        a, b = (int(x) for x in name[9:-1].split(":"))
        full = load_trace(MOONCAKE)
        return Trace(name, full.requests[a:b], full.meta)
    chat, agent = trace("sharegpt"), trace("swe-agent")
    end = chat[-1].arrival
    moved = tuple(dataclasses.replace(r, arrival=end + r.arrival, session_id="swe/" + r.session_id)
                  for r in agent)
    return Trace(name, chat.requests + moved, {})


def saved(job: tuple[str, ...], concurrent: bool = False, replay: str = "sequential") -> float:
    """FLOPs saved for (trace, capacity, system[, model]): sequential with marconi's tuner
    tuning once (what every recorded table used), or `replay="serving"` with the shipped
    defaults (marconi re-tuning)."""
    name, capacity, system, *model = job
    spec = resolve_model(model[0]) if model else PAPER_7B
    pinned = {"replay": "sequential", "retune": False} if replay == "sequential" else {}
    config = SimConfig(spec=spec, capacity=capacity, system=system, bounds=False,
                       concurrent=concurrent, **pinned)  # type: ignore[arg-type]
    return float(run(trace(name), config, warn=False).summary().flops_saved_rate)


def served(job: tuple[str, ...]) -> float:
    """`saved` under the serving replay (a process pool's picklable function)."""
    return saved(job, replay="serving")


# --- traces built like the sweep's from data the design did not use --------------------

# (trace key | capacity [| model]); the design set reproduces the losses seen on unseen
# data and chose variants, the held-out set was fixed before any variant was tried
DESIGN = ("sg(sps=5,skip=100)|1GB", "sg(sps=5,skip=100)|2GB", "sg(sps=5)|1GB",
          "sg(sps=5)|2GB", "swe(half=even)|20GB", "swe(half=even)|40GB", "swe()|20GB",
          "swe()|40GB", "swe()|40GB|paper-7b,ssm=24,attn=12,mlp=36")
HELDOUT = ("sg(sps=0.5,skip=200)|2GB", "sg(sps=2,skip=200)|1GB", "sg(sps=5,skip=200)|2GB",
           "sg(sps=1,skip=300)|3GB", "sg(sps=5,skip=300)|1GB", "swe(half=odd,seed=21)|20GB",
           "swe(half=odd,seed=22)|40GB", "swe(seed=23,gap=2.5)|30GB",
           "mc(a=11000,b=12031)|60GB", "mc(a=7500,b=9500)|40GB")
# written down on 2026-12-02 before any of it was run, and run once: ShareGPT's sessions
# 401-500 with >= 10 rounds (the design and held-out sets took 1-400), agent arrival seeds
# and gaps no set drew, and the synthetic Mooncake trace, which no script had replayed
# (3,348 requests once the 645 longer than paper-7b's 32K context are dropped)
FRESH = ("sg(sps=5,skip=400)|1GB", "sg(sps=2,skip=400)|2GB", "sg(sps=1,skip=400)|3GB",
         "sg(sps=3,skip=400)|2GB", "swe(half=even,seed=31)|30GB", "swe(half=odd,seed=32)|20GB",
         "swe(seed=33)|40GB|paper-7b,ssm=24,attn=12,mlp=36", "swe(seed=34,gap=7.5)|50GB",
         "mcs(a=0,b=2000)|40GB", "mcs(a=2000,b=3348)|80GB")


def _half(which: str) -> Path:
    """A folder of links to every other trajectory (`even`: the 1st, 3rd, ...)."""
    names = sorted(os.listdir(TRAJS))[0 if which == "even" else 1::2]
    folder = Path(tempfile.mkdtemp(prefix=f"trajs-{which}-"))
    for name in names:
        (folder / name).mkdir()
        for f in (TRAJS / name).iterdir():
            (folder / name / f.name).symlink_to(f)
    return folder


def _skip(trace: Trace, skip: int, sps: float) -> Trace:
    """`trace` without its first `skip` sessions, arrivals moved back by skip / sps."""
    order = list(dict.fromkeys(r.session_id for r in trace.requests))
    keep = set(order[skip:])
    requests = tuple(dataclasses.replace(r, arrival=r.arrival - skip / sps)
                     for r in trace.requests if r.session_id in keep)
    return Trace(trace.name, requests, trace.meta)


@cache
def unseen_trace(key: str) -> Trace:
    """`sg(sps=R,skip=K)`, `swe(half=even|odd,seed=S,gap=G)`, `mc(a=A,b=B)` or `mcs(a=A,b=B)`
    (bench_plus_unseen.py says what each holds)."""
    kind, _, rest = key.partition("(")
    opts = dict(a.split("=") for a in rest.rstrip(")").split(",") if a)
    if kind == "sg":
        sps, skip = float(opts.get("sps", 1)), int(opts.get("skip", 0))
        loaded = load_trace("sharegpt", options=TraceOptions(
            min_turns=10, sessions=100 + skip, sps=sps))
        return _skip(loaded, skip, sps) if skip else loaded
    if kind == "swe":
        source = _half(opts["half"]) if "half" in opts else TRAJS
        return load_trace(source, format="swe-agent", options=TraceOptions(
            seed=int(opts.get("seed", 0)), sessions=None,
            mean_gap=float(opts.get("gap", 5.0))))
    if kind in ("mc", "mcs"):
        full = load_trace(MOONCAKE if kind == "mc" else MOONCAKE_SYNTHETIC)
        return Trace(key, full.requests[int(opts["a"]):int(opts["b"])], full.meta)
    raise ValueError(f"unknown trace key {key!r}")


# a hybrid of policy parts built for one trace: its system and a hook called with each
# request's index before it is served (None: no hook)
Hybrid = Callable[[Trace], tuple[System, Callable[[int], None] | None]]


def unseen_saved(config: str, system: str, hybrid: Hybrid | None = None) -> float:
    """FLOPs saved on `config` (`KEY|CAPACITY[|MODEL]`, paper-7b unless named, bounds off)
    by the registered `system`, or by `hybrid`'s system built for the trace."""
    key, capacity, *model = config.split("|")
    trace = unseen_trace(key)
    sim = SimConfig(replay="sequential", retune=False,
                    spec=resolve_model(model[0] if model else "paper-7b"), capacity=capacity,
                    system="sglang+" if hybrid else system, bounds=False)
    if hybrid is None:
        return float(run(trace, sim).summary().flops_saved_rate)
    built, before = hybrid(trace)
    return float(simulate(trace, sim, system=built, before=before).summary().flops_saved_rate)


# --- the reproduction sweep's marconi+ configurations ----------------------------------

KEYS = ("dataset", "trace", "capacity", "model", "sessions", "max_requests", "sps",
        "response_time", "mean_gap", "seed")


def configurations() -> list[tuple[dict[str, str], float]]:
    """(cell parameters, best peer's FLOPs saved) of each plus_vs_peers configuration
    recorded in `SWEEP`."""
    by: dict[tuple[str, ...], dict[str, float]] = {}
    params: dict[tuple[str, ...], dict[str, str]] = {}
    with SWEEP.open(newline="") as f:
        for row in csv.DictReader(f):
            if row["alpha_fixed"] or row["multiplier"] != "5" or row["objective"] != "flops" \
                    or row["status"] != "ok":
                continue
            key = tuple(row[k] for k in KEYS)
            by.setdefault(key, {})[row["system"]] = float(row["flops_saved_rate"])
            params[key] = {k: row[k] for k in KEYS}
    return [(params[k], max(v[p] for p in PEERS)) for k, v in by.items()
            if "marconi+" in v and all(p in v for p in PEERS)]


def cell(p: dict[str, str], system: str) -> Cell:
    """The sweep cell of configuration `p` (a `configurations` entry) running `system`."""
    # the protocol (and tuner) every recorded row was written with
    return Cell.of(replay="sequential", retune=False,
                   dataset=p["dataset"], trace=p["trace"], system=system, capacity=p["capacity"],
                   model=p["model"], sessions=int(p["sessions"]) if p["sessions"] else None,
                   max_requests=int(p["max_requests"]) if p["max_requests"] else None,
                   sps=float(p["sps"]), response_time=float(p["response_time"]),
                   mean_gap=float(p["mean_gap"]), seed=int(p["seed"]))


# --- bench_plus.py's configurations (bench_tuner.py --windows reads them too) -----------

# (set, trace, capacity, model); a set is unseen only by the design decisions taken
# before it ran (experiments/RESULTS.md, "Fresh configurations", says which)
PLUS_FRESH = [
    (1, "sharegpt(turns=5,seed=1)", "2GB", "paper-7b"),
    (1, "sharegpt(turns=5,seed=1)", "6GB", "paper-7b"),
    (1, "sharegpt(turns=20,seed=2)", "3GB", "paper-7b"),
    (1, "sharegpt(turns=10,seed=3)", "4GB", "paper-7b,ssm=28,attn=7,mlp=35"),
    (1, "swe-agent(seed=1)", "15GB", "paper-7b"),
    (1, "swe-agent(seed=2)", "30GB", "paper-7b,N=64"),
    (1, "swe-agent(seed=3)", "50GB", "paper-7b"),
    (1, "swe-agent(seed=1)", "40GB", "paper-7b,ssm=32,attn=4,mlp=36"),
    (1, "mooncake[2000:4000]", "40GB", "paper-7b"),
    (1, "mooncake[4000:6000]", "100GB", "paper-7b"),
    (1, "mooncake[8000:10000]", "30GB", "paper-7b"),
    (2, "sharegpt(turns=3,seed=4)", "1GB", "paper-7b"),
    (2, "sharegpt(turns=3,seed=4)", "8GB", "paper-7b"),
    (2, "sharegpt(turns=15,seed=5)", "2GB", "paper-7b"),
    (2, "sharegpt(turns=10,seed=6)", "4GB", "paper-7b,N=32"),
    (2, "swe-agent(seed=4)", "25GB", "paper-7b"),
    (2, "swe-agent(seed=5)", "60GB", "paper-7b,N=32"),
    (2, "swe-agent(seed=6)", "40GB", "paper-7b,ssm=28,attn=7,mlp=35"),
    (2, "mooncake[10000:12000]", "50GB", "paper-7b"),
    (2, "mooncake[1000:3000]", "120GB", "paper-7b"),
    (2, "mooncake[5000:7000]", "25GB", "paper-7b"),
    (3, "sharegpt(turns=4,seed=9)", "1GB", "paper-7b"),
    (3, "sharegpt(turns=12,seed=10)", "3GB", "paper-7b"),
    (3, "sharegpt(turns=6,seed=11)", "2GB", "paper-7b,ssm=32,attn=4,mlp=36"),
    (3, "swe-agent(seed=7)", "30GB", "paper-7b"),
    (3, "swe-agent(seed=8)", "40GB", "paper-7b,ssm=24,attn=12,mlp=36"),
    (3, "mooncake[3000:5000]", "60GB", "paper-7b"),
    (3, "mooncake[9000:11000]", "80GB", "paper-7b"),
]
# (trace, capacity): the configurations the design looked at (its main table)
PLUS_DESIGN = [("sharegpt", c) for c in ("1GB", "2GB", "3GB", "5GB")] + \
    [("swe-agent", c) for c in ("10GB", "20GB", "40GB")] + \
    [(f"mooncake[{a}:{a + 2000}]", c) for a in (0, 6000) for c in ("20GB", "60GB")] + \
    [("shift:sharegpt+swe-agent", c) for c in ("10GB", "20GB")]
