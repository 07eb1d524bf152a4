"""`marconi engine-bench`: TTFT of a real hybrid model, cold vs cached.

Runs three workloads (a multi-turn conversation, requests sharing a system prompt, an
agent trajectory) through the reference engine under each system, and prints hit tokens,
TTFT percentiles, bytes held, the summed TTFT against vanilla's on the same requests and
the cache's own overhead as a share of it (lookup, restore, the split prefill's extra
time, snapshots), then each part in ms. `--profile` writes a latency profile CSV
(`tokens_to_prefill, cached_tokens, seconds`) that `marconi simulate --latency-profile`
loads. Progress goes to stderr, a line as each step starts.
"""

from __future__ import annotations

import argparse
import platform
import sys
from pathlib import Path
from typing import Any

from marconi.commands.extras import require

SYSTEMS = ("vanilla", "vllm+", "sglang+", "marconi")  # default --systems


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the `engine-bench` command to a `marconi` argparse subparser set."""
    parser = subparsers.add_parser(
        "engine-bench", help="TTFT cold vs cached on a real (tiny or local) hybrid model",
        description=__doc__)
    parser.add_argument("--model", default="bamba",
                        help="a registered architecture (tiny random weights) or a local "
                             "checkpoint folder (config.json + safetensors)")
    parser.add_argument("--systems", default=",".join(SYSTEMS),
                        help="comma-separated systems (vanilla = no cache)")
    parser.add_argument("--capacity", default="1GB", help="cache capacity (2GB, 2GiB, bytes)")
    parser.add_argument("--agent-data", type=Path, default=None,
                        help="a mini-swe-agent folder (trajectories) for the agent workload; "
                             "without it that workload is skipped")
    parser.add_argument("--no-chunk", action="store_true",
                        help="skip the chunk-boundary capture rows")
    parser.add_argument("--profile", type=Path, default=Path("engine_latency_profile.csv"),
                        help="where to write the TTFT profile CSV for the simulator")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=INT",
                        help="override a tiny model's config field (e.g. hidden_size=256)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--repeat", type=int, default=3,
                        help="run the whole bench this many times, the systems interleaved; "
                             "the table gives each change against vanilla as the median "
                             "and its range (one run on a busy machine can mislead)")
    parser.set_defaults(func=run_command)
    return parser


def run_command(args: argparse.Namespace) -> int:
    require("engine", "torch", "transformers")
    import torch

    from marconi.engines.hf.bench import bench, format_table
    from marconi.engines.hf.models import ARCHITECTURES, load_model, tiny_model

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.model in ARCHITECTURES:
        model = tiny_model(args.model, **_overrides(args.set))
    else:
        model = load_model(args.model)
    if args.agent_data is not None and not args.agent_data.is_dir():
        raise ValueError(f"--agent-data {args.agent_data}: no such folder")
    agent_dir = args.agent_data
    rows = bench(model, agent_dir, [s.strip() for s in args.systems.split(",")],
                 args.capacity, not args.no_chunk, args.profile, args.repeat,
                 say=lambda line: print(line, file=sys.stderr, flush=True))
    print(f"# engine-bench: model={args.model} ({model.spec.name}), capacity={args.capacity}, "
          f"torch threads={torch.get_num_threads()}, {platform.processor() or platform.machine()}"
          f", {args.repeat} run{'s' * (args.repeat != 1)} of each")
    if agent_dir is None:
        print("# agent workload skipped: no --agent-data folder given")
    print(format_table(rows))
    print("# ttft in ms; vs_vanilla: summed TTFT against vanilla's on the same requests (the "
          "median over the runs; vs_range: lowest..highest); "
          "overhead: the cache's share of it (lookup, restore, split prefill, snapshots); "
          f"the last five columns in ms summed over the run; profile written to {args.profile}")
    return 0


def _overrides(pairs: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not value.strip().lstrip("-").isdigit():
            raise ValueError(f"--set expects FIELD=INTEGER, got {pair!r}")
        out[key.strip()] = int(value)
    return out


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry point (benchmarks/bench_engine.py)."""
    parser = argparse.ArgumentParser(prog="marconi")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["engine-bench", *(argv or [])])
    return int(args.func(args))
