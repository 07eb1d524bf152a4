"""Shadow experts: `marconi+` picks its admission and eviction by what would have worked.

Every expert is one way to run the cache: which message boundaries admission may
checkpoint (none, the first, the last) and which eviction runs (hit density, hit density
with leaves classed by depth, or GreedyDual-FLOP), and `sglang+`'s own configuration
(`SGLANG_PLUS`: judicious admission, LRU over leaves), so marconi+ can always fall back on
it (LRU at other boundaries, and Marconi's FLOP-aware score at a fixed alpha
(`MARCONI_ALPHAS`), are there for ablations: as more experts they lost more than they
won, experiments/RESULTS.md). Each has a
*shadow*: a cache of the same spec and capacity that holds token ids only (no tensors,
no store) and sees every request the live cache commits. Every `every` requests the
live cache switches to the expert whose shadow has saved the most FLOPs so far, if it
beats the running one by more than `threshold` (relative): follow the leader, with
hysteresis against noise (the rule and its settings: `marconi.plus.switching`).
Switching is not free (the live cache keeps what the old expert chose), so the lead must
be decisive, 5%, from the first request: a switch of admission that comes late cannot
take the checkpoints the leader took before it (asking a quarter more in the first 128
requests followed RAG's placement and a Mooncake window's last-boundary expert late, up
to 1.9 points lost; once the overlap expert's cold start checkpointed the first message
boundary, the early noise that had asked for it cost nothing, experiments/RESULTS.md);
leads of a few tenths of a point flip between near-equal experts and cost more than they
gain (experiments/RESULTS.md). The engines' chooser, whose experts are evictions only
(free to switch back), keeps a quarter in its first 128
(`integrations.choosers.ENGINE_WARMUP_LEAD`).
Two leads are absolute, as shares of what a cache holding every input would have saved
(`possible`), each worth at least one average request: any leader 2 points ahead is
followed at once (`clear_lead`), and `sglang+`'s configuration 0.1 point ahead (`lead`).
And a guard: while the live cache's own record (counted from its hit tokens) trails
`sglang+`'s shadow by more than `lead`, `sglang+`'s configuration runs, so marconi+ does
not stay below its own LRU configuration; once it has fired, it reads the record since
(`since`), and a leader on the whole record that also leads clearly since is followed
away, so a deficit already paid does not hold marconi+ on `sglang+`'s configuration for
ever (docs/architecture.md, "marconi+'s regret", states the rules and the bounds).
With `hedge` (`marconi+-hedge`: its first 32 requests, until a commit is refused) the
live cache admits at every expert's positions at once, whichever expert runs, so that an
early switch finds the winner's first checkpoints in place (a switch cannot take them
after the fact); not marconi+'s default (experiments/RESULTS.md: on the agent
trajectories at a contended capacity the extra states cost a point).
`half_life` (off by default) decides on totals that forget: each request's saving
weighted 2^(-age / half_life), so a leader of long ago is not followed for ever.
A model without SSM layers runs one expert and no shadows (`ATTENTION_ONLY`).

A trace that names no message boundary (the paper artifact's token-id JSONL, raw prompts)
gives a boundary expert's shadow exactly its no-boundary twin's requests and checkpoints:
until a request names one, those six shadows are not fed (each takes its twin's total),
and at the first that does each becomes a copy of its twin's (`core.snapshot.clone`) and
goes its own way. The totals, switches and shadows are those of feeding them all.

Long streams are sampled (a miniature simulation, Waldspurger et al., ATC'17): once
`sample_after` requests have been observed, the shadows are rebuilt empty at
`sample_rate` of the capacity and from then on see only the sessions whose hash falls in
that share of the hash space, each sampled request's saving counted 1/`sample_rate` times.
Each shadow then costs `sample_rate` of what it did. Only a driver that names each
request's session (the simulator) gets this; one that does not (the engine) keeps feeding
every shadow every request, and so does a stream whose sessions average fewer than two
requests (Mooncake's, a session per request: its reuse is across sessions, which a sample
of sessions would split). Streams shorter than `sample_after` are replayed exactly as
without sampling.

Under the serving replay the shadows are served as the live cache is: each follows the
live server's lookups, shows and finishes (`scheduled`, `shown`, `finished`; a
`core.serving.Mirror` each), holding its running requests' memory, and is credited at the
lookup; every shadow is fed from the first request (no twins: a twin's running requests
would not move to its copy).

```
request -> live cache (lookup, prefill, commit) -> observe -> every shadow: lookup + commit
                 ^                                                  | totals
                 +------------ every `every` requests: adopt the leader
```
Why shadows and not Marconi's replay of one bootstrap window: a window's best setting is
often not the next window's, while a shadow's total is the policy's whole record on the
real stream, and keeping it costs one token-level lookup and commit per expert per
request: no tensors, no snapshots, no pauses. A shadow's memory is its radix tree, about
4 bytes per cached token.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import cast

import numpy as np

from marconi.core.cache import PrefixCache
from marconi.core.serving import Mirror, Request
from marconi.core.snapshot import clone
from marconi.core.tokens import as_tokens
from marconi.core.tuning import Objective, decisive, hit_worth
from marconi.plus.admission import Structured
from marconi.plus.experts import (  # re-exported: marconi+'s experts, as they were imported
    ATTENTION_ONLY,
    DEFAULT_EXPERTS,
    EVICTION_NAMES,
    EXPERTS,
    HEDGE,
    MARCONI_ALPHAS,
    MESSAGE_BOUNDARIES,
    OVERLAP_MEMORY,
    SGLANG_PLUS,
    Boundaries,
    Expert,
    _policies,
    _shadow,
    _use_boundaries,
    apply,
)
from marconi.plus.overlap import OverlapPlanner
from marconi.plus.switching import ShadowConfig, leader  # marconi+'s switching rule

__all__ = [  # the experts' names are `marconi.plus.experts`', the rule's
    # `marconi.plus.switching`', re-exported here
    "ATTENTION_ONLY", "DEFAULT_EXPERTS", "EVICTION_NAMES", "EXPERTS", "HEDGE",
    "MARCONI_ALPHAS", "MESSAGE_BOUNDARIES", "OVERLAP_MEMORY", "SGLANG_PLUS", "Boundaries",
    "Expert", "ShadowConfig", "ShadowReport", "ShadowTuner", "Switch", "apply", "leader",
    "shadow_tuner"]


@dataclass(slots=True)
class Switch:
    at: int  # requests observed when the switch happened
    expert: Expert


@dataclass(frozen=True, slots=True)
class ShadowReport:
    """What the shadows did: the expert running at the end, requests seen, the seconds
    spent feeding shadows, every switch, each expert's total (what its shadow saved, in
    the objective's unit) and the requests each ran for; `possible`: what a cache holding
    every input would have saved; `sampled_from`: the request from which the shadows saw
    a `sample_rate` share of the sessions (None: every request)."""

    expert: Expert
    requests: int
    seconds: float
    switches: tuple[Switch, ...]
    totals: dict[Expert, float]
    sampled_from: int | None = None
    sample_rate: float = 1.0
    ran: dict[Expert, int] = field(default_factory=dict)
    possible: float = 0.0
    # how far the live cache may trail the best expert's total, and `sglang+`'s (None: not
    # an expert), by the switching rule (`ShadowTuner._bounds`)
    bound: float | None = None  # None: the rule bounds nothing (`half_life`)
    sglang_bound: float | None = None

    @property
    def best(self) -> Expert:
        """The expert whose shadow saved the most (the first of equals)."""
        return max(self.totals, key=lambda e: self.totals[e])

    @property
    def ran_most(self) -> Expert:
        """The expert that ran for the most requests (the first of equals)."""
        return max(self.ran, key=lambda e: self.ran[e]) if self.ran else self.expert

    def to_json(self) -> dict[str, object]:
        return {"expert": str(self.expert), "requests": self.requests, "seconds": self.seconds,
                "switches": [(s.at, str(s.expert)) for s in self.switches],
                "totals": {str(e): t for e, t in self.totals.items()},
                "ran": {str(e): n for e, n in self.ran.items()},
                "best": str(self.best), "ran_most": str(self.ran_most),
                "possible": self.possible, "bound": self.bound,
                "sglang_expert": str(SGLANG_PLUS) if SGLANG_PLUS in self.totals else None,
                "sglang_bound": self.sglang_bound,
                "sampled_from": self.sampled_from, "sample_rate": self.sample_rate}


@dataclass(slots=True)
class ShadowTuner:
    """Feeds the shadows after every commit and switches the live cache to the leader."""

    config: ShadowConfig = field(default_factory=ShadowConfig)
    experts: tuple[Expert, ...] = ()  # what runs: config.experts, or ATTENTION_ONLY
    shadows: list[PrefixCache] = field(default_factory=list)
    totals: np.ndarray = field(default_factory=lambda: np.zeros(0))
    recent: np.ndarray = field(default_factory=lambda: np.zeros(0))  # decayed (half_life)
    current: int = 0  # index of the running expert
    seen: int = 0  # requests observed
    # what a cache holding every input would have saved on the requests seen (the
    # objective's unit): the scale of `ShadowConfig.lead`
    possible: float = 0.0
    recent_possible: float = 0.0  # the same, decayed as `recent` is (`half_life`)
    warm: np.ndarray | None = None  # each expert's total when the warmup ended
    # what the live cache itself saved (the objective's unit; from its hit tokens), and
    # decayed as `recent` is: what the guard compares with `sglang+`'s shadow
    live: float = 0.0
    recent_live: float = 0.0
    _hit_tokens: int = 0  # the live cache's hit tokens at the last observe
    # requests observed while each expert ran
    ran: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    seconds: float = 0.0  # spent feeding shadows (the tuner's whole overhead)
    switches: list[Switch] = field(default_factory=list)
    sampled_from: int | None = None  # requests observed when sampling began
    rate: float = 1.0  # the share of sessions the shadows see
    _cut: int = 1 << 64  # a session is sampled when its 64-bit hash is below this
    # distinct sessions seen until sampling is settled (then None)
    _sessions: set[str] | None = field(default_factory=set)
    # until a request names a message boundary, a boundary expert's shadow is its
    # no-boundary twin's: expert index -> the twin's index (its shadow is not fed)
    _twins: dict[int, int] = field(default_factory=dict)
    # where an expert is Boundaries.OVERLAP: the overlap planner its admissions share,
    # taught every request observed (`marconi.plus.overlap`)
    planner: OverlapPlanner | None = None
    # the admissions the experts add to judicious (`config.hedge`): their union runs live
    # during the first `hedge` requests (empty: one admission, nothing to hedge)
    union: frozenset[Boundaries] = frozenset()
    hedging: bool = False  # the union runs now
    # where the guard's record starts (None: the first request): at each time it fires,
    # the totals, the live cache's saving, the possible and the requests seen, so that a
    # deficit already paid is not held against the live cache for ever (`_guarded`;
    # decayed totals, `half_life`, forget it anyway and keep no start)
    since: tuple[np.ndarray, float, float, int] | None = None
    guard_fires: int = 0
    # the average request of each record the guard closed, summed: what the fires add to
    # the bound against `sglang+` (`_bounds`)
    _closed: float = 0.0
    # served (a serving replay's driver calls `scheduled`): each shadow follows the live
    # server's lookups, shows and finishes through its `Mirror`, credited at its lookup
    served: bool = False
    mirrors: list[Mirror] = field(default_factory=list)
    _served_hits: int = 0  # served: the live cache's hit tokens at its kept lookups

    @property
    def expert(self) -> Expert:
        return (self.experts or self.config.experts)[self.current]

    def observe(self, cache: PrefixCache, tokens: np.ndarray, n_input: int,
                boundaries: Sequence[int] = (), session: str | None = None, *,
                arrival: float | None = None) -> None:
        """Called by the driver after each commit of the live cache. `session`: the
        request's session (conversation, agent run), where the driver knows it; with it,
        a long stream's shadows are sampled by session (module docstring). `arrival` is
        not read: in turn, each shadow serves the request now, after the live cache's
        commit; served (the serving replay calls `scheduled`, `shown`, `finished`), the
        shadows were fed on the live server's timeline and this only counts and decides.

        In order: start-up (the first call builds the shadows), decay of the recent
        totals, sampling (count the session, settle), twins (part at the first boundary),
        feeding the shadows, teaching the overlap planner (if any), and every `every`
        requests the switch to the leader."""
        start = time.perf_counter()
        if not self.experts:
            self._start(cache)
        self._decay()
        self._note_session(cache, session)
        if self._twins and len(boundaries):
            self._part(cache)
        sees = self._sees(session) and not self.served  # served: fed by their mirrors
        if sees or self.planner is not None:
            key = as_tokens(tokens, what="observe: tokens").tobytes()  # once, not per shadow
            if sees:
                self._feed(key, n_input, boundaries)
            if self.planner is not None:  # every request, sampled or not (after the shadows:
                self.planner.learn(key, n_input)  # they plan it as the live cache did)
        self.seen += 1
        if self.hedging and (self.seen >= self.config.hedge or cache.stats.refused_commits):
            self.hedging = False  # the hedge ends: the running expert's admission alone
            self._apply(cache)
        self.ran[self.current] += 1
        self._count_live(cache, int(n_input))
        if self.seen == self.config.warmup:
            self.warm = self.totals.copy()
        if self.config.decides(self.seen):
            self._decide(cache)
        self.seconds += time.perf_counter() - start

    # --- served shadows (`marconi.core.serving.Follower`) ---------------------------------

    def scheduled(self, cache: PrefixCache, i: int, request: Request, hit: int) -> None:
        """The live server scheduled request `i`, its hit `hit`: every shadow that sees
        it looks it up now, on its own memory, and its hit is credited now, as the live
        cache's is (a lookup the server asked again, the request not fitting yet, is not
        in `hit`: the live record counts the one it kept, not `cache.stats`)."""
        start = time.perf_counter()
        if not self.experts:
            self.served = True  # before the shadows are built: no twins (`_start`)
            # the first expert runs from the first request, as in a server (which calls
            # `start`): a first-boundary start checkpoints the first prompt's boundary
            self._start(cache)
        self._served_hits += hit
        if self.served and self._sees(request.session_id):
            weight, flops = 1.0 / self.rate, self.config.objective is Objective.FLOPS
            for k, mirror in enumerate(self.mirrors):
                hit = mirror.lookup(i, request)
                gain = (mirror.cache.spec.flops(hit) if flops else float(hit)) * weight
                self.totals[k] += gain
                if self.config.half_life is not None:
                    self.recent[k] += gain
        self.seconds += time.perf_counter() - start

    def shown(self, i: int, request: Request, n: int) -> None:
        """The live server made request `i`'s first `n` input tokens visible."""
        if self.served and self._sees(request.session_id):
            for mirror in self.mirrors:
                mirror.show(i, n)

    def finished(self, i: int, request: Request) -> None:
        """Request `i` finished on the live server (before `observe`)."""
        start = time.perf_counter()
        if self.served and self._sees(request.session_id):
            for mirror in self.mirrors:
                mirror.finish(i, request)
        self.seconds += time.perf_counter() - start

    def _build(self, shadows: list[PrefixCache]) -> None:
        """Make `shadows` the shadows (served: each with its mirror, holding the running
        requests' memory as the live server's reservations do)."""
        self.shadows = shadows
        self.mirrors = [Mirror(shadow) for shadow in shadows] if self.served else []

    def _decay(self) -> None:
        """Age the decayed totals by one request (`half_life`; none: nothing to age)."""
        half_life = self.config.half_life
        if half_life is not None:
            self.recent *= 0.5 ** (1.0 / half_life)
            self.recent_possible *= 0.5 ** (1.0 / half_life)
            self.recent_live *= 0.5 ** (1.0 / half_life)

    def _note_session(self, cache: PrefixCache, session: str | None) -> None:
        """Count the request's session until sampling is settled, and settle it once
        `sample_after` requests have been observed (`_settle`)."""
        if self._sessions is not None and session is not None:
            self._sessions.add(session)
            sample_after = self.config.sample_after
            if sample_after is not None and self.seen >= sample_after:
                self._settle(cache)

    def _sees(self, session: str | None) -> bool:
        """Whether the shadows see a request of `session`: every request until sampling
        began, then those of the sampled sessions."""
        return self.sampled_from is None or (session is not None and _hash(session) < self._cut)

    def _feed(self, key: bytes, n_input: int, boundaries: Sequence[int]) -> None:
        """Serve the request on every shadow that is fed and add its saving, weighted
        1/`rate`, to that expert's totals; a twin takes its twin's totals."""
        config, twins = self.config, self._twins
        weight = 1.0 / self.rate
        for k, shadow in enumerate(self.shadows):
            if k in twins:
                continue
            gain = hit_worth(shadow, key, n_input, boundaries, config.objective) * weight
            self.totals[k] += gain
            if config.half_life is not None:
                self.recent[k] += gain
        for k, twin in twins.items():
            self.totals[k] = self.totals[twin]
            self.recent[k] = self.recent[twin]

    def start(self, cache: PrefixCache) -> None:
        """Build the shadows and run the first expert on `cache` now, not after its first
        commit."""
        if not self.experts:
            self._start(cache)

    def _start(self, cache: PrefixCache) -> None:
        experts = self.config.experts if cache.spec.ssm_layers else ATTENTION_ONLY
        self.experts = experts
        if any(e.boundaries is Boundaries.OVERLAP for e in experts):
            admission, _ = _policies(cache)
            if admission.planner is None:
                admission.planner = OverlapPlanner(memory=self.config.overlap_memory)
            self.planner = admission.planner  # `_shadow` shares it
        if len(experts) > 1:  # one expert: nothing to compare, no shadows to feed
            self._build([_shadow(cache, expert, 1.0, self.config.cold_boundary)
                         for expert in experts])
            # message-boundary experts only: the overlap expert differs without boundaries;
            # served shadows are all fed (a twin's running requests would not move with it)
            plain = {(e.mode, e.alpha): k for k, e in enumerate(experts)
                     if e.boundaries is Boundaries.NONE}
            self._twins = {} if self.served else {
                k: plain[e.mode, e.alpha] for k, e in enumerate(experts)
                if e.boundaries in (Boundaries.FIRST, Boundaries.LAST)
                and (e.mode, e.alpha) in plain}
        self.totals = np.zeros(len(experts))
        self.recent = np.zeros(len(experts))
        self.ran = np.zeros(len(experts), dtype=np.int64)
        if not self.shadows or self.config.sample_after is None or self.config.sample_rate >= 1:
            self._sessions = None  # never sampled: keep no sessions (a huge trace's names)
        if len(experts) > 1:
            self.union = frozenset(e.boundaries for e in experts) - {Boundaries.NONE}
        self.hedging = bool(self.union) and self.config.hedge > 0
        self._apply(cache)

    def _apply(self, cache: PrefixCache) -> None:
        """Run the current expert on the live cache, its admission the experts' union
        while the hedge lasts (`config.hedge`)."""
        apply(cache, self.expert, self.union if self.hedging else None,
              self.config.cold_boundary)

    def _part(self, cache: PrefixCache) -> None:
        """The first request that names a message boundary: each boundary expert's shadow
        becomes a copy of its twin's (the same requests, with no boundary to tell them
        apart, made them equal), now checkpointing its own boundaries."""
        for k, twin in self._twins.items():
            expert = self.experts[k]
            shadow = clone(self.shadows[twin], () if self.planner is None else (self.planner,))
            assert isinstance(shadow.admission, Structured)  # built by `_shadow`
            _use_boundaries(shadow.admission, expert, self.config.cold_boundary)
            shadow.name = f"{cache.name} shadow {expert}"
            self.shadows[k] = shadow
        self._twins = {}

    def _settle(self, cache: PrefixCache) -> None:
        """Sample from now on if sessions are what requests reuse: two requests a session
        or more on average. Otherwise (a trace of one-request sessions, Mooncake's: its
        reuse is across sessions) a sample of sessions would split what is reused, so the
        shadows stay exact."""
        distinct, self._sessions = len(self._sessions or ()), None
        if 2 * distinct <= self.seen + 1:  # the request just observed counts
            self._sample(cache)

    def _sample(self, cache: PrefixCache) -> None:
        """From now on the shadows see a `sample_rate` share of the sessions: rebuilt
        empty at that share of the capacity (the totals so far are kept)."""
        rate = self.config.sample_rate
        self.rate, self.sampled_from = rate, self.seen
        self._cut = int(rate * (1 << 64))
        self._build([_shadow(cache, expert, rate, self.config.cold_boundary)
                     for expert in self.experts])

    def _count_live(self, cache: PrefixCache, n_input: int) -> None:
        """Add the request to the possible and what the live cache saved on it: its hit
        tokens since the last observe (a driver's one lookup per request; a concurrent
        replay's interleaved lookups are summed, which is exact for the tokens objective
        and close for FLOPs)."""
        flops = self.config.objective is Objective.FLOPS
        hits = self._served_hits if self.served else cache.stats.hit_tokens
        hit, self._hit_tokens = max(0, hits - self._hit_tokens), hits
        whole = cache.spec.flops(n_input) if flops else float(n_input)
        saved = cache.spec.flops(hit) if flops else float(hit)
        self.possible += whole
        self.recent_possible += whole
        self.live += saved
        self.recent_live += saved

    def _possible(self) -> float:
        """The scale of the absolute lead: the objective's total over the requests seen,
        decayed as the scores are (`half_life`)."""
        return self.possible if self.config.half_life is None else self.recent_possible

    def _decide(self, cache: PrefixCache) -> None:
        config = self.config
        safe = self.experts.index(SGLANG_PLUS) if SGLANG_PLUS in self.experts else None
        if config.half_life is not None:  # decayed records forget a deficit anyway
            best = leader(self.recent, self.current, self.seen, config, self._possible(),
                          safe, self.recent_live)
        else:
            best = self._guarded(safe)
        if best != self.current:
            self.current = best
            self.switches.append(Switch(self.seen, self.expert))
            self._apply(cache)

    def _guarded(self, safe: int | None) -> int:
        """`leader` on the whole record, with the guard on the record since it last fired
        (`since`). A guard on the whole record, once it has fired, can hold `sglang+`'s
        configuration for ever: the deficit is paid by then, and running that
        configuration cannot earn it back (its shadow earns what the live cache earns).
        So where the live cache still trails on the whole record, a leader is followed
        away from `sglang+`'s configuration when it leads on the whole record by rule 2
        and on the record since by the clear lead (`clear_lead` of the possible and one
        average request), once that record is `settle` requests long, twice as long
        after each further fire (a switch may cost what the guard saw; the fires grow as
        the log of the stream's length). Until the guard first fires both records are
        one, and the rule is `leader`'s."""
        config, totals, live, possible, seen = (self.config, self.totals, self.live,
                                                self.possible, self.seen)
        if safe is None:
            return leader(totals, self.current, seen, config, possible)
        since = (totals, live, possible, seen)
        if self.since is not None:
            at = self.since
            since = (totals - at[0], live - at[1], possible - at[2], seen - at[3])
        s_totals, s_live, s_possible, s_seen = since
        if s_seen >= config.settle \
                and decisive(s_totals[safe] - s_live, s_possible, s_seen, config.lead):
            self.guard_fires += 1  # the guard fires: `sglang+`'s configuration runs
            self._closed += s_possible / s_seen
            self.since = (totals.copy(), live, possible, seen)
            return safe
        best = leader(totals, self.current, seen, config, possible, safe)  # rules 2-4
        trails = seen >= config.settle \
            and decisive(totals[safe] - live, possible, seen, config.lead)
        if self.current == safe and best != safe and trails:
            clear = replace(config, threshold=math.inf, early_threshold=math.inf)
            if s_seen < config.settle << max(self.guard_fires - 1, 0) \
                    or leader(s_totals, safe, s_seen, clear, s_possible) != best:
                return safe
        return best

    def report(self) -> ShadowReport:
        """What the tuner did so far."""
        return ShadowReport(self.expert, self.seen, self.seconds, tuple(self.switches),
                            {e: float(t) for e, t in zip(self.experts, self.totals, strict=True)},
                            self.sampled_from, self.rate,
                            {e: int(n) for e, n in zip(self.experts, self.ran, strict=True)},
                            self.possible, *self._bounds())

    def _bounds(self) -> tuple[float | None, float | None]:
        """What the switching rule bounds (docs/architecture.md, "marconi+'s regret"), in
        the objective's unit: how far the live cache may trail the best expert, and
        `sglang+`'s configuration (None: not an expert here). Each is the rule's margin
        (`threshold` of the best's total; `lead` of the possible), plus what that expert
        saved during the warmup (decided on `early_threshold`), plus one decision window at its
        average rate; against `sglang+`, each time the guard fired adds the average request
        of the record it closed and one more window. Decayed totals (`half_life`) bound
        nothing: (None, None)."""
        if self.config.half_life is not None or not self.seen or not len(self.totals):
            return None, None
        config, totals = self.config, self.totals
        warm = totals if self.warm is None else self.warm
        best = int(np.argmax(totals))
        window = config.every / self.seen
        bound = (config.threshold / (1 + config.threshold) * totals[best] + warm[best]
                 + window * totals[best])
        if SGLANG_PLUS not in self.experts:
            return float(bound), None
        k = self.experts.index(SGLANG_PLUS)
        fires = self.guard_fires
        return float(bound), float(config.lead * self.possible + warm[k] + self._closed
                                   + (1 + fires) * window * totals[k])


def _hash(session: str) -> int:
    """A session's place in the hash space: stable across processes (not `hash`)."""
    return int.from_bytes(hashlib.blake2b(session.encode(), digest_size=8).digest(), "little")


def shadow_tuner(modes: Sequence[str], boundaries: bool, settings: Mapping[str, object], *,
                 first_boundary: bool = False, overlap: bool = True,
                 overlap_memory: int | None = OVERLAP_MEMORY, hedge: int = 0) -> ShadowTuner:
    """marconi+'s tuner over the experts of these eviction `modes` (with every message
    boundary choice, or none without `boundaries`, the overlap expert's cold start on the
    first boundary included; with the overlap planner's positions too if `overlap`, the
    planner keeping `overlap_memory` tokens of sequences, None:
    all) and `sglang+`'s configuration (`SGLANG_PLUS`), the first running until a leader
    emerges; with `first_boundary` (a chat server), the first-message boundary expert
    starts; the live cache hedges its admission for the first `hedge` requests.

    From the run's `settings` it takes `objective` and `shadow_sample_after` (absent: the
    `ShadowConfig` defaults, exact shadows)."""
    choices = {Boundaries.NONE, *(MESSAGE_BOUNDARIES if boundaries else ()),
               *((Boundaries.OVERLAP,) if overlap else ())}
    experts = tuple(e for e in EXPERTS if e.mode.value in modes and e.boundaries in choices)
    if SGLANG_PLUS not in experts:  # `sglang+`'s configuration is always one to fall back on
        experts = (*experts, SGLANG_PLUS)
    first = Expert(Boundaries.FIRST, experts[0].mode)
    if first_boundary and first in experts:
        experts = (first, *(e for e in experts if e != first))
    sample_after = cast("int | None", settings.get("shadow_sample_after"))
    objective = Objective(settings.get("objective", Objective.FLOPS))
    return ShadowTuner(ShadowConfig(experts=experts, objective=objective,
                                    sample_after=sample_after, overlap_memory=overlap_memory,
                                    hedge=hedge, cold_boundary=boundaries))
