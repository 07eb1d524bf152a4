"""Trace loading: parse rate per format, the big agent trace's first and second (cached)
load, and `marconi simulate` end to end against merely parsing the file with `json`.

    .venv/bin/python benchmarks/bench_load.py [--baseline REV] [--repeats 3] [--mb 32]

Every figure comes from a fresh process. Parse rates are MB of file over the process's
CPU seconds (what the machine's other work disturbs least) and over wall seconds. The
formats' files are generated here (`--mb` MB each, seeded), but for ShareGPT's packaged
file and the mini-swe-agent trajectories of the shared data folder. The agent trace is
the artifact JSONL of those trajectories (3,562 calls, 52.5M input tokens), written
into a temporary folder; without the data folder, its sections are skipped.
`--baseline REV` measures the same things at a git revision (a temporary worktree, its
`src` first on PYTHONPATH) in the same run, so before and after share the machine's load.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from common import REPO, TRAJS, worktree, write_agent_trace

_VOCAB = ("the of and to in is for that with on as it be this are by an or from at def "
          "return import self value error file line test data x = ( ) { } [ ] ; : \" \\n "
          "é 日本")
WORDS = _VOCAB.split(" ")

# The parse stage of each format: file -> records (no tokenizer; the artifact reader's
# records are its token arrays, so it is the whole reader).
PARSE = {
    "artifact": "from marconi.workload.readers import artifact as m\n#\n"
                "n = len(m.read(P, TraceOptions()).arrays.turns)",
    "mooncake": "from marconi.workload.io import gc_paused\n"
                "from marconi.workload.readers import mooncake as m\n#\n"
                "with gc_paused():  # as the reader calls it\n    n = len(m._parse(P))",
    "sharegpt": "from marconi.workload.readers import sharegpt as m\n#\n"
                "n = sum(1 for _ in m.conversations(P))",
    "lmsys": "from marconi.workload.readers import lmsys as m\n#\n"
             "n = sum(1 for _ in m.conversations(Path(P)))",
    "openai": "from marconi.workload.readers import openai_log as m\n#\n"
              "n = len(m.parse(Path(P), TraceOptions()))",
    "swe-agent": "from marconi.workload.readers import sweagent as m\n#\n"
                 "n = sum(1 for _ in m.conversations(P))",
}
# `#` marks where the clock starts: after the imports, which are not parsing
CHILD = """
import json, resource, sys, time
from pathlib import Path
from marconi.workload.options import TraceOptions
P = sys.argv[1]
{body}
print(json.dumps({{"wall": time.perf_counter() - t0, "cpu": time.process_time() - c0,
                  "n": n, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}}))
"""
START = "t0, c0 = time.perf_counter(), time.process_time()"
LOAD = """
from marconi.workload.registry import load_trace
#
trace = load_trace(P, format=sys.argv[2], options=TraceOptions(sessions=None,
                   cache_dir=sys.argv[3]))
n = len(trace)
"""


def child(body: str, *args: str, src: Path) -> dict[str, Any]:
    """Run `body` in a fresh process, its clock started at its `#` line."""
    code = CHILD.format(body=body.replace("\n#\n", f"\n{START}\n"))
    env = {**os.environ, "PYTHONPATH": str(src)}
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                         env=env, check=True).stdout
    return dict(json.loads(out.strip().splitlines()[-1]))


def wall(cmd: list[str], src: Path, cache: str) -> tuple[float, float]:
    """Wall and CPU seconds (children's user + system) of one whole process."""
    env = {**os.environ, "PYTHONPATH": str(src), "MARCONI_CACHE_DIR": cache}
    before = os.times()
    start = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    seconds = time.perf_counter() - start
    after = os.times()
    return seconds, (after.children_user - before.children_user
                     + after.children_system - before.children_system)


def median3(cmd: list[str], src: Path, cache: str, repeats: int) -> tuple[float, float]:
    runs = [wall(cmd, src, cache) for _ in range(repeats)]
    return statistics.median(w for w, _ in runs), statistics.median(c for _, c in runs)


# --- generated inputs --------------------------------------------------------------------

def _text(rng: np.random.Generator, n: int) -> str:
    return " ".join(WORDS[i] for i in rng.integers(0, len(WORDS), n))


def _fill(path: Path, mb: int, line: Any) -> Path:
    """Write `line(i)` (a JSON-able object, or text) until the file holds `mb` MB."""
    with path.open("w") as f:
        i = 0
        while f.tell() < mb * 1_000_000:
            item = line(i)
            f.write(item if isinstance(item, str) else json.dumps(item) + "\n")
            i += 1
    return path


def make_inputs(root: Path, mb: int) -> dict[str, Path]:
    rng = np.random.default_rng(0)
    out: dict[str, Path] = {}

    def ids(n: int) -> list[int]:
        return rng.integers(0, 32000, n).tolist()

    out["artifact"] = _fill(root / "artifact.jsonl", mb, lambda i: {
        "session_id": f"s{i // 20}", "turn_id": i % 20, "ts": i * 0.5,
        "input_tokens": ids(int(rng.integers(1000, 30000))), "output_tokens": ids(200)})
    out["mooncake"] = _fill(root / "mooncake.jsonl", mb, lambda i: {
        "timestamp": i * 100, "input_length": 8000, "output_length": 300,
        "hash_ids": rng.integers(0, 50000, 16).tolist()})

    def chat(turns: int) -> list[tuple[str, str]]:
        return [(("user", "assistant")[k % 2], _text(rng, int(rng.integers(20, 400))))
                for k in range(2 * turns)]

    out["lmsys"] = _fill(root / "lmsys.jsonl", mb, lambda i: {
        "conversation_id": f"c{i}", "conversation": [
            {"role": r, "content": t} for r, t in chat(int(rng.integers(1, 12)))]})
    out["openai"] = _fill(root / "openai.jsonl", mb, lambda i: {
        "messages": [{"role": r, "content": t} for r, t in chat(int(rng.integers(1, 6)))][:-1],
        "timestamp": 1_700_000_000 + i, "user": f"u{i % 50}"})
    gpt = {"user": "human", "assistant": "gpt"}
    whole = root / "sharegpt-whole.json"
    _fill(whole, mb, lambda i: ("[\n" if i == 0 else ",\n") + json.dumps(
        {"id": f"g{i}", "conversations": [{"from": gpt[r], "value": t}
                                          for r, t in chat(int(rng.integers(1, 12)))]},
        indent=2))
    with whole.open("a") as f:
        f.write("\n]\n")
    out["sharegpt (whole file)"] = whole
    return out


JSON_LINES = ("import json, sys\nwith open(sys.argv[1], 'rb') as f:\n"
              "    for line in f:\n        json.loads(line)")
JSON_ARRAY = ("import json, sys\nt = open(sys.argv[1], encoding='utf-8').read()\n"
              "d, pos = json.JSONDecoder(), t.index('[') + 1\n"
              "while True:  # every whole object of the (possibly cut) array\n"
              "    while pos < len(t) and t[pos] in ' \\t\\r\\n,':\n        pos += 1\n"
              "    try:\n        _, pos = d.raw_decode(t, pos)\n"
              "    except ValueError:\n        break")


# --- sections ----------------------------------------------------------------------------

def parse_rates(inputs: dict[str, Path], trees: dict[str, Path]) -> None:
    print("\n## Parse rate per format (file -> records; no tokenizer), MB/s of file")
    print(f"{'format':24} {'MB':>6}  " + "  ".join(f"{name + ' cpu':>13} {'wall':>6}"
                                                   for name in trees))
    for label, path in inputs.items():
        fmt = label.split(" ")[0]
        size = (sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
                if path.is_dir() else path.stat().st_size) / 1e6
        cells = []
        for src in trees.values():
            r = child(PARSE[fmt], str(path), src=src)
            cells.append(f"{size / r['cpu']:13.0f} {size / r['wall']:6.0f}")
        print(f"{label:24} {size:6.1f}  " + "  ".join(cells), flush=True)


def agent_loads(path: Path, trees: dict[str, Path], root: Path) -> None:
    size = path.stat().st_size / 1e6
    print(f"\n## The agent trace: {size:.0f} MB artifact JSONL, load_trace in a fresh process")
    print(f"{'tree':10} {'load':8} {'wall s':>7} {'cpu s':>6} {'MB/s cpu':>9} {'peak RSS MB':>12}")
    for name, src in trees.items():
        cache = str(root / f"cache-load-{name}")
        for which in ("first", "second"):
            r = child(LOAD, str(path), "artifact", cache, src=src)
            print(f"{name:10} {which:8} {r['wall']:7.2f} {r['cpu']:6.2f} "
                  f"{size / r['cpu']:9.0f} {r['rss_mb']:12.0f}", flush=True)


def end_to_end(label: str, trace: str, reference: list[str], trees: dict[str, Path],
               root: Path, repeats: int, systems: tuple[str, ...]) -> None:
    print(f"\n## End to end, {label}: whole process, median of {repeats} (warm trace cache; "
          "'first' = one run with an empty cache)")
    ref_wall, ref_cpu = median3(reference, REPO / "src", "", repeats)
    print(f"{'json parse of the file':34} wall {ref_wall:6.2f} s  cpu {ref_cpu:6.2f} s")
    for name, src in trees.items():
        for system in systems:
            cmd = [sys.executable, "-m", "marconi", "simulate", trace, "--system", system,
                   "--quiet", "--json"]
            cache = str(root / f"cache-e2e-{name}-{system}")
            first_wall, first_cpu = wall(cmd, src, cache)
            w, c = median3(cmd, src, cache, repeats)
            print(f"{name + ' ' + system:34} wall {w:6.2f} s  cpu {c:6.2f} s  "
                  f"= {w / ref_wall:4.1f}x wall, {c / ref_cpu:4.1f}x cpu  "
                  f"(first: {first_wall:.2f} s wall, {first_cpu:.2f} s cpu)", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", help="a git revision to measure beside the work tree")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--mb", type=int, default=32, help="size of each generated file")
    parser.add_argument("--skip", default="", help="comma-separated: parse,agent,e2e")
    args = parser.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    print(f"# {os.cpu_count()} cores, Python {sys.version.split()[0]}, numpy {np.__version__};"
          f" load average {' '.join(f'{x:.1f}' for x in os.getloadavg())} at the start")
    with tempfile.TemporaryDirectory() as tmp, worktree(args.baseline) as old:
        root = Path(tmp)
        trees = {"now": REPO / "src"}
        if old is not None:
            trees = {"baseline": old, **trees}
        from marconi.workload.readers.sharegpt import default_path

        if "parse" not in skip:
            inputs = make_inputs(root, args.mb)
            inputs["sharegpt (packaged, cut)"] = default_path()
            if TRAJS.is_dir():
                inputs["swe-agent (99 trajs)"] = TRAJS
            parse_rates(inputs, trees)
        if "e2e" not in skip:
            end_to_end("ShareGPT (packaged file, first 100 sessions)", "sharegpt",
                       [sys.executable, "-c", JSON_ARRAY, str(default_path())], trees, root,
                       args.repeats, ("sglang+", "marconi+"))
        if not TRAJS.is_dir():
            print(f"\n(the agent trace needs {TRAJS}: skipped)")
        else:
            agent = root / "agent.jsonl"
            write_agent_trace(agent, REPO / "src")
            if "agent" not in skip:
                agent_loads(agent, trees, root)
            if "e2e" not in skip:
                end_to_end("the agent trace", str(agent),
                           [sys.executable, "-c", JSON_LINES, str(agent)], trees, root,
                           args.repeats, ("sglang+",))
    print(f"\n# load average {' '.join(f'{x:.1f}' for x in os.getloadavg())} at the end")


if __name__ == "__main__":
    main()
