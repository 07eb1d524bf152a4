"""Marconi's FLOP-aware eviction inside SGLang 0.5.23 (docs/integrations.md).

In a deployment whose SGLang environment has marconi installed, one variable turns it on:

    MARCONI_SGLANG=marconi MARCONI_MODEL=paper-7b python -m sglang.launch_server ...

SGLang loads every general plugin (entry-point group `sglang.srt.plugins`) early in each
scheduler process; marconi's (`plugin`, declared in marconi's package metadata) does
nothing unless `MARCONI_SGLANG` is set. When it is, `install` puts in, before any cache is
built:

- **the eviction order of SGLang's Mamba states**: `COMPONENT_REGISTRY[ComponentType.MAMBA]`
  becomes `MarconiMamba` (`mamba_component`: `MarconiWalk` before SGLang's own
  `MambaComponent`), which overrides the three walk methods SGLang's tree core calls
  (`_evict_device_start`, `_evict_device_next_node`, `_evict_device_end`), each calling
  SGLang's own. The walk visits the states the stock walk would (unlocked, in the Mamba
  LRU list) in Marconi's order: lowest `recency + alpha x efficiency` first, both min-max
  normalized over the candidates, `efficiency = (F(depth) - F(parent depth)) / (edge KV
  bytes + state bytes)` as in marconi (`paper.eviction.FlopAware`), recency the state's
  rank in SGLang's own Mamba LRU list. With alpha > 0 a state whose node has two or more
  children comes after every other (marconi never evicts one); at alpha 0 the order is
  SGLang's LRU exactly, so until the tuner's first choice the engine runs stock. Each step
  puts the next state under SGLang's walk cursor and SGLang's own step evicts it: a leaf
  with its KV, an inner state tombstoned (its KV kept), now-childless parents cascaded.
  The Full (KV) component's order is left as SGLang has it (`--radix-eviction-policy`):
  Marconi's score decides which states leave, and a KV leaf goes with its state as in
  SGLang. SGLang's eviction-strategy registry (`EvictionStrategy.get_priority(node)`,
  selected with `--radix-eviction-policy`) cannot carry this order: in 0.5.23 only the
  Full component's walk asks it, the Mamba walk follows its LRU list (docs/
  integrations.md, "Why the Mamba walk is a hook").
- **the bootstrap tuner beside the engine**: `UnifiedRadixCache.on_release` (called once
  per finished request, after its KV went into the tree) is wrapped to hand the request's
  tokens to `Tuning`, which runs a marconi mirror of the cache (system
  `sglang-2026+marconi`: SGLang's admission as emulated, Marconi's eviction, the engine's
  pools) and marconi's
  `BootstrapTuner` over it, in a background thread: the replays never run in the
  scheduling loop. The alpha it adopts is the engine's from its next eviction.
  `MARCONI_ALPHA` fixes alpha instead (no tuner).
- **or marconi+** (`=marconi+` instead of `=marconi`): marconi+'s shadow experts
  choose the alpha instead, from mirrors at the engine's own order and Marconi's score
  at fixed alphas, never stopping (`integrations.common.Shadows`).

- **or a declared priority** (`=lfu`, or any registered system whose eviction is a
  `core.priority.Priority`): the declaration becomes SGLang's eviction strategy of that
  name (`install_priority`, `DeclaredStrategy`), which the server selects with
  `--radix-eviction-policy NAME`; no tuner (docs/integrations.md, "Declared priorities in
  the engines").

Requirements, each checked at start-up with a one-line error: sglang 0.5.23 exactly; the
Python tree core (`SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python`, which `install` selects
when unset: the Rust core walks its own lists); no HiCache and no session radix cache
(their walks are not reordered).
"""

from __future__ import annotations

import os
import time
from collections import deque
from typing import TYPE_CHECKING, Any

import numpy as np

from marconi.core.priority import Feature, Priority, Score, key_value
from marconi.core.scores import OVER_A_LIST, FlopsAt, check_features, order, ranks
from marconi.core.spec import ModelSpec
from marconi.engines.integrations.common import (
    ABSENT,
    Counters,
    Installed,
    Integration,
    IntegrationError,
    Tuning,
    asked,
    check_policy,
    check_untuned,
    declared_score,
    one_line_exit,
)
from marconi.engines.integrations.common import check_version as _check

SUPPORTED_VERSION = "0.5.23"
ENABLE = "MARCONI_SGLANG"  # "marconi": install at plugin load
CORE = "SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND"
MIRROR = "sglang-2026+marconi"  # the tuner's mirror: SGLang's admission, Marconi's eviction
WHO = "marconi.engines.integrations.sglang"


if TYPE_CHECKING:
    _MambaBase = Any  # SGLang's `MambaComponent`, which marconi does not import
else:
    _MambaBase = object


def check_version() -> str:
    """The installed SGLang's version, or IntegrationError naming the supported one."""
    return _check("sglang", SUPPORTED_VERSION, "marconi.engines.integrations.sglang")


# --- the order -------------------------------------------------------------------------


class FlopOrder:
    """A declared score over SGLang's Mamba states (the one `MIRROR` declares, Marconi's):
    `RECENCY` a state's rank in SGLang's Mamba LRU list, `EFFICIENCY` its node's; `alpha`
    may change at any time (the tuner's thread sets it; a float assignment is atomic)."""

    FEATURES = OVER_A_LIST

    def __init__(self, spec: ModelSpec, score: Score, alpha: float = 0.0) -> None:
        self.score = score
        check_features(self.score, self.FEATURES, "marconi's order in SGLang")
        self.spec, self.alpha = spec, float(alpha)
        self._f = FlopsAt(spec)
        self._depths: dict[int, int] = {}  # node id -> depth
        self._token_bytes, self._state_bytes = spec.kv_bytes_per_token, spec.ssm_bytes

    def _depth(self, node: Any) -> int:
        """Tokens from the root to the end of `node`'s key: fixed for a node's life (a
        split shortens its key and puts the cut above it), so kept by node id."""
        d = self._depths.get(node.id)
        if d is None:
            if len(self._depths) > 1 << 20:  # ids of nodes long gone
                self._depths.clear()
            d = self._depths[node.id] = _depth(node, {})
        return d

    def order(self, nodes: list[Any]) -> list[Any]:
        """`nodes` (least recently used first) in the order to evict them."""
        alpha, n = self.alpha, len(nodes)
        if n < 2 or self.score.by_recency(alpha):
            return nodes  # recency alone: SGLang's own LRU walk, branch states included
        eff = np.empty(n)
        for i, x in enumerate(nodes):
            d = self._depth(x)
            edge = len(x.key) if x.key is not None else 0
            held = self._token_bytes * edge + self._state_bytes
            eff[i] = (self._f(d) - self._f(d - edge)) / held if held else 0.0
        branch = np.array([len(x.children) >= 2 for x in nodes])  # branch states last
        values = {Feature.RECENCY: ranks(n), Feature.EFFICIENCY: eff}
        return [nodes[i] for i in order(self.score, values, alpha, branch)]


def _depth(node: Any, memo: dict[int, int]) -> int:
    """Tokens from the root to the end of `node`'s key."""
    chain = []
    while node is not None and id(node) not in memo:
        chain.append(node)
        node = node.parent
    base = memo[id(node)] if node is not None else 0
    for x in reversed(chain):
        base += len(x.key) if x.key is not None else 0
        memo[id(x)] = base
    return base


# --- a declared priority as SGLang's eviction strategy -----------------------------------


class DeclaredStrategy:
    """A declared `Priority` (`core.priority`) as SGLang's eviction strategy: SGLang's Full
    (KV) walk asks `get_priority(node)` of its evictable leaves, lowest first, and gets the
    declaration's keys over the node's own features, then its creation order (the
    declaration's last tie): `RECENCY` its `last_access_time`, `HITS` its `hit_count`,
    `CREATED` its `creation_time`, `DEPTH` tokens from the root to its key's end, `STATE`
    1 when it holds a Mamba state. Registered under the policy's name among SGLang's
    strategies (`install`), it replaces SGLang's own of that name (`lfu`, `slru`)."""

    alpha = 0.0  # an integration's order has one; a priority is not tuned

    def __init__(self, priority: Priority, mamba: int, counters: Counters) -> None:
        self.priority, self._mamba, self._counters = priority, mamba, counters
        self._features = priority.features

    def get_priority(self, node: Any) -> tuple[float, ...]:
        start = time.perf_counter_ns()
        values = {f: self._feature(f, node) for f in self._features}
        key = (*(key_value(k, values) for k in self.priority.keys), node.creation_time)
        counters = self._counters
        counters.keys += 1
        counters.order_ns += time.perf_counter_ns() - start
        return key

    def _feature(self, feature: Feature, node: Any) -> float:
        if feature is Feature.RECENCY:
            return node.last_access_time
        if feature is Feature.HITS:
            return node.hit_count
        if feature is Feature.CREATED:
            return node.creation_time
        if feature is Feature.STATE:
            return 1.0 if node.component_data[self._mamba].value is not None else 0.0
        return _depth(node, {})  # DEPTH


def install_priority(policy: str, priority: Priority) -> Integration:
    """`priority` put among SGLang's eviction strategies under `policy` (replacing SGLang's
    own of that name; a new name added to `--radix-eviction-policy`'s choices), so that a
    cache built with `eviction_policy=policy` evaluates it."""
    from sglang.srt.arg_groups.choices import (
        RADIX_EVICTION_POLICY_CHOICES,
        add_radix_eviction_policy_choices,
    )
    from sglang.srt.mem_cache import utils
    from sglang.srt.mem_cache.unified_cache.components import ComponentType

    counters = Counters()
    strategy = DeclaredStrategy(priority, int(ComponentType.MAMBA), counters)

    def factory(**config: Any) -> DeclaredStrategy:
        if config:
            raise IntegrationError(f"marconi.engines.integrations.sglang: policy {policy} is "
                                   f"declared whole; --eviction-policy-config {config} "
                                   "has nothing to set")
        return strategy

    factories = utils._EVICTION_POLICY_FACTORIES
    done = Integration(policy=policy, order=strategy, tuning=None, counters=counters)
    done.undo.append((factories, policy, factories.get(policy, ABSENT)))
    factories[policy] = factory
    if policy not in RADIX_EVICTION_POLICY_CHOICES:
        add_radix_eviction_policy_choices([policy])
        done.undo.append((RADIX_EVICTION_POLICY_CHOICES, policy, ABSENT))
    return done


# --- installing it ----------------------------------------------------------------------


_installed = Installed()


def install(spec: ModelSpec, *, policy: str = "marconi", alpha: float | None = None,
            background: bool = True) -> Integration:
    """Put Marconi's eviction into SGLang (before its caches are built); `alpha` fixes
    it, else the bootstrap tuner sets it (`background`: in its own thread). `policy` may
    instead name a system whose eviction is a declared priority (`lfu`): it becomes SGLang's
    eviction strategy of that name (`install_priority`), untuned."""
    check_policy(WHO, policy)
    check_version()
    core = os.environ.setdefault(CORE, "python")
    if core != "python":
        raise IntegrationError(f"{WHO} needs SGLang's Python tree core ({CORE}=python); "
                               f"{CORE}={core} walks its own lists")
    from sglang.srt.mem_cache import unified_radix_cache as urc
    from sglang.srt.mem_cache.unified_cache.components import ComponentType

    uninstall()
    priority = check_untuned(WHO, policy, alpha)
    if priority is not None:
        return _installed.put(install_priority(policy, priority))
    order = FlopOrder(spec, declared_score(MIRROR, spec), alpha or 0.0)
    done = Integration.of(policy, order, spec, alpha, background)
    registry = urc.COMPONENT_REGISTRY
    stock = registry[ComponentType.MAMBA]
    registry[ComponentType.MAMBA] = mamba_component(stock, done)
    release = urc.UnifiedRadixCache.on_release
    urc.UnifiedRadixCache.on_release = _on_release(release, done)
    done.undo = [(registry, ComponentType.MAMBA, stock),
                 (urc.UnifiedRadixCache, "on_release", release)]
    return _installed.put(done)


def uninstall() -> None:
    """Put SGLang's own classes back (tests, benchmarks running both)."""
    _installed.uninstall()


def plugin() -> None:
    """SGLang's general-plugin entry point: install when `MARCONI_SGLANG` asks. A bad
    setting stops the process with one line (SGLang would log a plugin's exception and
    run stock, silently)."""
    with one_line_exit():
        wanted = asked("marconi.engines.integrations.sglang", ENABLE)
        if wanted is not None:
            install(wanted.spec, policy=wanted.policy, alpha=wanted.alpha)


class MarconiWalk(_MambaBase):
    """Put before SGLang's `MambaComponent` in `MarconiMamba` (`mamba_component`): the
    component's device-eviction walk visits the states in Marconi's order; SGLang's own
    step evicts each one (marconi.engines.integrations.sglang)."""

    marconi: Integration  # set on the class `mamba_component` makes

    def _evict_device_start(self, request_cnt: int) -> None:
        core = self.tree_core
        if core.enable_session_radix_cache or core.enable_hicache:
            raise IntegrationError("marconi.engines.integrations.sglang supports neither "
                                   "HiCache nor the session radix cache")
        super()._evict_device_start(request_cnt)
        integration = self.marconi
        assert isinstance(integration.order, FlopOrder)
        start = time.perf_counter_ns()
        self._marconi_quota = request_cnt
        self._marconi_walk = deque(integration.order.order(_candidates(self)))
        integration.counters.walks += 1
        integration.counters.order_ns += time.perf_counter_ns() - start

    def _evict_device_next_node(self, tracker: dict, device_frees: dict,
                                host_frees: dict, cache_actions: list) -> Any:
        """The next state of Marconi's walk, put under SGLang's cursor for SGLang's own
        step: a leaf's id back (SGLang evicts its KV and its state), an inner state
        tombstoned (its KV kept) and its now-childless parents cascaded."""
        ct = self.component_type
        lru, walk = self.tree_core.lru_lists[ct], self._marconi_walk
        if tracker[ct] >= self._marconi_quota:
            return None
        while walk and not (lru.in_list(walk[0])
                            and walk[0].component_data[ct].lock_ref == 0):
            walk.popleft()  # gone with an earlier victim, or locked since
        if not walk:
            return None
        self._evict_device_cursor = walk.popleft()
        self.marconi.counters.victims += 1
        return super()._evict_device_next_node(tracker, device_frees, host_frees,
                                               cache_actions)

    def _evict_device_end(self) -> None:
        self._marconi_walk = deque()
        super()._evict_device_end()


def mamba_component(stock: type, integration: Integration) -> type:
    """SGLang's Mamba component (`stock`) with Marconi's walk order for `integration`."""
    return type("MarconiMamba", (MarconiWalk, stock), {
        "marconi": integration, "__module__": __name__,
        "__doc__": "SGLang's `MambaComponent`; its device-eviction walk visits states in "
                   "Marconi's order (marconi.engines.integrations.sglang)."})


def _candidates(component: Any) -> list[Any]:
    """The states the stock walk visits, least recently used first (unlocked ones)."""
    lru = component.tree_core.lru_lists[component.component_type]
    out, x = [], lru.get_lru_no_lock()
    while x is not None:
        out.append(x)
        x = lru.get_prev_no_lock(x)
    return out


def _on_release(release: Any, integration: Integration) -> Any:
    """`UnifiedRadixCache.on_release`, then the finished request to the tuner."""

    def on_release(self: Any, req: Any, *, checkpointed: bool) -> None:
        release(self, req, checkpointed=checkpointed)
        tuning = integration.tuning
        if tuning is None or not req.finished():
            return
        start = time.perf_counter_ns()
        if not tuning.started:
            _start(tuning, self.token_to_kv_pool_allocator.size,
                   self.req_to_token_pool.mamba_pool.size,
                   bool(getattr(self.req_to_token_pool, "enable_mamba_extra_buffer", False)))
        tokens = np.concatenate([np.asarray(req.origin_input_ids, dtype=np.int64),
                                 np.asarray(req.output_ids, dtype=np.int64)]).astype(np.int32)
        integration.counters.requests += 1
        tuning.feed(tokens, len(req.origin_input_ids))
        if tuning.background:
            integration.counters.feed_ns += time.perf_counter_ns() - start

    return on_release



def _start(tuning: Tuning, kv_tokens: int, state_slots: int, extra_buffer: bool) -> None:
    """The tuner's mirror for the engine's pools: SGLang's admission as emulated, Marconi's
    eviction."""
    spec = tuning.spec
    strategy = "extra_buffer" if extra_buffer else "no_buffer"
    capacity = kv_tokens * spec.kv_bytes_per_token + state_slots * spec.ssm_bytes
    tuning.start(f"{MIRROR}:strategy={strategy}", capacity, state_slots=state_slots)
