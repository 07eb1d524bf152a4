"""Marconi inside SGLang's and vLLM's own cache code (marconi.engines.integrations.sglang, .vllm):
each refuses what it cannot run with one line, the engine's integrity checks pass after
every request with it in, alpha 0 is the stock engine, and its tuner runs off the
scheduling loop; in SGLang it saves more FLOPs than stock.

The engine tests need the engines' environments (`bash scripts/setup-peers.sh`): they
skip without them, except under CI (CI=true), where they fail."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
import tomllib
from pathlib import Path

import numpy as np
import pytest

from marconi.core.spec import PAPER_7B
from marconi.core.units import parse_size
from marconi.engines.integrations import sglang as integration
from marconi.engines.integrations import vllm as vllm_integration
from marconi.engines.real.envs import PeerError, envs_dir
from marconi.paper.eviction import MARCONI
from marconi.sim import SimConfig
from marconi.sim.run import run
from marconi.systems import get_system
from tests.test_realpeers import need

ROOT = Path(__file__).resolve().parents[1]
STOCK, WITH = "sglang-0.5.23", "sglang-0.5.23:integration=marconi"
VLLM_STOCK, VLLM_WITH = "vllm-0.32", "vllm-0.32:integration=marconi"


PLUGINS = {"sglang": (integration, "MARCONI_SGLANG"), "vllm": (vllm_integration, "MARCONI_VLLM")}


@pytest.mark.parametrize("engine", sorted(PLUGINS))
class TestEitherPlugin:
    def test_the_plugin_does_nothing_unless_asked(self, monkeypatch: pytest.MonkeyPatch,
                                                  engine: str) -> None:
        module, enable = PLUGINS[engine]
        monkeypatch.delenv(enable, raising=False)
        assert module.plugin() is None and module._installed.current is None

    @pytest.mark.parametrize(("env", "said"), [
        ({"": "marconi"}, "needs MARCONI_MODEL"),
        ({"": "lru-ish", "MARCONI_MODEL": "paper-7b"}, "unknown policy 'lru-ish'"),
        ({"": "lfu", "MARCONI_MODEL": "paper-7b", "MARCONI_ALPHA": "1"},
         "policy lfu is a declared priority, which has no alpha to fix"),
        ({"": "marconi", "MARCONI_MODEL": "no-such-model"}, "no-such-model"),
        ({"": "marconi", "MARCONI_MODEL": "paper-7b", "MARCONI_ALPHA": "high"},
         "MARCONI_ALPHA='high' is not a finite number >= 0"),
        ({"": "marconi", "MARCONI_MODEL": "paper-7b", "MARCONI_ALPHA": "-1"},
         "MARCONI_ALPHA='-1' is not a finite number >= 0"),
        ({"": "marconi", "MARCONI_MODEL": "paper-7b"}, "{engine} is not installed"),
        ({"": "marconi+", "MARCONI_MODEL": "paper-7b"}, "{engine} is not installed"),
    ])
    def test_a_bad_setting_stops_the_process_with_one_line(
            self, monkeypatch: pytest.MonkeyPatch, engine: str, env: dict[str, str],
            said: str) -> None:
        """The engine would log a plugin's exception and run stock (SGLang), or crash its
        engine core (vLLM): the plugin stops the process with one line instead."""
        module, enable = PLUGINS[engine]
        for key in (enable, "MARCONI_MODEL", "MARCONI_ALPHA", "MARCONI_ORPHANS"):
            monkeypatch.delenv(key, raising=False)
        for key, value in env.items():
            monkeypatch.setenv(key or enable, value)
        with pytest.raises(SystemExit) as stop:
            module.plugin()
        message = str(stop.value.code)
        assert message.startswith("error: ") and "\n" not in message
        assert said.format(engine=engine) in message, message


class TestWithoutTheEngine:
    def test_the_entry_point_names_the_plugin(self) -> None:
        meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
        entry = meta["project"]["entry-points"]["sglang.srt.plugins"]["marconi"]
        assert entry == "marconi.engines.integrations.sglang:plugin"

    def test_the_rust_core_is_refused_before_any_work(self) -> None:
        with pytest.raises(PeerError, match="Python tree core"):
            run(_small(), SimConfig(spec=PAPER_7B, capacity="1GB", bounds=False,
                                    system=f"{WITH},core=rust", replay="sequential"))


def _small():
    from marconi.workload import load_trace

    return load_trace("synthetic:multi-turn:sessions=3")


def _engine_python() -> Path:
    return envs_dir() / "sglang" / "bin" / "python"


class TestInsideSGLang:
    def test_any_other_version_is_refused(self) -> None:
        need("sglang")
        code = ("import importlib.metadata as m; m.version = lambda name: '0.5.22'\n"
                "from marconi.engines.integrations.sglang import install\n"
                "from marconi.core.spec import PAPER_7B\n"
                "install(PAPER_7B)\n")
        done = subprocess.run([str(_engine_python()), "-c", code], capture_output=True,
                              text=True, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
        assert done.returncode != 0
        assert "supports sglang 0.5.23 only; this environment has 0.5.22" in done.stderr

    def test_only_the_full_walk_asks_sglangs_eviction_strategy(self) -> None:
        """Why Marconi's order is a hook on the Mamba walk, not a strategy registered for
        `--radix-eviction-policy` (docs/integrations.md, "Why the Mamba walk is a hook"):
        in the supported SGLang the tree core's strategy is asked by the Full component's
        walk and by nothing the Mamba component runs."""
        need("sglang")
        code = textwrap.dedent("""
            import inspect, json, sys
            sys.path.insert(0, sys.argv[1])
            from marconi.engines.real import sglang_load
            sglang_load.load_sglang()
            from sglang.srt.mem_cache.unified_cache.components import (
                FullComponent, MambaComponent)

            def asks(cls):
                return [k.__name__ for k in cls.__mro__ if k is not object
                        and "eviction_strategy" in inspect.getsource(k)]

            print(json.dumps({"full": asks(FullComponent), "mamba": asks(MambaComponent)}))
        """)
        done = subprocess.run([str(_engine_python()), "-c", code,
                               str(ROOT / "src")],
                              capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-2000:]
        asking = json.loads(done.stdout.strip().splitlines()[-1])
        assert "FullComponent" in asking["full"], "SGLang's Full walk no longer asks it"
        assert not asking["mamba"], (
            f"SGLang's Mamba walk asks the eviction strategy ({asking['mamba']}): "
            "Marconi's order might go through SGLang's registry now; see "
            "docs/integrations.md, \"Why the Mamba walk is a hook\"")

    def test_checks_pass_and_its_order_saves_more_than_stock(self, chat, stock) -> None:
        """alpha fixed at 2 (what the tuner picks here): deterministic, and its order, not
        the tuner's timing, is what is measured (evicting highest scores first loses)."""
        need("sglang")
        from marconi.sim.real_engine import replay

        config = SimConfig(replay="sequential",
                           spec=PAPER_7B, capacity="1GB", bounds=False, system=WITH,
                           alpha=2.0)
        ours = replay(chat, config, get_system(WITH), check=True).summary().to_json()
        hook = ours["engine"]["integration"]
        assert hook["policy"] == "marconi" and hook["victims"] > 0  # its walk evicted
        assert ours["alpha"] == 2.0 and ours["alpha_status"] == "fixed"
        assert ours["flops_saved"] > 1.1 * stock.summary().flops_saved, (
            ours["flops_saved_rate"], stock.summary().flops_saved_rate)

    def test_the_tuner_tunes_off_the_scheduling_loop(self, chat) -> None:
        need("sglang")
        ours = run(chat, SimConfig(replay="sequential",
                                   spec=PAPER_7B, capacity="1GB", bounds=False, system=WITH),
                   warn=False).summary().to_json()
        hook = ours["engine"]["integration"]
        assert ours["alpha_status"] == "tuned" and ours["alpha"] == hook["alpha"] > 0
        assert hook["tuner_off_loop"] is True  # the mirror and replays: its own thread
        assert hook["requests"] == len(chat) and hook["tuner_ns"] > 0

    def test_a_block_is_booked_only_as_the_books_hold_it(self) -> None:
        """The hooks skip `_record` for a state block cached again only when the books
        already hold it as `_record` would leave them (`booked`): the state last recorded
        is the block's, at its depth, with the very above-tuple the block has, and the
        state's keys known. A state recorded again with another nearest state above (a new
        tuple, other values) is not booked: its blocks take the new tuple. On vLLM's own
        block class (no trace of the fuzzed tests makes that case)."""
        need("vllm")
        code = textwrap.dedent("""
            from vllm.v1.core.kv_cache_utils import KVCacheBlock
            from marconi.core.spec import PAPER_7B
            from marconi.engines.integrations.vllm import StateOrder, booked
            from marconi.paper.eviction import MARCONI

            order = StateOrder(PAPER_7B, MARCONI)
            order.size(16)
            state, other = b"s" * 32, b"t" * 32
            key = state + (1).to_bytes(4, "big")
            block = KVCacheBlock(block_id=7)
            block.set_block_hash(key, 512)
            above = order.above_of(512, 256)
            order.note(7, state, above)
            assert not booked(order, block, key, (state, above))  # its keys not known yet
            order.depend(state, (), lambda k: True)
            assert booked(order, block, key, (state, above))
            assert not booked(order, block, key, (state, order.above_of(512, 0)))
            assert not booked(order, block, key, (other, above))
            assert not booked(order, block, key, (state, order.above_of(256, 0)))
            order.note(7, other, order.above_of(512, 256))
            assert not booked(order, block, key, (state, above))
            print("ok")
        """)
        python = envs_dir() / "vllm" / "bin" / "python"
        done = subprocess.run([str(python), "-c", code], capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
        assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]

    @pytest.mark.parametrize(("trace", "seed", "capacity"), [
        ("synthetic:agent:sessions=8", 11, "3GB"),
        ("synthetic:multi-turn:sessions=30", 12, "1GB"),
        ("synthetic:multi-turn:sessions=40,turns=6", 15, "800MB"),
    ])
    def test_integrity_holds_on_fuzzed_traces_that_evict(self, trace: str, seed: int,
                                                         capacity: str) -> None:
        """SGLang's `sanity_check()` and pool accounting after every request, with
        Marconi's walk choosing the victims (alpha 2) on traces of other shapes."""
        need("sglang")
        from marconi.sim.real_engine import replay
        from marconi.workload import TraceOptions, load_trace

        config = SimConfig(replay="sequential",
                           spec=PAPER_7B, capacity=capacity, bounds=False, system=WITH,
                           alpha=2.0)
        requests = load_trace(trace, options=TraceOptions(seed=seed))
        ours = replay(requests, config, get_system(WITH), check=True).summary().to_json()
        assert ours["engine"]["integration"]["victims"] > 0 and ours["evictions"] > 0

    @pytest.mark.parametrize(("trace", "seed", "capacity"), [
        ("synthetic:multi-turn:sessions=30", 12, "1GB"),
        ("synthetic:multi-turn:sessions=40,turns=6", 15, "800MB"),
    ])
    def test_integrity_holds_when_marconi_plus_switches_mid_run(self, trace: str, seed: int,
                                                                 capacity: str) -> None:
        """SGLang's checks after every request while marconi+'s shadows change the walk's
        alpha during the replay (at request 128 on these traces)."""
        need("sglang")
        from marconi.sim.real_engine import replay
        from marconi.workload import TraceOptions, load_trace

        system = f"{STOCK}:integration=marconi+,tuner=inline"
        config = SimConfig(replay="sequential",
                           spec=PAPER_7B, capacity=capacity, bounds=False, system=system)
        requests = load_trace(trace, options=TraceOptions(seed=seed))
        hook = replay(requests, config, get_system(system), check=True).summary().to_json()[
            "engine"]["integration"]
        assert hook["switches"] and 0 < hook["switches"][0][0] < len(requests)
        assert hook["victims"] > 0

    def test_marconi_plus_checks_pass_and_it_follows_its_leader(self, chat, stock) -> None:
        """marconi+'s shadow experts inline (reproducible): SGLang's checks pass after
        every request, the engine switches to the leading order and saves more than
        stock."""
        need("sglang")
        from marconi.sim.real_engine import replay

        system = f"{STOCK}:integration=marconi+,tuner=inline"
        config = SimConfig(replay="sequential",
                           spec=PAPER_7B, capacity="1GB", bounds=False, system=system)
        ours = replay(chat, config, get_system(system), check=True).summary().to_json()
        hook = ours["engine"]["integration"]
        assert hook["policy"] == "marconi+" and hook["victims"] > 0 and hook["switches"]
        assert ours["alpha"] == hook["switches"][-1][1] > 0 and ours["alpha_status"] == "tuned"
        assert ours["flops_saved"] > 1.1 * stock.summary().flops_saved

    def test_a_fixed_alpha_of_zero_is_the_stock_engine(self, chat, stock) -> None:
        """At alpha 0 Marconi's order is SGLang's LRU: every hit is the stock engine's."""
        need("sglang")
        ours = run(chat, SimConfig(replay="sequential",
                                   spec=PAPER_7B, capacity="1GB", bounds=False, system=WITH,
                                   alpha=0.0), warn=False)
        assert (ours.records.hit == stock.records.hit).all()
        assert ours.alpha_status == "fixed" and ours.stats.evictions > 0


@pytest.fixture(scope="module")
def chat():
    from marconi.workload import TraceOptions, load_trace

    return load_trace("sharegpt", options=TraceOptions(min_turns=10, sessions=40))


@pytest.fixture(scope="module")
def stock(chat):
    """The stock engine on `chat` at 1 GB, its integrity checks after every request."""
    need("sglang")
    from marconi.sim.real_engine import replay

    config = SimConfig(replay="sequential",
                       spec=PAPER_7B, capacity="1GB", bounds=False, system=STOCK)
    return replay(chat, config, get_system(STOCK), check=True)


class _Order:
    alpha = 0.0


class TestShadowsBesideTheEngine:
    """marconi+ in an engine: the shadow experts' mirrors, fed what the engine finished,
    choose the alpha its walks run at (marconi.engines.integrations.common.Shadows)."""

    @pytest.mark.parametrize("mirror", ["sglang-2026+marconi", "vllm-2026+marconi"])
    def test_each_mirror_saves_what_its_system_saves_at_that_alpha(self, mirror: str) -> None:
        """An expert's total is its mirror's FLOPs saved: the simulator's replay of the
        mirror system at that fixed alpha, request for request."""
        from marconi.engines.integrations.common import Counters, Shadows, Tuning
        from marconi.workload import TraceOptions, load_trace

        chat = load_trace("sharegpt", options=TraceOptions(min_turns=10, sessions=20))
        shadows = Shadows(alphas=(0.0, 2.0))
        tuning = Tuning(_Order(), PAPER_7B, Counters(), background=False, chooser=shadows)
        tuning.start(mirror, parse_size("1GB"), as_engine=True)
        for r in chat:
            tuning.feed(r.tokens(), r.n_input)
        for alpha, total in zip(shadows.alphas, shadows.totals, strict=True):
            config = SimConfig(spec=PAPER_7B, capacity="1GB", bounds=False, system=mirror,
                               alpha=alpha, replay="sequential")  # the mirror's, in turn
            assert total == pytest.approx(run(chat, config, warn=False).summary().flops_saved,
                                          rel=1e-12)
        assert shadows.totals[1] != shadows.totals[0]  # the two orders differ here

    def test_leader_needs_a_decisive_lead(self) -> None:
        """marconi+'s rule, shared with its simulator tuner: in the engine a quarter more
        while warming up (`ENGINE_WARMUP_LEAD`; the simulator's asks 5% there too), then
        5% more than the running expert."""
        from marconi.engines.integrations.common import Shadows
        from marconi.plus.shadows import ShadowConfig, leader

        config = Shadows().config
        assert config.warmup == 128
        assert leader(np.array([2.0, 2.45]), 0, 16, config) == 0  # warming up: under 25%
        assert leader(np.array([2.0, 2.55]), 0, 16, config) == 1
        assert leader(np.array([2.0, 2.45]), 0, 16, ShadowConfig()) == 1  # the simulator's
        assert leader(np.array([2.0, 2.09]), 0, 128, config) == 0  # warm: under 5%
        assert leader(np.array([2.0, 2.11]), 0, 128, config) == 1
        assert leader(np.array([2.5, 2.0]), 1, 128, config) == 0

    def test_the_engine_runs_the_leader_where_one_order_saves_more(self) -> None:
        """SGLang's pools at 1 GB on chat sessions: Marconi's order at a positive alpha
        saves far more than SGLang's LRU, so the engine switches to it and runs it."""
        from marconi.engines.integrations.common import Counters, Shadows, Tuning
        from marconi.workload import TraceOptions, load_trace

        chat = load_trace("sharegpt", options=TraceOptions(min_turns=10, sessions=20))
        order, shadows = _Order(), Shadows()
        tuning = Tuning(order, PAPER_7B, Counters(), background=False, chooser=shadows)
        tuning.start("sglang-2026+marconi", parse_size("1GB"), state_slots=17)
        for r in chat:
            tuning.feed(r.tokens(), r.n_input)
        assert shadows.switches and shadows.status() == "tuned"
        assert order.alpha == shadows.alphas[shadows.current] > 0
        assert shadows.totals[shadows.current] > 1.05 * shadows.totals[0]

    def test_in_its_thread_it_chooses_as_inline(self) -> None:
        """Deployed, the mirrors run in the tuner's thread, never the caller's, and reach
        the same totals and switches as inline."""
        import threading

        from marconi.engines.integrations.common import Counters, Shadows, Tuning
        from marconi.workload import TraceOptions, load_trace

        chat = load_trace("sharegpt", options=TraceOptions(min_turns=10, sessions=20))
        done = []
        for background in (False, True):
            order, shadows = _Order(), Shadows()
            tuning = Tuning(order, PAPER_7B, Counters(), background=background,
                            chooser=shadows)
            tuning.start("sglang-2026+marconi", parse_size("1GB"), state_slots=17)
            for r in chat:
                tuning.feed(r.tokens(), r.n_input)
            tuning.close(timeout=60)
            done.append((shadows.totals.tolist(), shadows.switches, order.alpha,
                         threading.get_ident() in tuning.threads))
        assert done[1][:3] == done[0][:3] and done[0][1]
        assert done[0][3] is True and done[1][3] is False

    def test_a_fixed_alpha_is_refused_for_marconi_plus_and_a_negative_one_for_any(
            self) -> None:
        from marconi.engines.integrations.common import Counters, IntegrationError, tuning_for

        with pytest.raises(IntegrationError, match="chooses its own alpha"):
            tuning_for("marconi+", _Order(), PAPER_7B, Counters(), 1.0, False)
        with pytest.raises(IntegrationError, match="alpha must be a finite number >= 0"):
            tuning_for("marconi", _Order(), PAPER_7B, Counters(), -0.5, False)


class TestTunerInItsOwnProcess:
    """Deployed in vLLM, the tuner runs in a child process (integrations.tuner_process): the
    engine's loop only hands tokens over, the child chooses as the inline tuner does, and
    the engine outlives it."""

    @staticmethod
    def _fed(process: bool, chooser: str, n: int | None = None) -> tuple:
        import logging

        from marconi.engines.integrations.common import Bootstrap, Counters, Shadows, Tuning
        from marconi.workload import TraceOptions, load_trace

        chat = load_trace("sharegpt", options=TraceOptions(min_turns=10, sessions=20))
        order = _Order()
        log = logging.getLogger("test.marconi")
        tuning = Tuning(order, PAPER_7B, Counters(), background=process, process=process,
                        chooser=Shadows() if chooser == "shadows" else Bootstrap(), log=log)
        tuning.start("vllm-2026+marconi:block_size=16,retention_interval=none",
                     parse_size("1GB"))
        for r in list(chat)[:n]:
            tuning.counters.requests += 1
            tuning.feed(r.tokens(), r.n_input)
        return tuning, order

    @pytest.mark.parametrize("chooser", ["shadows", "bootstrap"])
    def test_it_chooses_what_the_inline_tuner_chooses(self, chooser: str) -> None:
        inline, inline_order = self._fed(False, chooser)
        remote, remote_order = self._fed(True, chooser)
        assert remote.remote is not None and remote.remote.pid is not None
        remote.close(timeout=120)
        inline.close()
        assert remote.remote.dead == "closed"
        assert remote_order.alpha == inline_order.alpha
        assert remote.status() == inline.status() == "tuned"
        if chooser == "shadows":  # every mirror's total, bit for bit
            assert remote.report()["totals"] == inline.report()["totals"]
            assert remote.report()["switches"] == inline.report()["switches"]
        assert remote.counters.tuner_ns > 0 and not remote.threads

    def test_the_child_runs_only_on_cpu_the_engine_leaves(self) -> None:
        """SCHED_IDLE (or the highest niceness): on few cores the engine must never wait
        for the tuner's replays."""
        import os
        import time

        tuning, _ = self._fed(True, "bootstrap", n=3)
        pid = tuning.remote.pid
        try:
            deadline = time.monotonic() + 60  # the child sets it as it starts
            while os.sched_getscheduler(pid) != os.SCHED_IDLE and \
                    os.getpriority(os.PRIO_PROCESS, pid) < 19 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert os.sched_getscheduler(pid) == os.SCHED_IDLE or \
                os.getpriority(os.PRIO_PROCESS, pid) >= 19
        finally:
            tuning.close(timeout=30)

    def test_no_thread_of_ours_polls_in_the_engine(self) -> None:
        """The loop writes down the pipe itself: beside it only the reader, blocked on the
        child's pipe (a writer thread waking every 10 ms took the GIL from the scheduler
        and doubled a served run's TTFT p95)."""
        import threading

        before = set(threading.enumerate())  # (other tests' threads may still be there)
        tuning, _ = self._fed(True, "bootstrap", n=3)
        try:
            ours = sorted(t.name for t in set(threading.enumerate()) - before)
            assert ours == ["marconi-tuner-alpha"]
        finally:
            tuning.close(timeout=60)

    def test_a_stopped_child_never_blocks_the_loop_and_misses_nothing(self) -> None:
        """With the child stopped the pipe fills; each feed returns at once (the rest
        waits in the backlog) and, the child resumed, every request reaches it in order:
        it chooses what the inline tuner chooses on the same requests."""
        import os
        import signal

        from marconi.workload import TraceOptions, load_trace

        chat = list(load_trace("sharegpt", options=TraceOptions(min_turns=10, sessions=20)))
        tuning, order = self._fed(True, "shadows", n=1)
        inline, inline_order = self._fed(False, "shadows")
        remote = tuning.remote
        os.kill(remote.pid, signal.SIGSTOP)
        try:
            filled = False
            for r in chat[1:]:  # a feed that waited for the stopped child would never return
                tuning.feed(r.tokens(), r.n_input)
                filled = filled or bool(remote._backlog)
            assert filled, "the pipe never filled"
        finally:
            os.kill(remote.pid, signal.SIGCONT)
        tuning.close(timeout=120)
        inline.close()
        assert remote.dead == "closed" and remote.dropped == 0
        assert tuning.report()["totals"] == inline.report()["totals"]
        assert order.alpha == inline_order.alpha

    def test_a_request_crosses_the_pipe_as_int32_ids_and_its_input_length(self) -> None:
        """A list crosses as it is (the child converts it), any other sequence as a list
        (vLLM's read-only list type is not importable in the child), an array as int32."""
        import pickle

        from marconi.engines.integrations.tuner_process import pack, unpack

        ids = [3, 70_000, 151_935, 0, 42]
        for given in (ids, tuple(ids), np.array(ids, dtype=np.int64)):
            tokens, n_input = unpack(pack(given, 3))
            assert tokens.dtype == np.int32 and tokens.tolist() == ids and n_input == 3
            inner = pickle.loads(pack(given, 3))[0]
            assert type(inner) in (list, np.ndarray)

    def test_messages_written_in_parts_arrive_whole_and_in_order(self) -> None:
        """A pipe of one page takes a 20 KB message in parts, the rest at later feeds and
        at the end: the other end reads each request's ids and input length exactly as the
        child's `recv_bytes` does, in order."""
        import fcntl
        import logging
        import os
        import threading
        from multiprocessing.connection import Connection

        from marconi.engines.integrations.tuner_process import Remote, unpack

        r, w = os.pipe()
        fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, 4096)
        os.set_blocking(w, False)
        remote = Remote("Bootstrap", PAPER_7B, logging.getLogger("test.marconi"),
                        lambda alpha: None)
        remote._down = w
        sent = [np.arange(n, dtype=np.int32) * 3 + n for n in (5, 5000, 700, 1, 12000, 64)]
        got: list[bytes] = []

        def read() -> None:
            with Connection(r, writable=False) as down:
                try:
                    while True:
                        got.append(down.recv_bytes())
                except EOFError:
                    pass

        reader = threading.Thread(target=read)
        reader.start()
        for ids in sent:
            remote.feed(ids if len(ids) % 2 else ids.tolist(), len(ids) // 2)
        remote.close(timeout=30)
        reader.join(timeout=30)
        assert len(got) == len(sent)
        for raw, ids in zip(got, sent, strict=True):
            tokens, n_input = unpack(raw)
            assert n_input == len(ids) // 2 and tokens.dtype == np.int32
            assert np.array_equal(tokens, ids)

    def test_the_engine_serves_on_at_its_last_alpha_when_the_child_dies(
            self, caplog: pytest.LogCaptureFixture) -> None:
        import logging

        from marconi.workload import TraceOptions, load_trace

        tuning, order = self._fed(True, "shadows", n=5)
        order.alpha = 1.5
        tuning.remote._proc.kill()
        tuning.remote._proc.wait()
        chat = load_trace("sharegpt", options=TraceOptions(min_turns=10, sessions=20))
        with caplog.at_level(logging.WARNING, logger="test.marconi"):
            for r in list(chat)[:300]:  # enough to fill the pipe: the feed never blocks
                tuning.feed(r.tokens(), r.n_input)
        gone = [m for m in caplog.messages if "is gone" in m]
        assert len(gone) == 1 and "keeps serving at its last alpha" in gone[0]
        assert order.alpha == 1.5
        tuning.close(timeout=5)


    def test_a_killed_child_is_reaped_at_once(self) -> None:
        """Not left `<defunct>` under the engine's process until the tuner is closed."""
        import os
        import signal
        import time
        from pathlib import Path

        tuning, _ = self._fed(True, "bootstrap", n=3)
        pid = tuning.remote.pid
        try:
            os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 10
            while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
                time.sleep(0.05)  # a zombie keeps its /proc entry until it is waited for
            assert not Path(f"/proc/{pid}").exists(), "the killed tuner process is <defunct>"
            assert tuning.remote.dead == "exit code -9"
        finally:
            tuning.close(timeout=5)


    def test_a_child_whose_engine_is_gone_exits_quietly(self) -> None:
        """The engine core's shutdown ends without closing the tuner: the child's last
        word then finds no reader, and it exits 0 without a traceback in the engine's log."""
        import dataclasses
        import os
        import subprocess
        import sys
        from multiprocessing.connection import Connection

        down_r, down_w = os.pipe()
        up_r, up_w = os.pipe()
        child = subprocess.Popen(
            [sys.executable, "-m", "marconi.engines.integrations.tuner_process", str(down_r),
             str(up_w)], pass_fds=(down_r, up_w), stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL)
        os.close(down_r)
        os.close(up_w)
        os.close(up_r)  # the engine is gone: nobody reads what the child says
        with Connection(down_w, readable=False) as down:
            down.send(("Bootstrap", dataclasses.asdict(PAPER_7B),
                       "vllm-2026+marconi:block_size=16,retention_interval=none",
                       parse_size("1GB"), {}))
        _, err = child.communicate(timeout=120)
        assert child.returncode == 0 and b"Traceback" not in err, err.decode()[-2000:]


class TestVLLMWithoutTheEngine:
    def test_the_entry_point_names_the_plugin(self) -> None:
        meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
        entry = meta["project"]["entry-points"]["vllm.general_plugins"]["marconi"]
        assert entry == "marconi.engines.integrations.vllm:plugin"

    @pytest.mark.parametrize(("env", "said"), [
        ({"MARCONI_VLLM_CPU_SPLIT": "yes"}, "MARCONI_VLLM_CPU_SPLIT='yes' is not 0 or 1"),
        ({"MARCONI_VLLM": "marconi", "MARCONI_MODEL": "paper-7b", "MARCONI_TUNER": "gpu"},
         "MARCONI_TUNER='gpu' is not process or thread"),
        ({"MARCONI_VLLM_CPU_SPLIT": "1"}, "vllm is not installed"),
    ])
    def test_its_serving_settings_are_checked_at_start(
            self, monkeypatch: pytest.MonkeyPatch, env: dict[str, str], said: str) -> None:
        for key in ("MARCONI_VLLM", "MARCONI_MODEL", "MARCONI_ALPHA", "MARCONI_ORPHANS",
                    "MARCONI_TUNER", "MARCONI_VLLM_CPU_SPLIT"):
            monkeypatch.delenv(key, raising=False)
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        with pytest.raises(SystemExit) as stop:
            vllm_integration.plugin()
        message = str(stop.value.code)
        assert message.startswith("error: ") and "\n" not in message
        assert said in message, message

    def test_its_mirror_at_alpha_zero_is_the_vllm_emulation(self) -> None:
        """The tuner's mirror (vllm-2026+marconi) runs vLLM's block queue exactly at alpha
        0, and another order at alpha 2 on a trace that evicts states."""
        from marconi.workload import TraceOptions, load_trace

        chat = load_trace("sharegpt", options=TraceOptions(min_turns=10, sessions=20))

        def hits(system: str, alpha: float | None) -> list[int]:
            config = SimConfig(replay="sequential",
                               spec=PAPER_7B, capacity="1GB", bounds=False, system=system,
                               alpha=alpha)
            return run(chat, config, warn=False).records.hit.tolist()

        stock = hits("vllm-2026", None)
        assert hits("vllm-2026+marconi", 0.0) == stock
        assert hits("vllm-2026+marconi", 2.0) != stock

    def test_its_score_in_python_picks_what_numpy_picks(self) -> None:
        """`pick` scores a few candidates in Python (`flop_scores`, up to `FEW`): the same
        scores as numpy's evaluation of Marconi's declared score (`core.scores.evaluate`),
        bit for bit, and the same choice as its `argmin` (the first lowest), on random
        efficiencies (the plugin's own, from random depths), with ties, equal ones and
        alphas small to huge."""
        from marconi.core.priority import Feature
        from marconi.core.scores import evaluate, ranks

        def flop_score(eff: np.ndarray, alpha: float) -> np.ndarray:
            values = {Feature.RECENCY: ranks(len(eff)), Feature.EFFICIENCY: eff}
            return evaluate(MARCONI, values, alpha)

        order = vllm_integration.StateOrder(PAPER_7B, MARCONI)
        rng = np.random.default_rng(45)
        tried = differ = 0
        for _ in range(4000):
            n = int(rng.integers(2, vllm_integration.FEW + 1))
            kind = rng.integers(4)
            if kind == 0:  # the plugin's efficiencies: a state after d tokens, one above
                depth = rng.integers(1, 40, n) * 16
                top = (rng.random(n) * depth).astype(int) // 16 * 16
                effs = [order.above_of(int(d), int(t))[2]
                        for d, t in zip(depth, top, strict=True)]
            elif kind == 1:  # a few values, many ties
                effs = [float(v) for v in rng.integers(0, 3, n) * 0.1]
            elif kind == 2:
                effs = [0.37] * n
            else:
                effs = [float(v) for v in rng.random(n) * 10.0 ** rng.integers(-3, 12)]
            for alpha in (1e-3, 0.1, 1 / 3, 2.0, 7.5, 1e9):
                scores = flop_score(np.array(effs), alpha)
                assert vllm_integration.flop_scores(effs, alpha, MARCONI) == scores.tolist()
                plain = int(np.argmin(scores))
                assert vllm_integration.first_lowest(effs, alpha, MARCONI) == plain, (effs, alpha)
                tried += 1
                differ += int(plain != 0)
        assert differ > tried // 4  # many choices are not simply the first


class TestInsideVLLM:
    def test_any_other_version_is_refused(self) -> None:
        need("vllm")
        code = ("import vllm; vllm.__version__ = '0.35.0'\n"
                "from marconi.engines.integrations.vllm import install\n"
                "from marconi.core.spec import PAPER_7B\n"
                "install(PAPER_7B)\n")
        python = envs_dir() / "vllm" / "bin" / "python"
        done = subprocess.run([str(python), "-c", code], capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
        assert done.returncode != 0
        assert "supports vllm 0.32.x, 0.33.x and 0.34.x only; this environment has 0.35.0" \
            in done.stderr

    @pytest.mark.parametrize("system", [
        VLLM_STOCK, f"{VLLM_WITH},tuner=inline",
        f"{VLLM_STOCK}:integration=marconi+,tuner=inline"])
    def test_vllm_0_33s_cache_classes_give_0_32s_hits(self, chat, system: str) -> None:
        """vLLM 0.33's own cache classes (its GPU wheel, no CPU build exists, on the CPU
        torch: `vllm-0.33`), stock and with either policy installed: vLLM's checks and the
        plugin's pass after every request, and every request hits as through 0.32's, with
        the same alpha chosen (the pool's code changed little between them)."""
        need("vllm")
        need("vllm-0.33")
        from marconi.sim.real_engine import replay

        got = {}
        for version in ("0.32", "0.33"):
            name = system.replace("vllm-0.32", f"vllm-{version}")
            config = SimConfig(replay="sequential",
                               spec=PAPER_7B, capacity="1GB", bounds=False, system=name)
            got[version] = replay(chat, config, get_system(name), check=True)
        assert got["0.33"].engine is not None and got["0.33"].engine["version"] == "0.33.0"
        assert got["0.32"].stats.evictions > 0
        assert (got["0.33"].records.hit == got["0.32"].records.hit).all()
        assert got["0.33"].alpha == got["0.32"].alpha

    @pytest.mark.parametrize("system", [
        "vllm-0.33", "vllm-0.33:integration=marconi,tuner=inline",
        "vllm-0.33:integration=marconi+,tuner=inline"])
    def test_vllm_0_34s_cache_classes_give_0_33s_hits_at_its_block_size(self, chat,
                                                                        system: str) -> None:
        """vLLM 0.34's own cache classes (its GPU wheel, on the CPU torch: `vllm-0.34`),
        stock and with either policy installed: vLLM's checks and the plugin's pass after
        every request, and every request hits as through 0.33's at the block size 0.34
        derives (its default block size is 64, not 16: 128 tokens for paper-7b, where 0.33
        derives 80), with the same alpha chosen. marconi+ moves alpha off 0 here, so the
        plugin chooses states through 0.34's pool (whose blocks' hash fields were renamed
        and whose pool is held by weak reference: `block_fields`, `pool_self`)."""
        need("vllm-0.33")
        need("vllm-0.34")
        from marconi.sim.real_engine import replay

        got = {}
        for version in ("0.33", "0.34"):
            name = system.replace("vllm-0.33", f"vllm-{version}")
            if version == "0.33":
                name = name + ("," if ":" in name else ":") + "block_size=128"
            config = SimConfig(replay="sequential",
                               spec=PAPER_7B, capacity="1GB", bounds=False, system=name)
            got[version] = replay(chat, config, get_system(name), check=True)
        engine, before = got["0.34"].engine, got["0.33"].engine
        assert engine is not None and engine["version"] == "0.34.0" and before is not None
        assert engine["block_size"] == before["block_size"] == 128
        assert got["0.33"].stats.evictions > 0
        assert (got["0.34"].records.hit == got["0.33"].records.hit).all()
        assert got["0.34"].alpha == got["0.33"].alpha
        if "marconi+" in system:
            done = got["0.34"].summary().to_json()["engine"]["integration"]
            assert done["victims"] > 0

    def test_marconis_order_chooses_the_same_victims_through_0_34s_pool(self, chat) -> None:
        """At a fixed alpha (2) Marconi's order chooses states through 0.34's pool as
        through 0.33's at the same block size: as many victims, each also chosen the plain
        way and compared (check mode), and every request's hit the same. 0.34 renamed the
        block's hash fields and holds its pool by weak reference: read as 0.33's, the
        plugin would find no free state to choose among (no victim, or an error)."""
        need("vllm-0.33")
        need("vllm-0.34")
        from marconi.sim.real_engine import replay

        got = {}
        for name in ("vllm-0.33:integration=marconi,block_size=128",
                     "vllm-0.34:integration=marconi"):
            config = SimConfig(replay="sequential", spec=PAPER_7B, capacity="1GB",
                               bounds=False, system=name, alpha=2.0)
            got[name] = replay(chat, config, get_system(name), check=True)
        old, new = got.values()
        done = [r.summary().to_json()["engine"]["integration"] for r in (old, new)]
        assert done[1]["victims"] > 0 and done[1]["checked"] > 0
        assert done[1]["victims"] == done[0]["victims"]
        assert (new.records.hit == old.records.hit).all()

    @pytest.mark.parametrize(("trace", "seed", "capacity"), [
        ("synthetic:agent:sessions=8", 11, "3GB"),
        ("synthetic:multi-turn:sessions=30", 12, "1GB"),
        ("synthetic:multi-turn:sessions=40,turns=6", 15, "800MB"),
    ])
    def test_integrity_holds_on_fuzzed_traces_that_evict(self, trace: str, seed: int,
                                                         capacity: str) -> None:
        """vLLM's pool accounting and hash map checked after every request, with Marconi's
        order choosing which states leave (alpha 2), on traces of other shapes; each
        victim is also chosen the plain way (`StateOrder.first` over the free states as
        the blocks say) and must be the same, its books too."""
        need("vllm")
        from marconi.sim.real_engine import replay
        from marconi.workload import TraceOptions, load_trace

        config = SimConfig(replay="sequential",
                           spec=PAPER_7B, capacity=capacity, bounds=False, system=VLLM_WITH,
                           alpha=2.0)
        requests = load_trace(trace, options=TraceOptions(seed=seed))
        ours = replay(requests, config, get_system(VLLM_WITH), check=True).summary().to_json()
        done = ours["engine"]["integration"]
        assert done["victims"] > 0 and ours["evictions"] > 0
        assert done["checked"] > 0

    def test_the_free_states_built_when_alpha_leaves_zero_are_vllms_queue(self, chat
                                                                          ) -> None:
        """The free states a choice scores are found by one walk of vLLM's free queue when
        a choice needs them (no books of them are kept); once the tuner (inline:
        reproducible) moves alpha off 0 mid-run, each choice checks them against the queue
        as `get_all_free_blocks` gives it, and the victim against the plain order."""
        need("vllm")
        from marconi.sim.real_engine import replay

        system = f"{VLLM_WITH},tuner=inline"
        config = SimConfig(replay="sequential",
                           spec=PAPER_7B, capacity="1GB", bounds=False, system=system)
        ours = replay(chat, config, get_system(system), check=True).summary().to_json()
        hook = ours["engine"]["integration"]
        # alpha left 0 when the tuner adopted one (its guard restores 0 later on this trace)
        assert ours["alpha_status"] == "tuned" and hook["guard"]["adopted"] > 0
        assert hook["checked"] > 0 and hook["victims"] > 0

    def test_alpha_zero_keeping_orphans_is_the_stock_engine(self, chat, vllm_stock) -> None:
        need("vllm")
        ours = run(chat, SimConfig(replay="sequential", spec=PAPER_7B, capacity="1GB", bounds=False,
                                   system=f"{VLLM_WITH},orphans=keep", alpha=0.0), warn=False)
        assert (ours.records.hit == vllm_stock.records.hit).all()
        assert ours.alpha_status == "fixed" and ours.stats.evictions > 0

    def test_kv_past_the_last_state_leaves_first_and_saves_more(self, chat,
                                                                vllm_stock) -> None:
        """Alpha 0: states leave in vLLM's order, and the cached KV no hit can reach
        (past each finished request's last state) before anything else: more FLOPs saved
        than stock (a last state found too shallow evicts live KV and saves far less)."""
        need("vllm")
        from marconi.sim.real_engine import replay

        config = SimConfig(replay="sequential",
                           spec=PAPER_7B, capacity="1GB", bounds=False, system=VLLM_WITH,
                           alpha=0.0)
        ours = replay(chat, config, get_system(VLLM_WITH), check=True)
        hook = ours.summary().to_json()["engine"]["integration"]
        assert hook["orphans"] > 0 and hook["victims"] == 0
        assert ours.summary().flops_saved > 1.05 * vllm_stock.summary().flops_saved

    def test_its_order_keeps_states_whole_and_changes_what_leaves(self, chat,
                                                                  vllm_stock) -> None:
        """A state spans one block per Mamba group (six here) and serves a hit only whole:
        choosing victims group by group broke states apart and saved under a third of
        stock's FLOPs. With whole states the order moves hits, not the scale of them."""
        need("vllm")
        from marconi.sim.real_engine import replay

        system = f"{VLLM_WITH},orphans=keep"  # the state order alone
        config = SimConfig(replay="sequential",
                           spec=PAPER_7B, capacity="1GB", bounds=False, system=system,
                           alpha=2.0)
        ours = replay(chat, config, get_system(system), check=True)
        hook = ours.summary().to_json()["engine"]["integration"]
        assert hook["victims"] > 0 and hook["orphans"] == 0
        assert ours.alpha == 2.0 and ours.alpha_status == "fixed"
        assert (ours.records.hit != vllm_stock.records.hit).any()
        assert ours.summary().flops_saved > 0.9 * vllm_stock.summary().flops_saved

    def test_marconi_plus_checks_pass_and_it_saves_more(self, chat, vllm_stock) -> None:
        """marconi+'s shadow experts inline: vLLM's checks pass after every request, the
        engine runs the alpha its shadows chose, and saves more than stock."""
        need("vllm")
        from marconi.sim.real_engine import replay

        system = f"{VLLM_STOCK}:integration=marconi+,tuner=inline"
        config = SimConfig(replay="sequential",
                           spec=PAPER_7B, capacity="1GB", bounds=False, system=system)
        ours = replay(chat, config, get_system(system), check=True).summary().to_json()
        hook = ours["engine"]["integration"]
        chosen = hook["switches"][-1][1] if hook["switches"] else 0.0
        assert hook["policy"] == "marconi+" and ours["alpha"] == chosen
        assert ours["alpha_status"] == "tuned" and hook["requests"] == len(chat)
        assert ours["flops_saved"] > 1.05 * vllm_stock.summary().flops_saved

    def test_the_tuner_tunes_off_the_scheduling_loop(self, chat) -> None:
        need("vllm")
        ours = run(chat, SimConfig(replay="sequential", spec=PAPER_7B, capacity="1GB", bounds=False,
                                   system=VLLM_WITH), warn=False).summary().to_json()
        hook = ours["engine"]["integration"]
        assert ours["alpha_status"] == "tuned" and ours["alpha"] == hook["alpha"]
        assert hook["tuner_off_loop"] is True
        assert 0 < hook["requests"] <= len(chat) and hook["tuner_ns"] > 0


@pytest.fixture(scope="module")
def vllm_stock(chat):
    """Stock vLLM on `chat` at 1 GB, its integrity checks after every request."""
    need("vllm")
    from marconi.sim.real_engine import replay

    config = SimConfig(replay="sequential",
                       spec=PAPER_7B, capacity="1GB", bounds=False, system=VLLM_STOCK)
    return replay(chat, config, get_system(VLLM_STOCK), check=True)
