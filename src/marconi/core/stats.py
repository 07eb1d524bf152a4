"""Counters a cache keeps about itself; updated incrementally, never by a tree walk."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace


@dataclass(slots=True)
class CacheStats:
    lookups: int = 0
    commits: int = 0
    input_tokens: int = 0  # summed over lookups
    hit_tokens: int = 0  # summed over lookups
    hit_requests: int = 0  # lookups with a hit > 0
    states_admitted: int = 0
    states_evicted: int = 0
    states_not_captured: int = 0  # admission wanted a state the engine did not supply
    states_replaced: int = 0  # states a commit superseded (a partial block that grew)
    evictions: int = 0  # victims taken (leaves removed, nodes merged, states dropped)
    refused_commits: int = 0  # sequences bypassed: they could not fit even in an empty cache
    evicted_then_refused: int = 0  # of which some entries were evicted first (a policy bug)
    kv_bytes: int = 0  # held now (whole pages under a paged layout)
    ssm_bytes: int = 0  # held now
    states: int = 0  # held now (what a state-slot pool bounds)
    peak_bytes: int = 0

    @property
    def bytes(self) -> int:
        return self.kv_bytes + self.ssm_bytes

    def record_lookup(self, n_input: int, hit: int) -> None:
        self.lookups += 1
        self.input_tokens += n_input
        self.hit_tokens += hit
        self.hit_requests += hit > 0

    def add_bytes(self, *, kv: int, ssm: int, states: int = 0) -> None:
        self.kv_bytes += kv
        self.ssm_bytes += ssm
        self.states += states
        self.peak_bytes = max(self.peak_bytes, self.bytes)

    def record_eviction(self, kv: int, ssm: int, *, state: bool) -> None:
        self.evictions += 1
        self.states_evicted += ssm > 0
        self.states -= state
        self.kv_bytes -= kv
        self.ssm_bytes -= ssm

    def record_replacement(self, ssm: int, *, kv: int = 0) -> None:
        """A state superseded by a commit (`kv`: a page copy its merge freed)."""
        self.states_replaced += 1
        self.states -= 1
        self.ssm_bytes -= ssm
        self.kv_bytes -= kv

    def copy(self) -> CacheStats:
        return replace(self)

    def as_dict(self) -> dict[str, int]:
        return asdict(self) | {"bytes": self.bytes}
