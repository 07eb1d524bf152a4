"""The compiled core against its oracle, the Python core: the same operations on both,
identical plans, hits, victims, counters and trees after every step."""

from __future__ import annotations

import os
import pickle
import random
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from marconi.core import compiled
from marconi.core.cache import PrefixCache
from marconi.core.candidates import Scored
from marconi.core.compiled import CompiledCache, CompiledNode, replay_cache
from marconi.core.integrity import check_integrity
from marconi.core.layout import Layout
from marconi.core.priority import Feature, Score, Term
from marconi.core.ranked import Ranked
from marconi.core.snapshot import clone, rebuild, take
from marconi.core.spec import PAPER_7B, ModelSpec
from marconi.core.state_store import Freed
from marconi.core.tree import Node
from marconi.paper.admission import Block, Judicious, NoAdmission
from marconi.paper.eviction import MARCONI, FlopAware, LRULeaf, Recency
from marconi.peers.mamba_align import Align, BlockFlop, BlockLRU, VLLMConfig
from marconi.peers.mamba_radix import (
    BufferMode,
    MambaRadix,
    MambaRadixFlop,
    MambaRadixLRU,
    SGLangConfig,
)
from marconi.peers.seglen import SegLen, replay_length
from marconi.peers.sparse_prefix import SparsePrefix
from marconi.peers.tlru import TailLRU
from marconi.plus.admission import PLAIN, Structured
from marconi.plus.density import HitDensity
from marconi.plus.greedy_dual import GreedyDualFlop
from marconi.plus.overlap import OverlapPlanner
from marconi.plus.switchable import Mode, Setting, Switchable
from tests.helpers import CACHES, SMALL, examples

if not compiled.built():
    if os.environ.get("CI"):
        raise RuntimeError("the compiled core is not built: CI builds it (scripts/setup.sh)")
    pytest.skip("the compiled core is not built", allow_module_level=True)

# no SSM layers: a Transformer, whose hit is the matched length
ATTENTION_ONLY = ModelSpec(name="attention", d_model=64, attention_layers=4, ssm_layers=0,
                           mlp_layers=4, d_state=16)
# FLOPs past 2**53 over a few tokens: every efficiency takes the exact (Python) division
WIDE = ModelSpec(name="wide", d_model=2**24 - 3, attention_layers=1, ssm_layers=1, mlp_layers=1,
                 d_state=16)
SPECS = {"small": SMALL, "attention": ATTENTION_ONLY, "wide": WIDE, "paper-7b": PAPER_7B}
# declared scores over an engine's state list (`BlockFlop`, `MambaRadixFlop`): Marconi's,
# and two it is not (efficiency first, its alpha weighing it; a raw product, never the LRU
# order, alpha 0 included), which both cores evaluate from the declaration alone
STATE_SCORES = {
    "marconi": MARCONI,
    "efficiency-first": Score("efficiency-first", terms=(
        Term(Feature.EFFICIENCY, tuned=True), Term(Feature.RECENCY, weight=0.25))),
    "product": Score("product", terms=(Term(Feature.RECENCY), Term(Feature.EFFICIENCY)),
                     normalized=False, product=True)}
POLICIES = {
    "sglang+": lambda spec, alpha, planner: (Judicious(), LRULeaf()),
    "lru-deepest": lambda spec, alpha, planner: (Judicious(), LRULeaf(deepest_first=True)),
    "marconi": lambda spec, alpha, planner: (Judicious(), FlopAware(spec, alpha)),
    "marconi-inverse-age": lambda spec, alpha, planner: (
        Judicious(), FlopAware(spec, alpha, Recency.INVERSE_AGE)),
    "seglen": lambda spec, alpha, planner: (Judicious(), SegLen(alpha)),  # (alpha: the weight)
    # sparse prefix caching: its placement's points per request, learnt from each commit
    "sparse-prefix": lambda spec, alpha, planner: (SparsePrefix(2), LRULeaf()),
    "sparse-flop": lambda spec, alpha, planner: (SparsePrefix(3), FlopAware(spec, alpha)),
    # (its cuts hold no state: a candidate's replay runs past its parent)
    "sparse-seglen": lambda spec, alpha, planner: (SparsePrefix(2), SegLen(alpha + 0.5)),
    "vanilla": lambda spec, alpha, planner: (NoAdmission(), LRULeaf()),
    "vllm+": lambda spec, alpha, planner: (Block(4), LRULeaf(deepest_first=True)),
    "block-flop": lambda spec, alpha, planner: (Block(3), FlopAware(spec, alpha)),
    # marconi+'s shadows: structured admission (message boundaries, the overlap planner's
    # points) with hit density (learning every few events, few buckets; leaves classed by
    # depth from 4 tokens), GreedyDual-FLOP or LRU
    "plus-density": lambda spec, alpha, planner: (
        Structured(PLAIN, planner), HitDensity(spec, every=3, per_octave=2, buckets=9)),
    "plus-depth": lambda spec, alpha, planner: (
        Structured(PLAIN, planner), HitDensity(spec, every=5, depth_classes=3, depth_base=4)),
    "plus-gd": lambda spec, alpha, planner: (Structured(PLAIN, planner), GreedyDualFlop(spec)),
    "plus-lru": lambda spec, alpha, planner: (Structured(PLAIN, planner), LRULeaf()),
    # marconi+'s live cache: every expert's eviction kept at once, one choosing
    "plus-live": lambda spec, alpha, planner: (Structured(PLAIN, planner), live(spec)),
    "plus-live-default": lambda spec, alpha, planner: (
        Structured(PLAIN, planner), Switchable(spec, Mode.DENSITY)),
}


def _declared() -> dict[str, Any]:
    """Every registered system whose eviction is a declared priority (`Ranked`), by its
    name: the differential tests below cover a newly declared policy with no test code of
    its own."""
    out = {}
    for name, system in CACHES.items():
        if isinstance(system.policies(SMALL, 0.0)[1], Ranked):
            out[name] = lambda spec, alpha, planner, s=system: s.policies(spec, alpha)
    return out


DECLARED = _declared()
POLICIES.update(DECLARED)


def live(spec: ModelSpec) -> Switchable:
    """marconi+'s live eviction with hit densities that learn every few events."""
    eviction = Switchable(spec, Mode.DENSITY)
    eviction.density = HitDensity(spec, every=3, per_octave=2, buckets=9)
    eviction.depth = HitDensity(spec, every=5, depth_classes=3, depth_base=4)
    eviction.experts[Mode.DENSITY], eviction.experts[Mode.DEPTH] = eviction.density, eviction.depth
    return eviction

PREFIXES = [[], [1, 2, 3, 4, 5, 6], [1, 2, 3, 9, 9], [7] * 12, [5, 6, 5, 6, 5]]
suffixes = st.lists(st.integers(0, 9), min_size=1, max_size=14)
inputs = st.tuples(st.sampled_from(PREFIXES), suffixes).map(lambda t: t[0] + t[1])
marks = st.lists(st.integers(1, 30), max_size=3).map(sorted)  # message boundaries
outputs = st.lists(st.integers(0, 9), max_size=5)


def depth_of(node: Node | CompiledNode | None) -> int | None:
    """Where a plan's or a commit's node ends (None: no node), on either core."""
    return None if node is None else node.depth


def freed_of(record: list[Freed]) -> list[tuple[str, int, int]]:
    out = [(f.action.value, f.depth, f.nbytes) for f in record]
    record.clear()
    return out


class Twins(RuleBasedStateMachine):
    """Both cores, driven alike."""

    layout = Layout()  # the caches' (`AlignTwins`: KV in pages)

    @initialize(policy=st.sampled_from(sorted(POLICIES)), spec=st.sampled_from(sorted(SPECS)),
                entries=st.integers(0, 40), alpha=st.sampled_from([0.0, 0.3, 1.0, 2.0]))
    def make(self, policy: str, spec: str, entries: int, alpha: float) -> None:
        self._make(policy, spec, entries, alpha)

    def _make(self, policy: str, spec: str, entries: int, alpha: float) -> None:
        self.structured = policy.startswith("plus-")
        # structured admission of a model without SSM layers runs in Python only (below)
        self.spec = SPECS["small" if self.structured and spec == "attention" else spec]
        self.policy, self.alpha = POLICIES[policy], alpha
        self.planner = OverlapPlanner()  # shared by both caches' admissions, taught alike
        # room for about `entries` tokens and a few states: evictions from the start
        self.capacity = entries * self.spec.kv_bytes_per_token + 3 * self.spec.ssm_bytes
        self.build()

    def build(self) -> None:
        admission, eviction = self.policy(self.spec, self.alpha, self.planner)
        self.record: list[Freed] = []
        self.python = PrefixCache(self.spec, self.capacity, admission, eviction,
                                  on_evict=self.record.append, page_size=self.layout.page_size,
                                  state_slots=self.layout.state_slots)
        admission, eviction = self.policy(self.spec, self.alpha, self.planner)
        self.twin = CompiledCache(self.spec, self.capacity, admission, eviction,
                                  layout=self.layout)
        self.twin.log_evictions()
        self.pinned: list[tuple[Node, CompiledNode]] = []  # running requests' nodes

    @rule(inp=inputs, out=outputs, boundaries=marks)
    def request(self, inp: list[int], out: list[int], boundaries: list[int]) -> None:
        plan = self.python.lookup(inp, boundaries=boundaries)
        twin = self.twin.lookup(inp, boundaries=boundaries)
        assert (twin.hit, twin.checkpoints, twin.matched, twin.n_input) == (
            plan.hit, plan.checkpoints, plan.matched, plan.n_input)
        full = inp + out
        done = self.python.commit(full, len(inp), boundaries=boundaries)
        twin_done = self.twin.commit(full, len(inp), boundaries=boundaries)
        assert (twin_done.refused, twin_done.admitted) == (done.refused, done.admitted)
        assert depth_of(twin_done.node) == depth_of(done.node)
        self.last = full
        self.planner.learn(np.asarray(full, dtype=np.int32).tobytes(), len(inp))

    @rule(first=st.booleans(), last=st.booleans(), overlap=st.booleans())
    def use_boundaries(self, first: bool, last: bool, overlap: bool) -> None:
        """marconi+'s switch of admission: message boundaries, the planner's points."""
        if self.structured:
            for cache in (self.python, self.twin):
                cache.admission.use_boundaries(first=first, last=last, overlap=overlap)

    @rule(mode=st.sampled_from([Mode.FLOP, Mode.LRU, Mode.DENSITY, Mode.DEPTH]))
    def switch(self, mode: Mode) -> None:
        """marconi+'s live cache switches the expert choosing victims."""
        if isinstance(self.python.eviction, Switchable):
            self.python.eviction.set_setting(Setting(mode))
            self.twin.eviction.set_setting(Setting(mode))

    @rule()
    def part(self) -> None:
        """Both copied with their books (a shadow parting from its twin), the copies run
        from here on: the compiled copy behaves as the Python one."""
        self.python = clone(self.python, (self.planner,))
        self.python.on_evict = self.record.append
        self.twin = clone(self.twin, (self.planner,))
        # the pins go with the copies: the Python copy's nodes by id, the compiled ones as
        # they were (the same slots and uids)
        copied = {node.id: node for node in self.python.tree.nodes()}
        self.pinned = [(copied[node.id], twin) for node, twin in self.pinned]
        if self.structured:
            assert self.twin.admission.planner is self.planner

    @rule(more=suffixes, out=outputs, boundaries=marks)
    def extend(self, more: list[int], out: list[int], boundaries: list[int]) -> None:
        """An agent's next call: the last request's input and output, then more (a final
        partial block grows in place under block admission)."""
        self.request(getattr(self, "last", []) + more, out, boundaries)

    @rule(cut=st.integers(1, 60), out=outputs, boundaries=marks)
    def retry(self, cut: int, out: list[int], boundaries: list[int]) -> None:
        """A prefix of the last sequence asked again (a regenerated answer, a retried
        call): an input that ends where a state may be held."""
        last = getattr(self, "last", [])
        if last:
            self.request(last[: 1 + (cut - 1) % len(last)], out, boundaries)

    @rule(inp=inputs, out=outputs, boundaries=marks)
    def serve(self, inp: list[int], out: list[int], boundaries: list[int]) -> None:
        key = np.asarray(inp + out, dtype=np.int32).tobytes()
        assert self.twin.serve(key, len(inp), boundaries) == self.python.serve(
            key, len(inp), boundaries)
        self.planner.learn(key, len(inp))

    @rule(inp=inputs, out=outputs, bad=st.sampled_from([None, -1, -(2**31)]),
          at=st.integers(0, 2**16))
    def serve_tokens(self, inp: list[int], out: list[int], bad: int | None, at: int) -> None:
        """From an int32 array, read in place by the compiled core, which checks the ids
        its walk did not match to the tree's: a negative one anywhere (a cached prefix
        before it, in the output) is refused alike, before any side effect (`same`)."""
        tokens = np.asarray(inp + out, dtype=np.int32)
        if bad is not None:
            tokens[at % len(tokens)] = bad
            errors = []
            for cache in (self.python, self.twin):
                with pytest.raises(ValueError, match="token ids must be in") as err:
                    cache.serve_tokens(tokens, len(inp))
                errors.append(str(err.value))
            assert errors[0] == errors[1]
            return
        assert self.twin.serve_tokens(tokens, len(inp)) == self.python.serve_tokens(
            tokens, len(inp))

    @rule(inp=inputs, boundaries=marks, again=st.booleans(), more=suffixes)
    def abandon(self, inp: list[int], boundaries: list[int], again: bool,
                more: list[int]) -> None:
        """A lookup whose request never commits (preempted, aborted): what it touched
        stays touched (`again`: an agent's next call, the last sequence and more)."""
        if again:
            inp = getattr(self, "last", []) + more
        plan = self.python.lookup(inp, boundaries=boundaries)
        twin = self.twin.lookup(inp, boundaries=boundaries)
        assert (twin.hit, twin.checkpoints, twin.matched) == (
            plan.hit, plan.checkpoints, plan.matched)

    @rule(inp=inputs, boundaries=marks, again=st.booleans(), more=suffixes, out=outputs,
          finish=st.booleans())
    def pin(self, inp: list[int], boundaries: list[int], again: bool, more: list[int],
            out: list[int], finish: bool) -> None:
        """A request that starts running: the node its lookup resumes from is pinned with
        its ancestors until `unpin` (`finish`: it commits first, still pinned), so other
        requests evict around it, or are refused when what is pinned leaves no room."""
        if again:
            inp = getattr(self, "last", []) + more
        plan = self.python.lookup(inp, boundaries=boundaries)
        twin = self.twin.lookup(inp, boundaries=boundaries)
        assert (twin.hit, twin.checkpoints, twin.matched, depth_of(twin.node)) == (
            plan.hit, plan.checkpoints, plan.matched, depth_of(plan.node))
        self.python.pin(plan.node)
        self.twin.pin(twin.node)
        if plan.node is not None:
            self.pinned.append((plan.node, twin.node))
        if finish:
            full = inp + out
            done = self.python.commit(full, len(inp), boundaries=boundaries)
            twin_done = self.twin.commit(full, len(inp), boundaries=boundaries)
            assert (twin_done.refused, twin_done.admitted) == (done.refused, done.admitted)
            self.last = full

    @rule(which=st.integers(0, 7))
    def unpin(self, which: int) -> None:
        """A running request ends: one of the pinned nodes unpinned (a node pinned twice
        stays pinned)."""
        if self.pinned:
            node, twin = self.pinned.pop(which % len(self.pinned))
            self.python.unpin(node)
            self.twin.unpin(twin)

    @rule(inp=inputs, boundaries=marks)
    def peek(self, inp: list[int], boundaries: list[int]) -> None:
        plan = self.python.peek(inp, boundaries=boundaries)
        twin = self.twin.peek(inp, boundaries=boundaries)
        assert (twin.hit, twin.checkpoints, twin.matched) == (
            plan.hit, plan.checkpoints, plan.matched)

    @rule(alpha=st.sampled_from([0.0, 0.7, 1.5]))
    def set_alpha(self, alpha: float) -> None:
        if self.python.eviction.alpha is not None:
            self.python.eviction.set_alpha(alpha)
            self.twin.eviction.set_alpha(alpha)

    @rule()
    def snapshot(self) -> None:
        """Both rebuilt from the Python core's snapshot (the tuner's replays; marconi+'s
        live cache is never rebuilt)."""
        if isinstance(self.python.eviction, Switchable):
            return
        snap = take(self.python)
        self.build()
        rebuild(snap, self.python)
        rebuild(snap, self.twin)

    @invariant()
    def same(self) -> None:
        if not hasattr(self, "twin"):
            return
        assert self.twin.stats.copy() == self.python.stats
        for node, twin in self.pinned:  # each still there, as often pinned
            assert self.twin._core.pins(twin.slot) == node.pins > 0
        assert self.twin.freed() == freed_of(self.record)
        assert self.twin.take() == take(self.python)  # structure, states, stamps, clock
        self.twin.check()
        check_integrity(self.python)
        eviction = self.python.eviction
        if isinstance(eviction, Scored):  # row order, touches, efficiencies: bit for bit
            columns = eviction.columns
            twin = self.twin.candidates()
            if isinstance(eviction, SegLen):  # (no efficiency: its replay lengths are read
                twin = [(depth, rec, 0.0) for depth, rec, _ in twin]  # at each victim)
            assert twin == [
                (node.depth, float(columns["rec"][i]),
                 float(columns["eff"][i]) if eviction.candidate_set.efficiency else 0.0)
                for i, node in enumerate(columns.nodes)]
        if isinstance(eviction, FlopAware | SegLen) and len(eviction.columns):
            # each candidate's score at this clock (either recency, either term): bit for bit
            assert self.twin.scores() == eviction.scores(self.python.clock).tolist()
        densities = [eviction] if isinstance(eviction, HitDensity) else []
        if isinstance(eviction, Switchable):  # every expert's books, whichever runs
            assert self.twin.eviction.mode is eviction.mode
            columns = eviction.flop.columns
            assert self.twin.candidates() == [
                (node.depth, float(columns["rec"][i]), float(columns["eff"][i]))
                for i, node in enumerate(columns.nodes)]
            densities = [d for d in (eviction.density, eviction.depth) if d is not None]
            rows = eviction.density.columns
            assert self.twin.clock_stamps() == rows["rec"][:len(rows)].tolist()
            assert [n.depth for n in rows.nodes] == [n.depth for n in columns.nodes]
            eviction = eviction.flop
        if isinstance(eviction, GreedyDualFlop):
            assert self.twin.level == eviction.level
        if isinstance(eviction, BlockFlop | MambaRadixFlop):  # its states, bit for bit
            nodes, eff = eviction.flop.ranked(eviction.states, ())
            assert self.twin.state_ranks() == [
                (node.depth, eviction.state_stamp[node], float(e))
                for node, e in zip(nodes, eff, strict=True)]
        for k, density in enumerate(densities):  # classes, counts, tables: bit for bit
            n = len(density.columns)
            assert self.twin.classes(k) == density.columns["cls"][:n].tolist()
            assert self.twin.density_state(k) == (
                density.hits.ravel().tolist(), density.events.ravel().tolist(),
                density.density.ravel().tolist(), density.counted)


TestTwins = Twins.TestCase
TestTwins.settings = settings(max_examples=examples(300), stateful_step_count=40, deadline=None,
                              suppress_health_check=[HealthCheck.too_slow])


class LiveTwins(Twins):
    """marconi+'s live cache alone (every expert's eviction kept at once), starting under
    any expert: LRU's own order, GreedyDual's level while another expert chooses, each
    hit density's clock."""

    @initialize(policy=st.sampled_from(["plus-live", "plus-live-default"]),
                spec=st.sampled_from(["small", "paper-7b"]), entries=st.integers(0, 40),
                mode=st.sampled_from([Mode.FLOP, Mode.LRU, Mode.DENSITY, Mode.DEPTH]))
    def make(self, policy: str, spec: str, entries: int, mode: Mode) -> None:  # type: ignore[override]
        self._make(policy, spec, entries, 0.0)
        self.switch(mode)

TestLiveTwins = LiveTwins.TestCase
TestLiveTwins.settings = settings(max_examples=examples(500), stateful_step_count=40, deadline=None,
                                  suppress_health_check=[HealthCheck.too_slow])


class AlignTwins(Twins):
    """vLLM's align mode with its block queue (what marconi.engines.integrations.vllm's tuner
    mirrors): states at the replay boundary, junctions and the retention interval's
    positions, a commit kept to its last full block, room made for the running request;
    KV in pages (shared at splits, copied where a branch starts inside one) or per token;
    two LRU lists, a state leaving alone, and `BlockFlop`'s order for states, its
    efficiencies from the model unpadded while the cache counts vLLM's padded states."""

    @initialize(spec=st.sampled_from(["small", "paper-7b", "wide"]), entries=st.integers(0, 60),
                alpha=st.sampled_from([0.0, 0.3, 1.0, 2.0]), block=st.integers(1, 5),
                page=st.sampled_from(["1", "block", "3"]), chunk=st.sampled_from([1, 5, 8192]),
                retention=st.sampled_from(["0", "none", "2 blocks"]),
                junctions=st.booleans(), flop=st.booleans(), pad=st.integers(0, 3),
                states=st.integers(3, 10), score=st.sampled_from(sorted(STATE_SCORES)))
    def make(self, spec: str, entries: int, alpha: float, block: int,  # type: ignore[override]
             page: str, chunk: int, retention: str, junctions: bool, flop: bool,
             pad: int, states: int, score: str) -> None:
        model = SPECS[spec]
        config = VLLMConfig(block=block, chunk=chunk, junctions=junctions,
                            retention={"0": 0, "none": None, "2 blocks": 2 * block}[retention])
        self.layout = Layout(page_size={"1": 1, "block": block, "3": 3}[page])
        self.structured = False
        # vLLM pads a state to whole blocks: the cache counts the padded size, the FLOP
        # order reads the model's own
        self.spec = model.replace(checkpoint_extra_bytes=model.checkpoint_extra_bytes
                                  + pad * model.ssm_bytes // 2)
        self.policy = lambda spec, alpha, planner: (
            Align(config),
            BlockFlop(model, alpha, score=STATE_SCORES[score]) if flop else BlockLRU())
        self.alpha, self.planner = alpha, OverlapPlanner()
        # room for a running request's two working states beside the ones it keeps
        self.capacity = (entries * self.spec.kv_bytes_per_token
                         + states * self.spec.ssm_bytes)
        self.build()


TestAlignTwins = AlignTwins.TestCase
TestAlignTwins.settings = settings(max_examples=examples(400), stateful_step_count=40,
                                   deadline=None,
                                   suppress_health_check=[HealthCheck.too_slow])


class RadixTwins(Twins):
    """SGLang's admission with its two lists (what marconi.engines.integrations.sglang's tuner
    mirrors): no-buffer (every chunk's end, the input's, the last fed token) or
    extra-buffer (tracked states aligned to T, the branch point, decode states, two
    working slots); a state pool beside the KV or one byte budget with the states' share;
    the list that gives the victim by which is short, stateless leaves collected last
    queued first, and `MambaRadixFlop`'s order (over the parent, branches last) or
    T-LRU's KV order (TEL-safe leaves first, by each node's high-water depth)."""

    @initialize(spec=st.sampled_from(["small", "paper-7b", "wide"]), entries=st.integers(0, 60),
                alpha=st.sampled_from([0.0, 0.3, 1.0, 2.0]),
                extra=st.booleans(), chunk=st.sampled_from([2, 5, 8192]),
                track=st.integers(1, 4), interval=st.integers(1, 6),
                share=st.sampled_from([0.0, 0.3, 0.9 / 1.9, 1.0]),
                slots=st.integers(0, 6), states=st.integers(0, 6),
                lists=st.sampled_from(["lru", "flop", "tlru"]),
                threshold=st.integers(0, 24), estimate=st.integers(0, 12),
                score=st.sampled_from(sorted(STATE_SCORES)))
    def make(self, spec: str, entries: int, alpha: float, extra: bool,  # type: ignore[override]
             chunk: int, track: int, interval: int, share: float, slots: int, states: int,
             lists: str, threshold: int, estimate: int, score: str) -> None:
        self._radix(spec, entries, alpha, extra, chunk, track, interval, share, slots, states,
                    lists, threshold, estimate, STATE_SCORES[score])

    def _radix(self, spec: str, entries: int, alpha: float, extra: bool, chunk: int,
               track: int, interval: int, share: float, slots: int, states: int, lists: str,
               threshold: int, estimate: int, score: Score = MARCONI) -> None:
        model = SPECS[spec]
        config = SGLangConfig(mode=BufferMode.EXTRA_BUFFER if extra else BufferMode.NO_BUFFER,
                              chunk=chunk, track=track, decode_interval=interval,
                              state_share=share)
        self.layout = Layout(state_slots=slots)
        self.structured, self.spec = False, model
        self.policy = lambda spec, alpha, planner: (
            MambaRadix(config),
            MambaRadixFlop(config, model, alpha, score=score) if lists == "flop"
            else TailLRU(config, threshold=threshold, next_prompt=estimate) if lists == "tlru"
            else MambaRadixLRU(config))
        self.alpha, self.planner = alpha, OverlapPlanner()
        self.capacity = (entries * model.kv_bytes_per_token
                         + (slots + states) * model.ssm_bytes)
        self.build()


TestRadixTwins = RadixTwins.TestCase
TestRadixTwins.settings = settings(max_examples=examples(400), stateful_step_count=40,
                                   deadline=None,
                                   suppress_health_check=[HealthCheck.too_slow])


class TlruTwins(RadixTwins):
    """T-LRU's KV order alone, its bound often at a leaf's start (a small threshold and
    estimate, short edges), leaves loaded from snapshots unmarked; the KV list gives most
    victims (states may take the whole budget, or a pool of their own)."""

    @initialize(spec=st.sampled_from(["small", "paper-7b"]), entries=st.integers(4, 40),
                extra=st.booleans(), chunk=st.sampled_from([2, 5, 8192]),
                slots=st.sampled_from([0, 0, 3, 6]), threshold=st.integers(0, 16),
                estimate=st.integers(0, 8))
    def make(self, spec: str, entries: int, extra: bool,  # type: ignore[override]
             chunk: int, slots: int, threshold: int, estimate: int) -> None:
        self._radix(spec, entries, 0.0, extra, chunk, 1, 1, 1.0, slots, 3, "tlru", threshold,
                    estimate)


TestTlruTwins = TlruTwins.TestCase
TestTlruTwins.settings = settings(max_examples=examples(200), stateful_step_count=40, deadline=None,
                                  suppress_health_check=[HealthCheck.too_slow])


class _MyLRU(LRULeaf):
    """A subclass: it inherits `compiled_as`, which does not count (it may change what
    LRULeaf does)."""


def test_replay_cache_chooses_the_compiled_core_only_for_what_it_runs(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(compiled.CORE_ENV, raising=False)
    assert isinstance(replay_cache(SMALL, "1MB", Judicious(), LRULeaf()), CompiledCache)
    assert isinstance(replay_cache(SMALL, "1MB", Judicious(), FlopAware(SMALL)), CompiledCache)
    assert isinstance(replay_cache(SMALL, "1MB", Block(32), LRULeaf(deepest_first=True)),
                      CompiledCache)
    # vLLM's align mode, paged or not
    for eviction in (BlockLRU(), BlockFlop(SMALL, 1.0, score=MARCONI)):
        for layout in (Layout(page_size=16), Layout()):
            cache = replay_cache(SMALL, "1MB", Align(VLLMConfig(block=16)), eviction,
                                 layout=layout)
            assert isinstance(cache, CompiledCache) and cache.layout == layout
    align = Align(VLLMConfig(block=16))
    for spec, admission, eviction, layout in (
            (SMALL, Judicious(), _MyLRU(), None),
            (SMALL, Judicious(), LRULeaf(), Layout(page_size=16)),
            (SMALL, align, LRULeaf(), None),  # vLLM's align mode runs with its queue only
            (SMALL, Judicious(), BlockLRU(), None),
            (SMALL, align, BlockLRU(), Layout(page_size=16, state_slots=4)),
            (ATTENTION_ONLY, align, BlockLRU(), None)):
        cache = replay_cache(spec, "1MB", admission, eviction, layout=layout)
        assert isinstance(cache, PrefixCache)
        assert compiled.compiled_reason(spec, admission, eviction, layout or Layout())
        with pytest.raises(ValueError, match="the compiled core cannot run this cache"):
            CompiledCache(spec, "1MB", admission, eviction, layout=layout)
    monkeypatch.setenv(compiled.CORE_ENV, "python")
    assert isinstance(replay_cache(SMALL, "1MB", Judicious(), LRULeaf()), PrefixCache)
    monkeypatch.setenv(compiled.CORE_ENV, "fast")
    with pytest.raises(ValueError, match="MARCONI_CORE='fast': expected one of python, compiled"):
        replay_cache(SMALL, "1MB", Judicious(), LRULeaf())


def test_what_it_cannot_hold_is_refused_with_a_reason() -> None:
    cache = CompiledCache(SMALL, "1MB", Judicious(), LRULeaf())
    with pytest.raises(ValueError, match="default namespace only"):
        cache.lookup([1, 2], salt="tenant")
    with pytest.raises(ValueError, match="no handles"):
        cache.commit([1, 2], 1, states={2: "s"})
    with pytest.raises(ValueError, match="empty token list"):
        cache.lookup([])
    with pytest.raises(ValueError, match="n_input=3 outside"):
        cache.commit([1, 2], 3)


@pytest.mark.parametrize("system", ["vanilla", "vllm+", "sglang+", "marconi",
                                    "marconi-inverse-age", "seglen", "sparse-prefix",
                                    "tlru", "vllm-2026",
                                    "vllm-2026+marconi", "sglang-2026", "sglang-2026-extra",
                                    "sglang-2026+marconi", *DECLARED])
@pytest.mark.parametrize("replay", ["sequential", "concurrent", "serving"],
                         ids=["in-order", "concurrent", "serving"])
def test_a_replay_is_the_same_on_both_cores(system: str, replay: str,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The simulator's whole run, the bound and the bootstrap tuner's replays included;
    `concurrent` (the sequential replay's overlap) and `serving`: requests overlap, each
    pinning what it resumes from while it runs."""
    concurrent = replay == "concurrent"
    from marconi.sim import SimConfig, simulate
    from marconi.workload import TraceOptions, load_trace

    trace = load_trace("synthetic:agent", options=TraceOptions(sessions=12, use_cache=False))
    # a capacity that binds: vLLM+'s states every 32 tokens need more room to fit at all
    # (the engines' emulations: 300 MB holds no agent's request)
    capacity = ("10GB" if system == "vllm+" else "1GB" if "2026" in system or system == "tlru"
                else "300MB")
    config = SimConfig(spec=PAPER_7B, capacity=capacity, system=system, concurrent=concurrent,
                       decode_s_per_token=0.05,
                       replay="serving" if replay == "serving" else "sequential")
    runs = {}
    pins: list[object] = []  # the compiled cache's pins (concurrent: one per request)
    pin = CompiledCache.pin
    monkeypatch.setattr(CompiledCache, "pin", lambda self, node: (pins.append(node),
                                                                  pin(self, node))[1])
    from marconi.sim import replay as sim_replay

    looped: list[bool] = []  # the serving loop run by the compiled core, each time asked
    serve = sim_replay.serve_compiled
    monkeypatch.setattr(sim_replay, "serve_compiled", lambda *a, **k: (
        looped.append((out := serve(*a, **k)) is not None), out)[1])
    for core in compiled.CORES:
        monkeypatch.setenv(compiled.CORE_ENV, core)
        result = simulate(trace, config)
        summary = result.summary().to_json()
        summary.pop("seconds")
        runs[core] = (summary, result.records.hit.tolist(), result.records.bound.tolist())
    assert runs["compiled"] == runs["python"]
    if replay == "serving":  # the compiled loop, or a pin per request (and visible chunk)
        assert looped == [False, True] or len(pins) >= len(trace)
    else:
        assert len(pins) == (len(trace) if concurrent else 0)  # it ran compiled, pins too
    summary = runs["python"][0]
    assert summary["evictions"] > 0 or system == "vanilla"  # the capacity binds
    if system in ("marconi", "marconi-inverse-age", "vllm-2026+marconi", "sglang-2026+marconi"):
        assert summary["alpha_status"] == "tuned"


@st.composite
def distributions(draw: st.DrawFn) -> tuple[list[int], list[float], int]:
    """Overlap depths (ascending, distinct), their survival (not increasing, ties common:
    shares of a few requests) and a budget; small depths and few requests make equal
    plans (lines through one point, equal values at a query) common."""
    top = draw(st.sampled_from([12, 40, 2**40]))
    depths = sorted(draw(st.sets(st.integers(1, top), max_size=30)))
    total = draw(st.integers(1, draw(st.sampled_from([4, 50]))))
    counts = sorted(draw(st.lists(st.integers(0, total), min_size=len(depths),
                                  max_size=len(depths))), reverse=True)
    return depths, [c / total for c in counts], draw(st.integers(0, 6))


@settings(max_examples=examples(2000), deadline=None)
@given(distributions())
def test_placement_is_the_python_one(case: tuple[list[int], list[float], int]) -> None:
    """Sparse prefix caching's placement (marconi+'s overlap planner, the sparse-prefix
    peer) on the compiled core: the same checkpoints and the same expected reuse, bit for
    bit, as `place_python`, its oracle."""
    from marconi.peers.sparse_prefix import place_python

    depths, survival, budget = case
    assert compiled.place(depths, survival, budget) == place_python(depths, survival, budget)


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.lists(st.integers(0, 3), max_size=12)),
                max_size=30))
def test_the_sequences_seen_are_the_python_ones(steps: list[tuple[bool, list[int]]]) -> None:
    """The overlap distribution's tree of sequences seen on the compiled core: every
    depth asked is the Python radix tree's (`PySequences`, its oracle), and so is a
    copy's (a deep copy of a planner's)."""
    import copy

    from marconi.peers.sparse_prefix import PySequences

    ours, oracle = compiled.SequenceTree(), PySequences()
    for spell, tokens in steps:
        key = np.asarray(tokens, dtype=np.int32).tobytes()
        if spell:
            ours.spell(key)
            oracle.spell(key)
        assert ours.depth(key) == oracle.depth(key)
    twin = copy.deepcopy(ours)
    twin.spell(np.asarray([9, 9], dtype=np.int32).tobytes())
    assert ours.depth(np.asarray([9, 9], dtype=np.int32).tobytes()) == 0
    back = pickle.loads(pickle.dumps(ours))  # a planner pickled with its cache
    for _, tokens in steps:
        key = np.asarray(tokens, dtype=np.int32).tobytes()
        assert back.depth(key) == oracle.depth(key)


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(st.integers(0, 40), max_size=60), st.integers(0, 45),
       st.one_of(st.none(), st.integers(0, 45)), st.sampled_from([1, 2, 3, 8]))
def test_the_depth_books_are_the_python_ones(learnt: list[int], n: int, pending: int | None,
                                             per_doubling: int) -> None:
    """The overlap depths learnt, on the compiled core: after every request learnt, the
    distinct depths, the distribution up to `n` (with a pending request and without) and
    the thinning of every prefix of it (each ratio a planner uses) equal the Python
    books' (`PyDepthBooks`, the oracle) to the bit, and so do a copy's and a pickled one's."""
    import copy

    from marconi.peers.sparse_prefix import PyDepthBooks

    ours, oracle = compiled.DepthBooks(), PyDepthBooks()
    step = 2.0 ** (1.0 / per_doubling)
    for depth in learnt:
        ours.add(depth)
        oracle.add(depth)
        assert ours.depths() == oracle.depths()
        assert (ours.overlapped, ours.zeros) == (oracle.overlapped, oracle.zeros)
        assert ours.end(n) == oracle.end(n)
        assert ours.distribution(n, pending) == oracle.distribution(n, pending)
        assert ours.distribution(n, None) == oracle.distribution(n, None)
        for end in range(len(oracle.depths()) + 1):
            assert ours.thinned(end, step) == oracle.thinned(end, step)
    for twin in (copy.deepcopy(ours), pickle.loads(pickle.dumps(ours))):
        assert twin.depths() == oracle.depths()
        assert twin.distribution(n, pending) == oracle.distribution(n, pending)
        twin.add(7)
    assert ours.depths() == oracle.depths()  # the copies are their own


@pytest.mark.parametrize("replay", ["sequential", "concurrent", "serving"],
                         ids=["in-order", "concurrent", "serving"])
@pytest.mark.parametrize("trace", ["synthetic:multi-turn", "synthetic:rag", "synthetic:agent"])
def test_marconi_plus_is_the_same_on_both_cores(trace: str, replay: str,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """marconi+'s whole run on either core (its live cache and its shadows): the same
    hits, every expert's total, the same switches. The
    traces name message boundaries (the boundary experts' shadows part from their twins)
    or reuse at depths the overlap planner places; `concurrent`: requests overlap, each
    pinning what it resumes from while it runs."""
    from marconi.sim import SimConfig, simulate
    from marconi.workload import TraceOptions, load_trace

    requests = load_trace(trace, options=TraceOptions(sessions=30, use_cache=False))
    config = SimConfig(spec=PAPER_7B, capacity="400MB", system="marconi+", bounds=False,
                       concurrent=replay == "concurrent", decode_s_per_token=0.05,
                       replay="serving" if replay == "serving" else "sequential")
    runs = {}
    for core in compiled.CORES:
        monkeypatch.setenv(compiled.CORE_ENV, core)
        result = simulate(requests, config)
        summary = result.summary().to_json()
        summary.pop("seconds")
        summary["tuning"].pop("seconds")
        runs[core] = (summary, result.records.hit.tolist())
    assert runs["compiled"] == runs["python"]
    summary = runs["python"][0]
    assert summary["evictions"] > 0  # the capacity binds
    # the experts differ (served, with the shadows held to the live server's timeline,
    # the agent trace leaves two kinds apart)
    assert len(set(summary["tuning"]["totals"].values())) > (1 if replay == "serving" else 3)


def test_marconi_plus_runs_compiled(monkeypatch: pytest.MonkeyPatch) -> None:
    """A replay's marconi+ runs on the compiled core: its live cache (every expert's
    eviction at once) and every default expert's shadow; an engine's (`make_cache`, which
    holds states) and a Transformer's (a node per block) on the Python core."""
    from marconi.plus.shadows import ShadowTuner, apply
    from marconi.systems import get_system, make_cache

    monkeypatch.delenv(compiled.CORE_ENV, raising=False)
    cache = get_system("marconi+").cache(PAPER_7B, "400MB", replay=True)
    assert isinstance(cache, CompiledCache)
    tuner = ShadowTuner()
    tuner.start(cache)
    assert len(tuner.shadows) == 13
    assert all(isinstance(shadow, CompiledCache) for shadow in tuner.shadows)
    for expert in tuner.experts:  # a switch reaches the core
        apply(cache, expert)
        assert cache.eviction.mode is expert.mode
        assert cache._core.run == {Mode.FLOP: 0, Mode.LRU: 1, Mode.DENSITY: 2,
                                   Mode.DEPTH: 3}[expert.mode]
    assert isinstance(make_cache(PAPER_7B, "400MB", "marconi+"), PrefixCache)
    attention = make_cache(ATTENTION_ONLY, "400MB", "marconi+")
    assert "without SSM layers" in (compiled.compiled_reason(
        ATTENTION_ONLY, attention.admission, HitDensity(ATTENTION_ONLY), Layout()) or "")
    marconi = Switchable(PAPER_7B, marconi=True)  # a FLOP-aware expert: not compiled
    assert compiled.compiled_reason(PAPER_7B, Structured(PLAIN), marconi, Layout())


def test_where_it_is_not_built_the_python_core_runs_and_says_so(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(compiled, "_native", None)
    monkeypatch.setattr(compiled, "_told", False)
    monkeypatch.delenv(compiled.CORE_ENV, raising=False)
    for _ in range(2):
        assert isinstance(replay_cache(SMALL, "1MB", Judicious(), LRULeaf()), PrefixCache)
    err = capsys.readouterr().err
    assert err.count("marconi: the compiled core is not built") == 1, err
    monkeypatch.setenv(compiled.CORE_ENV, "compiled")
    with pytest.raises(ValueError, match="MARCONI_CORE=compiled, but the compiled core is "
                                         "not built"):
        replay_cache(SMALL, "1MB", Judicious(), LRULeaf())


def test_the_block_queue_keeps_the_first_state_on_a_tie() -> None:
    """`BlockFlop` over two states, the older one the more efficient: at alpha 1 their
    scores tie (0 + 1 x 1 = 1 + 1 x 0) and the first, the older, leaves (numpy's argmin);
    just above 1 the newer one does. Both cores alike."""
    config = VLLMConfig(block=2)
    older, newer, third = [1] * 9, [2] * 5, [3] * 3  # states at 8 and 4; the longer is
    full = PrefixCache(SMALL, 2**40, Align(config), BlockLRU())  # the more efficient
    for tokens in (older, newer):
        full.serve(np.asarray(tokens, dtype=np.int32).tobytes(), len(tokens))
    capacity = full.stats.bytes + 2 * SMALL.ssm_bytes  # the third request evicts a state
    for alpha, first in ((1.0, 8), (1.01, 4)):
        record: list[Freed] = []
        python = PrefixCache(SMALL, capacity, Align(config), BlockFlop(SMALL, alpha, score=MARCONI),
                             on_evict=record.append)
        twin = CompiledCache(SMALL, capacity, Align(config), BlockFlop(SMALL, alpha, score=MARCONI))
        twin.log_evictions()
        for cache in (python, twin):
            for tokens in (older, newer, third):
                cache.serve(np.asarray(tokens, dtype=np.int32).tobytes(), len(tokens))
        freed = freed_of(record)
        assert freed[0] == ("drop-state", first, SMALL.ssm_bytes)
        assert twin.freed() == freed


def test_sglangs_flop_order_keeps_a_branchs_state_last() -> None:
    """`MambaRadixFlop`: a state at a branch (two or more children) goes after every other,
    though its efficiency over its parent is the lowest. A at [1]*8 and B at [1]*4 + [2]*4
    hold states at 4 (the branch), 8 and 8; at alpha 2 the branch's would score lowest
    (0.5 + 0 against 0 + 2), so the oldest leaf's leaves first. Both cores alike."""
    config = SGLangConfig(chunk=4)  # no-buffer: states at every chunk's end and the input's
    kv, ssm = SMALL.kv_bytes_per_token, SMALL.ssm_bytes
    capacity = 20 * kv + 3 * ssm  # KV for all three, three state slots: C needs two
    record: list[Freed] = []
    flop = MambaRadixFlop(config, SMALL, 2.0, score=MARCONI)
    python = PrefixCache(SMALL, capacity, MambaRadix(config), flop,
                         on_evict=record.append, state_slots=3)
    twin = CompiledCache(SMALL, capacity, MambaRadix(config), flop.fresh(2.0),
                         layout=Layout(state_slots=3))
    twin.log_evictions()
    for cache in (python, twin):
        for tokens in ([1] * 8, [1] * 4 + [2] * 4, [3] * 8):
            cache.serve(np.asarray(tokens, dtype=np.int32).tobytes(), len(tokens))
    freed = freed_of(record)
    assert freed[0] == ("remove", 8, 4 * kv + ssm)  # A's leaf, not the branch's state
    assert twin.freed() == freed


def test_seglens_replay_runs_past_a_stateless_parent() -> None:
    """Sparse prefix caching keeps a split without a state; the leaves below it replay
    from the state above it (here the root), on both cores."""
    caches = [PrefixCache(SMALL, "1GB", SparsePrefix(2), SegLen(0.8)),
              CompiledCache(SMALL, "1GB", SparsePrefix(2), SegLen(0.8))]
    for seq in ([1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 9, 9], [1, 2, 3, 4, 7, 7], [1, 2, 7, 7, 7],
                [5, 5, 5, 5, 5, 1], [5, 5, 5, 5, 5, 2], [5, 5, 5, 5, 5, 3]):
        for cache in caches:
            cache.lookup(seq)
            cache.commit([*seq, 0], len(seq))
    python, twin = caches
    eviction = python.eviction
    assert isinstance(eviction, SegLen)
    stateless = [node for node in eviction.columns.nodes
                 if node.parent is not None and node.parent.parent is not None
                 and not node.parent.has_state]
    assert stateless and all(replay_length(node) == node.depth for node in stateless)
    # replays from the parent would all be equal here: the scores tell them apart
    assert len({replay_length(node) for node in eviction.columns.nodes}) > 1
    assert twin.scores() == eviction.scores(python.clock).tolist()


def test_t_lru_keeps_a_split_heads_high_water_mark() -> None:
    """A retried prefix splits a conversation: the head takes the deep mark of the branch
    below it, so once that branch leaves, the head (now a leaf) is not TEL-safe and a
    later short conversation leaves instead, on both cores."""
    a = list(range(100, 120))
    capacity = 8 * SMALL.kv_bytes_per_token + 3 * SMALL.ssm_bytes
    logs = []
    for core in (PrefixCache, CompiledCache):
        record: list[Freed] = []
        config = SGLangConfig(state_share=1.0)
        policies = MambaRadix(config), TailLRU(config, threshold=10, next_prompt=0)
        cache = (PrefixCache(SMALL, capacity, *policies, on_evict=record.append)
                 if core is PrefixCache else CompiledCache(SMALL, capacity, *policies))
        if isinstance(cache, CompiledCache):
            cache.log_evictions()
        for inp, out in ((a[:19], a[19:]), (a[:5], a[5:6]), ([9, 9, 9], [1]), ([8, 8, 8], [1])):
            cache.lookup(inp)
            cache.commit(inp + out, len(inp))
        logs.append(cache.freed() if isinstance(cache, CompiledCache) else freed_of(record))
    # the branch past the split, then the short conversation, not the head at depth 5
    assert [depth for _, depth, _ in logs[0]] == [19, 3]
    assert logs[1] == logs[0]


def tlru_pair(config: SGLangConfig, threshold: int, estimate: int, capacity: int,
              slots: int) -> tuple[PrefixCache, CompiledCache]:
    """SGLang's admission with T-LRU's lists on either core, empty."""
    def policies() -> tuple[MambaRadix, TailLRU]:
        return MambaRadix(config), TailLRU(config, threshold=threshold, next_prompt=estimate)
    return (PrefixCache(SMALL, capacity, *policies(), state_slots=slots),
            CompiledCache(SMALL, capacity, *policies(), layout=Layout(state_slots=slots)))


def test_t_lru_is_the_same_on_both_cores_over_growing_conversations() -> None:
    """Conversations that grow turn by turn, are retried from a shorter prefix (splits
    under deep marks) and rebuilt from snapshots (unmarked nodes), under small thresholds
    and estimates: T-LRU's victims, trees and counters on both cores, 3,000 seeded
    workloads (its rarer rules differ from LRU on a few dozen of them)."""
    for seed in range(examples(3000)):
        rng = random.Random(seed)
        threshold, estimate = rng.randint(0, 30), rng.randint(0, 10)
        config = SGLangConfig(mode=rng.choice([BufferMode.NO_BUFFER, BufferMode.EXTRA_BUFFER]),
                              chunk=rng.choice([4, 8192]), state_share=1.0)
        slots = rng.choice([0, 4])
        capacity = rng.randint(10, 60) * SMALL.kv_bytes_per_token + (slots + 3) * SMALL.ssm_bytes
        make = (config, threshold, estimate, capacity, slots)
        python, twin = tlru_pair(*make)
        sessions = [[rng.randint(0, 3)] for _ in range(4)]
        for step in range(40):
            if rng.random() < 0.1:  # rebuilt: no node carries a mark
                snap = take(python)
                python, twin = tlru_pair(*make)
                rebuild(snap, python)
                rebuild(snap, twin)
            k = rng.randrange(len(sessions))
            if rng.random() < 0.2:  # retried from a shorter prefix
                sessions[k] = sessions[k][: rng.randint(1, len(sessions[k]))]
            inp = sessions[k] + [rng.randint(0, 9) for _ in range(rng.randint(1, 6))]
            out = [rng.randint(0, 9) for _ in range(rng.randint(0, 4))]
            where = f"seed {seed}, step {step}"
            assert twin.lookup(inp).hit == python.lookup(inp).hit, where
            done, twin_done = python.commit(inp + out, len(inp)), twin.commit(inp + out, len(inp))
            assert (twin_done.refused, twin_done.admitted) == (done.refused, done.admitted), where
            assert twin.take() == take(python), where
            assert twin.stats.copy() == python.stats, where
            sessions[k] = inp + out


def test_sparse_prefix_serves_as_a_lookup_and_a_commit() -> None:
    """A serve of the sequence just committed learns that commit first (its lookup's
    plan), as the Python core's serve does, before it commits the same tokens again."""
    caches = [PrefixCache(SMALL, "1GB", SparsePrefix(3), LRULeaf()),
              CompiledCache(SMALL, "1GB", SparsePrefix(3), LRULeaf())]
    plans = []
    for cache in caches:
        cache.lookup([0])
        cache.commit([0], 1)
        cache.serve_tokens(np.asarray([0], dtype=np.int32), 1)
        plan = cache.lookup([0])
        plans.append((plan.hit, plan.checkpoints, cache.stats.copy()))
    assert plans[0][1] == (1,)  # the two learnt overlaps place a checkpoint at 1
    assert plans[1] == plans[0]
