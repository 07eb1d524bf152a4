"""Segmented LRU, as SGLang's `--radix-eviction-policy slru` orders its radix tree: leaves
in the probationary segment (hit count below 2) before those in the protected one, least
recently used first within each (docs/peers.md, "Other baselines"). Declared as a
`Priority`: a step term is the segment."""

from __future__ import annotations

from marconi.core.priority import Feature, Key, Priority, Term

PROTECTED_AT = 2  # SGLang's `SLRUStrategy(protected_threshold=2)`

SLRU = Priority("slru", keys=(Key(Term(Feature.HITS, at_least=PROTECTED_AT)),
                              Key(Term(Feature.RECENCY))),
                description="probationary leaves (hit count below 2) before protected ones, "
                            "each least recently used first")
