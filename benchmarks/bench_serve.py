"""Marconi served by a real vLLM server: stock against `+marconi` and `+marconi+`.

    .venv/bin/python benchmarks/bench_serve.py [--quick] [--traces sharegpt,swe-agent,mooncake]

Needs vLLM's environment with its server (`bash scripts/setup-peers.sh vllm`). Each trace
is fitted to the tiny served model (marconi.engines.real.serve_replay: every `stride`-th
token, outputs cut to 32 tokens) and replayed through the real `openai` client with
streaming against real server processes (`python -m vllm.entrypoints.openai.api_server`,
marconi.engines.real.vllm_server), one after another on this machine, in the order stock,
+marconi, +marconi+, prefix caching off (the exactness reference), stock again (`--repeat`:
the spread between two stock runs is the noise the ratios are read against). `--rounds N`
serves stock and each policy N times, interleaved (the reference once): the summary pools
every round's requests, and a noise line gives each server's TTFT p95, so that a policy's
p95 is read against stock's own spread rather than against one run. Every server
gets the same contended pool (`--num-gpu-blocks-override`) and the same flags, the CPU
build's mid-prefill checkpoint switched off in each (`MARCONI_VLLM_CPU_SPLIT=1`).

Prints per trace a table (requests, cached tokens, TTFT p50/p95, vLLM's own prefix-cache
counters and mean inter-token latency from /metrics, the plugin's alpha and its cost in
the scheduling loop from its log), then one line per policy over all traces:

    serve vllm-0.32+marconi vs vllm-0.32: 400 requests, cached tokens ratio 1.31, TTFT p50
    ratio 0.82, p95 ratio 0.77, outputs identical 400/400     (one line)

"outputs identical" counts the requests whose greedy output equals, token for token, the
no-caching server's (and stock's own count is printed beside it). `--out DIR` keeps each
server's log, a JSON of every request (`PLAN.json`: per server, each request's session,
when it was sent, its first token came and it finished, in seconds on the replay's clock,
its prompt and cached tokens as the server reported them, its prompt and output), and
each server's pool (`PLAN.pools.json`).

The block size and the pool are each server's own, read from its log (`kv lcm block sizes
N`, `Overriding num_gpu_blocks=N with num_gpu_blocks_override=N`;
marconi.engines.real.vllm_server.read_pool), never assumed: the table's header, the replay
through vLLM's cache classes and its pool in bytes use them, and a log without those lines
stops the bench naming the log. (vLLM 0.32's CPU build logs 128-token blocks for the tiny
model with prefix caching, 2048 without.)

`--predict 32,64,... --block-size N` starts no server: per plan and pool it prints what the
replay through vLLM's cache classes predicts for each policy against stock, cached tokens
and FLOPs saved, with each session's outputs stood in for (open loop): where a served run
could show marconi's order, found in minutes rather than hours. With no server to read it
from, the block size is given (`--block-size`, required; no default) and the output says so.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from common import load

from marconi.engines.integrations.common import declared_priorities
from marconi.engines.real.envs import available
from marconi.engines.real.serve_replay import Replayed, Scaled, percentile, replay, scaled
from marconi.engines.real.vllm_server import (
    FAMILIES,
    NAME,
    VOCAB,
    Pool,
    Server,
    ServerConfig,
    write_model,
)

STOCK = "vllm-0.32"


@dataclass(frozen=True)
class Plan:
    trace: str  # a name benchmarks/common.py loads
    stride: int  # every stride-th token
    requests: int  # the first N requests of the trace
    blocks: int  # the server's pool in its blocks (contended; the size it logs)
    max_model_len: int = 2048  # longer requests are dropped (counted)


    max_output: int = 32  # output tokens per request, at most
    span: float = 75.0  # seconds the requests' arrivals are spread over


# pools: the requests running at once (4) hold about half, the rest is the cache
FULL = (Plan("sharegpt(16)", 1, 150, 128), Plan("swe-agent", 8, 150, 192, 4096),
        Plan("mooncake[0:150]", 8, 150, 192, 4096))
QUICK = (Plan("sharegpt(12)", 1, 100, 96, span=60.0),)
POLICIES = ("stock", "marconi", "marconi+", "nocache")
FIXED = re.compile(r"marconi@(\d+(\.\d*)?)")  # marconi at a fixed alpha: marconi@2


def label(policy: str) -> str:
    fixed = FIXED.fullmatch(policy)
    return STOCK if policy == "stock" else f"{STOCK}[no prefix caching]" \
        if policy == "nocache" else f"{STOCK}+marconi[alpha={fixed.group(1)}]" if fixed \
        else f"{STOCK}+{policy}"


@dataclass
class Run:
    policy: str
    replayed: Replayed
    before: dict[str, float]
    after: dict[str, float]
    log: str
    pool: Pool  # as the server logged it

    def counter(self, name: str) -> float:
        return self.after.get(name, 0.0) - self.before.get(name, 0.0)

    @property
    def ok(self) -> list:
        return [s for s in self.replayed.served if s.error is None]

    @property
    def cached(self) -> int:
        return sum(s.cached_tokens for s in self.ok)

    def itl_ms(self) -> float:
        n = self.counter("vllm:inter_token_latency_seconds_count")
        return 1e3 * self.counter("vllm:inter_token_latency_seconds_sum") / n if n else 0.0

    def plugin(self) -> str:
        """The plugin's last cost line, its last alpha change and whether it said it was on."""
        on = "on" if "marconi: on in this process" in self.log else "-"
        cost = re.findall(r"in the scheduling loop (\d+) us/request", self.log)
        alphas = re.findall(r"marconi: alpha (\S+) adopted", self.log)
        gone = "tuner gone" if "tuner process" in self.log and "is gone" in self.log else ""
        return " ".join(x for x in (on, f"{cost[-1]} us/req" if cost else "",
                                    f"alpha {alphas[-1]}" if alphas else "", gone) if x)


def serve_one(policy: str, plan: Plan, trace: Scaled, model: Path, out: Path,
              progress: bool) -> Run:
    fixed = FIXED.fullmatch(policy)
    config = ServerConfig(model=model, policy="marconi" if fixed else policy,
                          blocks=plan.blocks, max_model_len=plan.max_model_len,
                          alpha=float(fixed.group(1)) if fixed else None)
    log_path, k = out / f"{plan.trace}-{policy}.log".replace("/", "_"), 1
    while log_path.exists():  # a later round's server: its own log
        k += 1
        log_path = out / f"{plan.trace}-{policy}#{k}.log".replace("/", "_")
    started = time.monotonic()
    with Server(config, log_path) as server:
        up = time.monotonic() - started
        pool = server.pool()  # logged before /health answers; a log without it stops here
        before = server.metrics()
        done = [0]

        def tick(_: object) -> None:
            done[0] += 1
            if progress and (done[0] % 50 == 0 or done[0] == len(trace.turns)):
                print(f"    {label(policy)}: {done[0]}/{len(trace.turns)} requests",
                      file=sys.stderr, flush=True)

        replayed = replay(server.url, NAME, trace, progress=tick)
        after = server.metrics()
    print(f"    {label(policy)}: started in {up:.0f} s, replayed in {replayed.seconds:.0f} s",
          file=sys.stderr, flush=True)
    return Run(policy, replayed, before, after, log_path.read_text(errors="replace"), pool)


def share(ours: float, stock: float) -> str:
    """`ours / stock`, or what stands for it when stock is 0 (no ratio to print)."""
    if stock:
        return f"{ours / stock:.2f}"
    return "n/a, neither hit" if not ours else "n/a, stock hit nothing"


def identical(a: Run, b: Run) -> int:
    """Requests whose outputs agree token for token (a failed one never does)."""
    theirs = {s.index: s.output for s in b.ok}
    return sum(1 for s in a.ok if theirs.get(s.index) == s.output)


def served_pool(runs: list[Run]) -> Pool:
    """The pool every caching server of a plan logged (stock's; they must agree)."""
    caching = {r.pool for r in runs if r.policy != "nocache"}
    if len(caching) != 1:
        raise ValueError("the servers of one plan logged different pools: " + "; ".join(
            f"{label(r.policy)} {r.pool.blocks} blocks of {r.pool.block_size} tokens"
            for r in runs if r.policy != "nocache"))
    return caching.pop()


def pool_line(runs: list[Run]) -> str:
    """The header's pool: the caching servers' (as logged), and the no-caching server's
    where it logged other blocks."""
    pool = served_pool(runs)
    other = sorted({(r.pool.blocks, r.pool.block_size) for r in runs
                    if r.policy == "nocache" and r.pool != pool})
    return (f"pool {pool.blocks} blocks of {pool.block_size} tokens (as the servers logged "
            "them" + "".join(f"; {label('nocache')}: {b} blocks of {t}" for b, t in other)
            + ")")


def table(plan: Plan, trace: Scaled, runs: list[Run]) -> None:
    ref = next((r for r in runs if r.policy == "nocache"), None)
    print(f"\n{plan.trace}: {len(trace.turns)} requests (every {trace.stride} token(s), "
          f"{trace.dropped} past the context dropped), {pool_line(runs)}")
    print(f"  {'server':34} {'ok':>4} {'cached tok':>10} {'vllm hits':>10} {'TTFT p50':>9} "
          f"{'p95':>7} {'ITL ms':>7} {'= no-cache':>10}  plugin")
    for run in runs:
        same = f"{identical(run, ref)}/{len(trace.turns)}" if ref is not None else "-"
        print(f"  {label(run.policy):34} {len(run.ok):4d} {run.cached:10d} "
              f"{run.counter('vllm:prefix_cache_hits_total'):10.0f} "
              f"{1e3 * percentile([s.ttft for s in run.ok], 50):7.0f}ms "
              f"{1e3 * percentile([s.ttft for s in run.ok], 95):5.0f}ms {run.itl_ms():7.1f} "
              f"{same:>10}  {run.plugin()}")
        for s in run.replayed.served:
            if s.error is not None:
                print(f"    request {s.index} failed: {s.error}")


def _key(run: Run, runs: list[Run]) -> str:
    """The run's name in the JSON of requests: its policy, with its round past the first
    (marconi, marconi#2, ...)."""
    same = [r for r in runs if r.policy == run.policy]
    k = next(i for i, r in enumerate(same) if r is run)
    return run.policy + (f"#{k + 1}" if k else "")


def mean_cached(runs: list[Run], policy: str) -> float:
    """A policy's cached tokens per server run (its rounds averaged)."""
    got = [r.cached for r in runs if r.policy == policy]
    return sum(got) / len(got)


def noise(runs: list[Run]) -> str:
    """Each server's cached tokens and TTFT p95, stock's first: the spread between stock's
    own runs is what a policy's figures are read against."""
    def figures(policy: str) -> str:
        mine = [r for r in runs if r.policy == policy]
        return (f"{label(policy)} x{len(mine)}: cached tokens "
                + ", ".join(str(r.cached) for r in mine) + "; TTFT p95 "
                + ", ".join(f"{1e3 * percentile([s.ttft for s in r.ok], 95):.0f}"
                            for r in mine) + " ms")
    policies = [p for p in dict.fromkeys(r.policy for r in runs) if p != "nocache"]
    return "  noise: " + "; ".join(figures(p) for p in policies)


def summary(policy: str, all_runs: list[list[Run]]) -> str:
    """One policy against stock over every plan and round: cached tokens per server run,
    TTFT percentiles over every request served, and outputs against the no-caching
    server's (stock's where none ran)."""
    n = same_n = 0
    mine_cached = stock_cached = 0.0
    ttft: list[float] = []
    ttft0: list[float] = []
    to_stock = False
    for runs in all_runs:
        mine = [r for r in runs if r.policy == policy]
        ref = next((r for r in runs if r.policy == "nocache"), None)
        if ref is None:  # no reference server was run: count against stock's first
            ref, to_stock = next(r for r in runs if r.policy == "stock"), True
        n += sum(len(r.replayed.served) for r in mine)
        same_n += sum(identical(m, ref) for m in mine)
        mine_cached += mean_cached(runs, policy)
        stock_cached += mean_cached(runs, "stock")
        ttft += [s.ttft for r in mine for s in r.ok]
        ttft0 += [s.ttft for r in runs if r.policy == "stock" for s in r.ok]
    cached = share(mine_cached, stock_cached)
    same = f"{same_n}/{n}" + (" (to stock's; no server without prefix caching was run)"
                              if to_stock else "")
    return (f"serve {label(policy)} vs {STOCK}: {n} requests, cached tokens ratio "
            f"{cached}, TTFT p50 ratio {percentile(ttft, 50) / percentile(ttft0, 50):.2f}, "
            f"p95 ratio {percentile(ttft, 95) / percentile(ttft0, 95):.2f}, outputs identical "
            f"{same}")


def predicted(plan: Plan, trace: Scaled, runs: list[Run], model: Path) -> dict[str, int]:
    """Cached tokens the replay through vLLM's own cache classes predicts for stock and
    each marconi policy (`through_cache_classes`): the requests stock was sent and
    answered, the pool and block size the servers logged."""
    from marconi.engines.real.serve_replay import as_trace

    sent = as_trace(plan.trace, trace, runs[0].replayed.served)
    policies = [p for p in dict.fromkeys(r.policy for r in runs) if p != "nocache"]
    pool = served_pool(runs)
    return {p: int(s.hit_tokens) for p, s in through_cache_classes(
        sent, pool.blocks, pool.block_size, policies, model).items()}


def check(name: str, runs: dict[str, list[dict[str, Any]]], pools: dict[str, dict[str, int]],
          model: Path, max_num_seqs: int, chunk_tokens: int, out: Path,
          engine: bool = True) -> list[str]:
    """Each caching server's run checked request by request (marconi.sim.served): its
    requests replayed on the server's own timeline and under the latency model fitted to
    stock's TTFTs, through vLLM's cache classes (`engine`) and through our emulation, at
    the pool and block size the server logged. One line each."""
    from marconi.core.spec import model_from
    from marconi.sim import served as sv

    spec = model_from(str(model / "config.json"))
    stock = sv.read_served(runs["stock"])
    profile = sv.profile_of(stock, out / f"{name}.profile.csv".replace("/", "_"))
    decode = sv.decode_step(stock)
    lines = []
    for key, records in runs.items():
        policy = key.split("#")[0]
        if policy == "nocache":
            continue
        pool = pools[key]
        block, blocks = int(pool["block_size"]), int(pool["blocks"])
        capacity = blocks * block * spec.kv_layer_bytes_per_token  # a layer's page a block
        served = sv.read_served(records)
        cached = np.array([s.cached for s in served])
        fixed = FIXED.fullmatch(policy)
        systems = []
        if engine:
            systems.append((label(policy), sv.replace_system(STOCK, block) + (
                "" if policy == "stock" else
                f",integration={'marconi' if fixed else policy},tuner=inline")))
        emulation = {"stock": "vllm-2026", "marconi": "vllm-2026+marconi"}.get(
            "marconi" if fixed else policy)
        if emulation is not None:
            systems.append((emulation, sv.replace_system(emulation, block)))
        # the serving replay's timeline of these requests, modelled (our emulation's: the
        # engine's own code has no scheduler of ours to run it)
        model = sv.replace_system(emulation or "vllm-2026", block)
        modelled, times = sv.model_hits(served, model, spec, capacity, profile, decode,
                                        max_num_seqs, chunk_tokens)
        for shown, system in systems:
            real = system.startswith(STOCK)
            timeline = (sv.engine_timeline_hits if real else sv.timeline_hits)(
                served, system, spec, capacity, max_num_seqs)
            lines.append(sv.Check(shown, name, "server timeline", cached, timeline).line())
            predicted = sv.engine_timeline_hits(served, system, spec, capacity, max_num_seqs,
                                                times) if real else modelled
            lines.append(sv.Check(shown, name, "latency model", cached, predicted).line())
    return lines


def checked(out: Path, engine: bool) -> int:
    """`--check DIR`: the lines of `check` for every plan a served run kept in DIR."""
    model = out / "model"
    found = sorted(p for p in out.glob("*.json") if not p.name.endswith(".pools.json"))
    if not found:
        raise SystemExit(f"--check {out}: no served run's records (PLAN.json) there")
    for path in found:
        name = path.stem
        pools = path.with_name(f"{name}.pools.json")
        if not pools.exists():
            raise SystemExit(f"--check {out}: {pools.name} missing beside {path.name}")
        for line in check(name, json.loads(path.read_text()), json.loads(pools.read_text()),
                          model, ServerConfig(model=model).max_num_seqs,
                          ServerConfig(model=model).max_num_batched_tokens, out, engine):
            print(line, flush=True)
    return 0



def through_cache_classes(sent: Any, blocks: int, block_size: int, policies: list[str],
                          model: Path) -> dict[str, Any]:
    """Each policy's summary replaying `sent` (a marconi Trace) through vLLM's own cache
    classes (marconi.engines.real, one request at a time in arrival order, the tuner inline)
    at the server's pool: `blocks` of `block_size` tokens (what a server logged, or
    `--predict`'s `--block-size`), at one layer's page each, as the plugin's mirror
    counts it."""
    from marconi.core.spec import model_from
    from marconi.sim import SimConfig
    from marconi.sim.run import run

    spec = model_from(str(model / "config.json"))
    memory = blocks * block_size * spec.kv_layer_bytes_per_token
    out = {}
    for policy in policies:
        fixed = FIXED.fullmatch(policy)  # marconi@A: alpha A, no tuner
        system = f"{STOCK}:block_size={block_size}" + (
            "" if policy == "stock" else
            f",integration={'marconi' if fixed else policy},tuner=inline")
        config = SimConfig(spec=spec, capacity=str(memory), system=system, bounds=False,
                           alpha=float(fixed.group(1)) if fixed else None,
                           replay="sequential", retune=False)  # the engine's code, one at a time
        out[policy] = run(sent, config, warn=False).summary()
    return out


def open_loop(name: str, trace: Scaled, seed: int = 0) -> Any:
    """`trace` as a marconi Trace without a server: each turn's prompt is the session's
    previous prompt, a stand-in for its output (`n_output` seeded random ids, as a random-
    weight model's output is), then its fresh tokens (what `replay` sends, the server's
    output replaced)."""
    import numpy as np

    from marconi.workload.types import Request, Trace

    rng = np.random.default_rng(seed)
    last: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    turn_of: dict[str, int] = {}
    requests = []
    for t in trace.turns:
        prev = last.get(t.session)
        prompt = np.concatenate([*prev, t.fresh]) if t.extends and prev else t.fresh
        output = rng.integers(3, VOCAB, t.n_output)
        last[t.session] = (prompt, output)
        turn_of[t.session] = turn_of.get(t.session, -1) + 1
        requests.append(Request(session_id=t.session, turn=turn_of[t.session],
                                arrival=t.arrival, input_tokens=prompt.astype(np.int32),
                                output_tokens=output.astype(np.int32)))
    return Trace(name, tuple(sorted(requests, key=lambda r: r.arrival)))


def fitted_plans(plans: tuple[Plan, ...]) -> Iterator[tuple[Plan, Scaled]]:
    """Each plan with its trace fitted to the served model (`scaled`); a plan whose data
    is absent is said and skipped."""
    for plan in plans:
        trace = load(plan.trace)
        if trace is None:
            print(f"{plan.trace}: data absent, skipped")
            continue
        yield plan, scaled(trace, stride=plan.stride, vocab=VOCAB, requests=plan.requests,
                           max_tokens=plan.max_model_len, max_output=plan.max_output,
                           span=plan.span)


def predict(plans: tuple[Plan, ...], pools: list[int], block_size: int, policies: list[str],
            out: Path) -> None:
    """No server: per plan and pool, what the replay through vLLM's cache classes predicts
    for each policy against stock (cached tokens, and FLOPs saved, what marconi's order
    maximizes), on the open-loop trace (`open_loop`): where the order could show. The
    block size is the one given (no server to read it from), and the output says so."""
    model = write_model(out / "model")
    for plan, fitted in fitted_plans(plans):
        sent = open_loop(plan.trace, fitted)
        print(f"\n{plan.trace}: {len(sent)} requests (every {plan.stride} token(s)), "
              f"{sum(r.n_input for r in sent)} input tokens, open loop, blocks of "
              f"{block_size} tokens (--block-size, given: no server was read)", flush=True)
        for blocks in pools:
            got = through_cache_classes(sent, blocks, block_size, ["stock", *policies],
                                        model)
            stock = got["stock"]
            print(f"  {blocks:4d} blocks: {STOCK} {stock.hit_tokens} tokens; "
                  + "; ".join(_against(label(p), got[p], stock) for p in policies),
                  flush=True)


def _against(policy: str, mine: Any, stock: Any) -> str:
    alpha = f", alpha {mine.alpha:g}" if mine.alpha is not None else \
        ", its tuner unfinished (alpha 0)" if mine.alpha_status == "untuned" else ""
    return (f"{policy} {mine.hit_tokens} tokens, ratio {share(mine.hit_tokens, stock.hit_tokens)}"
            f", FLOPs saved ratio {share(mine.flops_saved, stock.flops_saved)}{alpha}")


def families(out: Path) -> None:
    """Each family of vllm_server.FAMILIES served by a stock server with prefix caching:
    one 700-token prompt sent twice; the second's cached tokens, or why it failed."""
    from openai import OpenAI

    prompt = [3 + (7 * i) % (VOCAB - 3) for i in range(700)]
    for family in FAMILIES:
        model = write_model(out / family, family)
        config = ServerConfig(model=model, policy="stock", blocks=64)
        server = Server(config, out / f"{family}.log")
        try:
            with server:
                client = OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
                cached = []
                for _ in range(2):
                    r = client.completions.create(model=NAME, prompt=prompt, max_tokens=4,
                                                  temperature=0.0)
                    details = r.usage.prompt_tokens_details if r.usage else None
                    cached.append(int(getattr(details, "cached_tokens", 0) or 0))
            print(f"family {family}: serves; the repeated 700-token prompt hit {cached[1]} "
                  "tokens")
        except Exception as err:  # the server's own root cause, where its log has one
            cause = server.last_error() if server.log_path.exists() else ""
            print(f"family {family}: fails: {err}" + (f" ({cause})" if cause and
                                                       cause not in str(err) else ""))


def _pools(parser: argparse.ArgumentParser, given: str) -> list[int]:
    try:
        pools = [int(b) for b in given.split(",")]
    except ValueError:
        pools = []
    if not pools or min(pools) < 1:
        parser.error(f"--predict: pools are positive block counts, comma-separated; got "
                     f"{given!r}")
    return pools


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one short ShareGPT replay")
    parser.add_argument("--traces", default=None,
                        help="comma-separated trace names of the plan (default: all)")
    parser.add_argument("--policies", default=",".join(POLICIES),
                        help=f"comma-separated, of {', '.join(POLICIES)} (stock always runs), "
                             "marconi@A: marconi at a fixed alpha A (its loop cost at "
                             "alpha > 0 without waiting for the tuner), or a system whose "
                             "eviction is a declared priority (lfu, slru)")
    parser.add_argument("--blocks", type=int, default=None,
                        help="every server's pool in blocks (default: each plan's)")
    parser.add_argument("--stride", type=int, default=None,
                        help="keep every N-th token of each trace (default: each plan's)")
    parser.add_argument("--requests", type=int, default=None,
                        help="the first N requests of each trace (default: each plan's)")
    parser.add_argument("--max-model-len", type=int, default=None,
                        help="every server's context in tokens; longer requests are dropped "
                             "(default: each plan's)")
    parser.add_argument("--repeat", action="store_true", help="stock once more at the end")
    parser.add_argument("--rounds", type=int, default=1,
                        help="serve stock and each policy this many times, interleaved (the "
                             "no-caching reference once); figures pooled over the rounds")
    parser.add_argument("--out", default=None, help="keep the logs and requests here")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--predict", default=None, metavar="BLOCKS,...",
                        help="only: no server; the replay through vLLM's cache classes at "
                             "each of these pools (in blocks of --block-size tokens), the "
                             "plan's traces open loop: where marconi's order could show")
    parser.add_argument("--block-size", type=int, default=None, metavar="TOKENS",
                        help="with --predict (required there, no default): the served block "
                             "size in tokens, as a server logs it ('kv lcm block sizes N'); "
                             "a served run reads each server's from its log")
    parser.add_argument("--check", default=None, metavar="DIR",
                        help="only: no server; the served runs kept in DIR (an earlier "
                             "--out) checked request by request against their replays")
    parser.add_argument("--no-engine-check", action="store_true",
                        help="check through our emulation only, not vLLM's cache classes")
    parser.add_argument("--families", action="store_true",
                        help="only: which tiny model families vLLM's CPU build serves (each "
                             "started stock, asked one prompt twice: its hit, or its error)")
    args = parser.parse_args(argv)
    if args.predict is not None and args.block_size is None:
        parser.error("--predict needs --block-size TOKENS: the served block size, which "
                     "no server is started to log here (a server states it in its log: "
                     "'kv lcm block sizes N'); there is no default")
    if args.predict is None and args.block_size is not None:
        parser.error("--block-size: only with --predict (a served run reads each server's "
                     "block size from its log)")
    if args.block_size is not None and args.block_size < 1:
        parser.error(f"--block-size: a positive number of tokens; got {args.block_size}")
    if args.check is not None and args.no_engine_check:  # in process only: no vLLM needed
        return checked(Path(args.check), False)
    if not available("vllm"):
        print("bench_serve: skipped, vLLM's environment is missing "
              "(bash scripts/setup-peers.sh vllm)")
        return 0
    if args.families:
        families(Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="families-")))
        return 0
    if args.check is not None:
        return checked(Path(args.check), not args.no_engine_check)
    policies = ["stock", *[p for p in args.policies.split(",") if p != "stock"]]
    declared = declared_priorities()  # registered systems whose eviction is a Priority
    bad = [p for p in policies if p not in (*POLICIES, *declared) and not FIXED.fullmatch(p)]
    if bad:
        parser.error(f"--policies: unknown {', '.join(bad)} (known: "
                     f"{', '.join((*POLICIES, *declared))}, marconi@ALPHA)")
    if args.rounds < 1:
        parser.error(f"--rounds: a positive number of rounds; got {args.rounds}")
    policies = policies + [p for _ in range(args.rounds - 1) for p in policies
                           if p != "nocache"]
    if args.repeat:
        policies.append("stock")
    plans = QUICK if args.quick else FULL
    if args.traces:
        plans = tuple(p for p in FULL + QUICK if p.trace in args.traces.split(","))
    for field in ("blocks", "stride", "requests", "max_model_len"):
        given = getattr(args, field)
        if given is not None and given < 1:
            parser.error(f"--{field.replace('_', '-')}: a positive number; got {given}")
        if given is not None:
            plans = tuple(replace(p, **{field: given}) for p in plans)
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="bench-serve-"))
    if args.predict is not None:
        pools = _pools(parser, args.predict)
        predict(plans, pools, args.block_size,
                [p for p in policies if p not in ("stock", "nocache")], out)
        return 0
    model = write_model(out / "model")
    all_runs: list[list[Run]] = []
    for plan, fitted in fitted_plans(plans):
        print(f"{plan.trace}: serving {len(fitted.turns)} requests", file=sys.stderr,
              flush=True)
        runs = [serve_one(p, plan, fitted, model, out, not args.no_progress)
                for p in policies]
        table(plan, fitted, runs)
        guess = predicted(plan, fitted, runs, model)
        print("  replay through vLLM's cache classes (same requests, one at a time), cached "
              "tokens: " + ", ".join(f"{label(p)} {n}" for p, n in guess.items())
              + "".join(f"; {label(p)} ratio {share(guess[p], guess['stock'])} "
                        f"(served {share(mean_cached(runs, p), mean_cached(runs, 'stock'))})"
                        for p in guess if p != "stock"))
        if sum(r.policy == "stock" for r in runs) > 1:
            print(noise(runs))
        all_runs.append(runs)
        (out / f"{plan.trace}.json".replace("/", "_")).write_text(json.dumps(
            {_key(r, runs): [asdict(s) for s in r.replayed.served] for r in runs}))
        (out / f"{plan.trace}.pools.json".replace("/", "_")).write_text(json.dumps(
            {_key(r, runs): asdict(r.pool) for r in runs}))
        for line in check(plan.trace, {_key(r, runs): [asdict(s) for s in r.replayed.served]
                                       for r in runs},
                          {_key(r, runs): asdict(r.pool) for r in runs}, model,
                          ServerConfig(model=model).max_num_seqs,
                          ServerConfig(model=model).max_num_batched_tokens, out):
            print("  " + line, flush=True)
    print()
    for policy in dict.fromkeys(policies):
        if policy not in ("stock", "nocache") and all_runs:
            print(summary(policy, all_runs))
    if "nocache" in policies and all_runs:
        n = sum(len(runs[0].replayed.served) for runs in all_runs)
        same = sum(identical(runs[0], next(r for r in runs if r.policy == "nocache"))
                   for runs in all_runs)
        print(f"serve {STOCK} vs {label('nocache')}: outputs identical {same}/{n}")
    print(f"(logs and requests in {out})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
