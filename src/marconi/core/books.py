"""`CoreBooks`: what an eviction hands the compiled core before any request
(docs/architecture.md, "The compiled core"), its declarations and books, each read by one
setter of `Core`. `core.policy.Eviction.core_books` returns them; `core.compiled` hands
them over."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from marconi.core.priority import Lists, Priority, Score
from marconi.core.scores import ListScore


@dataclass(frozen=True)
class CoreBooks:
    """What an eviction the compiled core runs hands it before any request, beside its
    name (`compiled_as`): its declaration and books, each read by one setter of `Core`, so
    the compiled core reads no policy's attributes. An eviction that has any defines
    `core_books()` (`core.policy.Eviction`'s hands nothing)."""

    keys: Priority | None = None  # a declared priority (`set_keys`)
    score: Score | None = None  # a declared score over the candidates (`set_score_terms`)
    level: float = 0.0  # a leveled score's level so far (`set_level`)
    densities: tuple[tuple[Any, ...], ...] = ()  # learned densities' books (`set_density`)
    # marconi+'s live cache: its learned experts' declared scores, over `densities` in turn
    # (`set_learned_terms`)
    learned: tuple[Score, ...] = ()
    run: int | None = None  # marconi+'s live cache: the expert choosing (`set_run`)
    # an engine's two lists, declared (`set_lists`)
    lists: Lists | None = None
    # a declared score over an engine's state list (`set_state_score`)
    state_score: ListScore | None = None
    state_share: float | None = None  # SGLang's pools: the states' share (`set_pool`)
    cap_per_path: int | None = None  # SGLang's cap on states per path (not compiled)
