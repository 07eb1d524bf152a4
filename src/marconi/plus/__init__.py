"""marconi+: structured admission, hit-density and GreedyDual-FLOP eviction, and shadow
experts that choose among them online."""
