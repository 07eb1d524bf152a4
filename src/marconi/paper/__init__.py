"""The paper's policies: judicious / block / no admission, LRU and FLOP-aware eviction,
and the bootstrap alpha tuner."""
