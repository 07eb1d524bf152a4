"""A real vLLM server with marconi's plugin (docs/integrations.md, "Serving with vLLM"):
started as a user would, by `bash scripts/serve-vllm.sh marconi` (the reference server
without prefix caching by marconi.engines.real.vllm_server), on a contended pool, replaying
multi-turn conversations through the real `openai` client with streaming. The plugin says
it is on in the engine's processes, every request succeeds, requests hit, the greedy
outputs equal token for token those of the same server with prefix caching off, and the
tuner (in its own process) adopts an alpha. A third, `scripts/serve-vllm.sh lfu`, runs a
registered declared priority the same way.

Needs vLLM's environment (`bash scripts/setup-peers.sh vllm`): skipped without it, except
under CI (CI=true), where it fails. Three server starts, at once: a few minutes."""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from marconi.engines.real.serve_replay import Replayed, replay, scaled
from marconi.engines.real.vllm_server import (
    NAME,
    VOCAB,
    Server,
    ServerConfig,
    read_pool,
    write_model,
)
from marconi.workload import TraceOptions, load_trace
from tests.test_realpeers import need

pytestmark = pytest.mark.slow
BLOCKS = 32  # the pool, in the server's blocks (128 tokens, as it logs): the conversations
# below do not fit
# 24 conversations of 8 turns over a 256-token system prompt, 160-token user messages and
# 32-token replies: prompts grow to about 1,800 tokens, so hits span whole blocks; the
# bootstrap tuner (its mirror evicting from about the 30th request) adopts an alpha near
# the 180th
WORKLOAD = "synthetic:multi-turn:turns=8,user_len=160,output_len=32"
ADOPTION_WAIT = 90.0  # seconds the bootstrap's replays (in the tuner's process) may take
SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "serve-vllm.sh"


class ScriptServer(Server):
    """The server `scripts/serve-vllm.sh POLICY` starts, given the pool and model length
    as the flags it passes on to vLLM; stopped as a user stops it: SIGTERM to the script."""

    def start(self) -> None:
        config = self.config
        env = {k: v for k, v in os.environ.items() if not k.startswith("MARCONI_")
               or k == "MARCONI_PEERS_DIR"}
        env.update(PORT=str(self.port), MARCONI_SERVE_MODEL=str(config.model))
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as out:
            self.proc = subprocess.Popen(
                ["bash", str(SCRIPT), config.policy, "--num-gpu-blocks-override",
                 str(config.blocks), "--max-model-len", str(config.max_model_len)],
                env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Replayed, str, Any]]:
    need("vllm")
    out = tmp_path_factory.mktemp("serve")
    model = write_model(out / "model")
    chat = load_trace(WORKLOAD, options=TraceOptions(sessions=24))
    trace = scaled(chat, vocab=VOCAB, max_output=32, max_tokens=2048, span=20.0)
    servers = {policy: kind(ServerConfig(model=model, policy=policy, blocks=BLOCKS,
                                         max_model_len=2048), out / f"{policy}.log")
               for policy, kind in (("nocache", Server), ("marconi", ScriptServer),
                                    ("lfu", ScriptServer))}
    runs, chats = {}, {}
    try:
        for server in servers.values():  # all start at once (a minute, not three)
            server.start()
        for policy, server in servers.items():
            server.wait()
            replayed = replay(server.url, NAME, trace, concurrency=4)
            chats[policy] = _chat(server.url)
            deadline = time.monotonic() + (ADOPTION_WAIT if policy == "marconi" else 0)
            while time.monotonic() < deadline and "adopted" not in server.log():
                time.sleep(1.0)
            server.stop()
            runs[policy] = (replayed, server.log())
    finally:
        for server in servers.values():
            server.stop()
    return {policy: (*run, chats[policy]) for policy, run in runs.items()}


def _chat(url: str) -> Any:
    """One chat request through the `openai` client (the model's chat template renders
    it; `<i>` words are token i)."""
    from openai import OpenAI

    client = OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=120)
    return client.chat.completions.create(
        model=NAME, messages=[{"role": "user", "content": "<5> <6> <7>"}], max_tokens=4,
        temperature=0)


def test_chat_requests_are_served(served) -> None:
    """The tiny model has a chat template (vLLM answers 400 without one)."""
    ours, reference = served["marconi"][2], served["nocache"][2]
    assert ours.usage.prompt_tokens == 4  # <5> <6> <7>, a line break, then <2>
    assert ours.usage.completion_tokens == 4 and ours.choices[0].message.content
    assert ours.choices[0].message.content == reference.choices[0].message.content


def _errors(log: str) -> list[str]:
    """The log's error lines, less vLLM 0.32's own shutdown race (docs/integrations.md,
    "Serving with vLLM"): once its drain has completed (`MPClient: complete`), its output
    handler may log `AsyncLLM output_handler failed` with an `EngineDeadError` traceback,
    with or without marconi. Any other error line, or that one before the drain ended,
    counts."""
    marker = "[shutdown] MPClient: complete"
    before, _, after = log.partition(marker)
    error = re.compile(r"\bERROR\b|Traceback|EngineDeadError|leaked")
    return ([ln for ln in before.splitlines() if error.search(ln)]
            + [ln for ln in after.splitlines() if error.search(ln) and "[async_llm.py:" not in ln])


def test_a_stop_drains_the_engine_and_leaves_nothing_behind(served) -> None:
    """SIGTERM to the API server alone with a shutdown timeout (the script passes its own
    SIGTERM on so): the engine core drains (killed, it left two shared-memory objects),
    and the tuner's process, finding the engine gone, exits without a traceback."""
    for policy in ("marconi", "nocache"):
        log = served[policy][1]
        assert not _errors(log), _errors(log)[:5]
        assert "stopping engine client mode=drain" in log, log[-3000:]
        assert "leaked shared_memory" not in log and "tuner_process.py" not in log, log[-3000:]


def test_the_script_starts_the_plugin_on_its_own_model(served) -> None:
    """scripts/serve-vllm.sh names the command it runs, with the flags given after the
    policy passed on to vLLM."""
    _, log, _ = served["marconi"]
    line = next(ln for ln in log.splitlines() if ln.startswith("serve-vllm: "))
    assert "MARCONI_VLLM=marconi" in line and line.endswith(
        f"--num-gpu-blocks-override {BLOCKS} --max-model-len 2048"), line


def test_the_plugin_says_it_is_on_in_the_engine_core(served) -> None:
    _, log, _ = served["marconi"]
    on = re.findall(r"\((EngineCore|VllmWorker-0)[^)]*\).*marconi: on in this process", log)
    assert "EngineCore" in on, log[-3000:]
    assert "policy marconi, model granitemoehybrid, alpha bootstrap-tuned (tuner in a " \
           "process)" in log
    assert "mid-prefill Mamba checkpoint is off" in log
    _, stock_log, _ = served["nocache"]
    assert "marconi: on" not in stock_log  # without MARCONI_VLLM nothing is installed


def test_every_request_succeeds_and_some_hit(served) -> None:
    replayed, _, _ = served["marconi"]
    failed = [s.error for s in replayed.served if s.error is not None]
    assert not failed and len(replayed.served) > 50
    assert sum(s.cached_tokens for s in replayed.served) >= 20 * 256
    assert sum(s.cached_tokens > 0 for s in replayed.served) >= 10
    assert all(s.cached_tokens < s.prompt_tokens for s in replayed.served)


def test_the_server_logs_its_pool_and_hits_whole_blocks_of_it(served, tmp_path: Path) -> None:
    """The block size and pool are the server's own (read from its log, as
    benchmarks/bench_serve.py reads them), and every hit it reports is whole blocks."""
    replayed, log, _ = served["marconi"]
    (tmp_path / "marconi.log").write_text(log)
    pool = read_pool(tmp_path / "marconi.log")
    assert (pool.blocks, pool.block_size) == (BLOCKS, 128)  # 128: not the Mamba chunk's 256
    assert all(s.cached_tokens % pool.block_size == 0 for s in replayed.served)


def test_each_request_keeps_its_served_timeline(served) -> None:
    replayed, _, _ = served["marconi"]
    for s in replayed.served:
        assert 0 <= s.sent < s.first_token <= s.finished
        assert s.session and s.prompt_tokens == len(s.prompt)


def test_outputs_equal_a_server_without_prefix_caching(served) -> None:
    ours, _, _ = served["marconi"]
    reference, _, _ = served["nocache"]
    assert [s.prompt_hash for s in ours.served] == [s.prompt_hash for s in reference.served]
    differ = [s.index for s, r in zip(ours.served, reference.served, strict=True)
              if s.output != r.output]
    assert not differ, f"{len(differ)} requests' outputs differ, the first {differ[:5]}"
    assert all(len(s.output) > 0 for s in ours.served)


def test_the_tuner_adopts_an_alpha_off_the_scheduling_loop(served) -> None:
    _, log, _ = served["marconi"]
    started = re.search(r"marconi: tuner started in \d+ ms \(process (\d+)\)", log)
    assert started is not None, log[-3000:]
    adopted = re.findall(r"\(EngineCore[^)]*\).*marconi: alpha (\S+) adopted", log)
    assert adopted, "the tuner never adopted an alpha"
    assert "is gone" not in log
    costs = [int(c) for c in re.findall(r"in the scheduling loop (\d+) us/request", log)]
    assert costs  # the plugin's cost line (the bench prints what it is)


def test_a_declared_priority_orders_the_states_of_a_served_engine(served) -> None:
    """`scripts/serve-vllm.sh lfu`: the plugin evaluates the registered LFU declaration
    in the engine core (no alpha, no tuner); every request succeeds, some hit, and the
    outputs equal those of the server without prefix caching."""
    ours, log, chat = served["lfu"]
    reference, _, _ = served["nocache"]
    on = re.findall(r"\((EngineCore|VllmWorker-0)[^)]*\).*marconi: on in this process.*"
                    r"policy lfu \(a declared priority over the Mamba states\)", log)
    assert "EngineCore" in on, log[-3000:]
    assert "tuner started" not in log and "adopted" not in log
    assert not [s.error for s in ours.served if s.error is not None]
    assert sum(s.cached_tokens for s in ours.served) > 0
    assert [s.output for s in ours.served] == [s.output for s in reference.served]
    assert chat.choices[0].message.content


def test_the_harness_names_a_server_that_cannot_start(tmp_path: Path) -> None:
    need("vllm")
    model = write_model(tmp_path / "model")
    config = ServerConfig(model=model, policy="stock", blocks=2, max_model_len=4096)
    with pytest.raises(RuntimeError, match=r"exited with code 1 at start: .*(KV cache|memory)"):
        Server(config, tmp_path / "bad.log").__enter__()
