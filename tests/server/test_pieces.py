"""The server's parts without HTTP (and the `serve` command as a process): codec,
detokenizer, config, CLI, the engine hook, the scheduler, sampling."""

from __future__ import annotations

import argparse
import contextlib
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

from marconi.commands.serve import config_from_args, register
from marconi.engines.hf import Engine, HybridModel, Sampling, sample
from marconi.server.chat import Detokenizer, EmbeddedCodec, Message
from marconi.server.config import EMBEDDED_MODEL, ServerConfig
from marconi.server.metrics import ServerMetrics
from marconi.server.scheduler import Event, Failed, Job, Scheduler
from tests.server.harness import wait_for


@pytest.fixture(scope="module")
def codec() -> EmbeddedCodec:
    return EmbeddedCodec(memo_size=2)


class TestEmbeddedCodec:
    def test_a_conversation_only_grows_at_the_end(self, codec: EmbeddedCodec) -> None:
        one = [Message("system", "Be brief."), Message("user", "Hello there")]
        two = [*one, Message("assistant", "Hi."), Message("user", "Bye")]
        first, second = codec.render_chat(one), codec.render_chat(two)
        marker = codec.render_chat([])[1:]  # the generation prompt after BOS
        assert first[0] == codec.bos_id and first[-len(marker):] == marker
        assert second[: len(first)] == first  # prefix stable, turn by turn

    def test_render_marks_where_each_message_ends(self, codec: EmbeddedCodec) -> None:
        messages = [Message("system", "Be brief."), Message("user", "Hello there")]
        tokens, ends = codec.render(messages)
        assert tokens == codec.render_chat(messages) and len(ends) == 2
        assert 0 < ends[0] < ends[1] < len(tokens)
        alone, alone_ends = codec.render(messages[:1])
        assert alone_ends == ends[:1] and tokens[: ends[0]] == alone[: ends[0]]

    def test_replies_come_back_as_the_tokens_generated(self, codec: EmbeddedCodec) -> None:
        tokens = [9000, 17, 30000, 2]
        text = codec.decode(tokens)
        codec.remember(text, tokens)
        rendered = codec.render_chat([Message("assistant", text)])
        assert rendered[1:-len(codec.render_chat([])[1:])][-len(tokens):] == tokens
        codec.remember("a", [5])
        codec.remember("b", [6])  # memo bounded at 2: `text` is forgotten
        assert codec.render_chat([Message("assistant", text)]) != rendered

    def test_unknown_role(self) -> None:
        with pytest.raises(ValueError, match="role"):
            Message("robot", "x")


class TestDetokenizer:
    def test_deltas_concatenate_to_the_whole_text(self, codec: EmbeddedCodec) -> None:
        tokens = [int(t) for t in np.random.default_rng(0).integers(3, 32000, 200)]
        tokens += [130, 131, 132]  # byte-fallback pieces that may form partial characters
        detok = Detokenizer(codec, frozenset({2}))
        deltas = [detok.push(t) for t in [*tokens, 2]] + [detok.flush()]
        assert "".join(deltas) == detok.text == codec.decode(tokens)


class TestConfig:
    @pytest.mark.parametrize(("field", "value", "match"), [
        ("system", "nope", "unknown system"), ("capacity", "lots", "bad size"),
        ("alpha", -1.0, "alpha"), ("port", 70000, "port"), ("max_queue", 0, "queue"),
        ("max_tokens", 0, "max tokens"), ("model", "/no/such/folder", "not a folder"),
        ("max_messages", 0, "--max-messages must be an integer >= 1, got 0"),
        ("max_content_parts", -1, "--max-content-parts must be an integer >= 1"),
        ("max_connections", 0, "--max-connections must be an integer >= 1"),
        ("header_timeout", 0, r"--header-timeout must be seconds in \(0, 86400\], got 0"),
        ("header_timeout", float("nan"), "--header-timeout must be seconds"),
        ("body_timeout", -1.0, "--body-timeout must be seconds"),
        ("body_timeout", float("inf"), "--body-timeout must be seconds"),
        ("body_deadline", 0, "--body-deadline must be seconds")])
    def test_rejects(self, field: str, value: object, match: str) -> None:
        with pytest.raises(ValueError, match=match):
            ServerConfig(**{field: value})  # type: ignore[arg-type]

    def test_defaults(self) -> None:
        config = ServerConfig()
        assert config.name == EMBEDDED_MODEL and config.host == "127.0.0.1"
        assert config.capacity_bytes == 10**9
        assert config.body_limit(4096) == 2**20 and config.body_limit(2**17) == 2**25
        assert ServerConfig(max_body_size="4MB").body_limit(4096) == 4 * 10**6

    def test_the_old_name_of_capacity_still_works_and_warns(self) -> None:
        with pytest.warns(FutureWarning, match=r"capacity=\.\.\."):
            config = ServerConfig(cache_size="64MB")
        assert config.capacity_bytes == 64 * 10**6

    def test_rejects_a_tiny_body_limit(self) -> None:
        with pytest.raises(ValueError, match="max body size"):
            ServerConfig(max_body_size=100)


class TestCli:
    def test_serve_flags(self, capsys: pytest.CaptureFixture) -> None:
        parser = argparse.ArgumentParser()
        register(parser.add_subparsers(dest="command"))
        args = parser.parse_args(["serve", "--capacity", "64MB", "--system", "sglang+",
                                  "--port", "0", "--max-queue", "3", "--max-tokens", "5"])
        config = config_from_args(args)
        assert (config.capacity_bytes, config.system, config.max_queue, config.max_tokens) == (
            64 * 10**6, "sglang+", 3, 5)
        assert config.max_body_size is None
        old = parser.parse_args(["serve", "--cache-size", "32MB"])  # the old name: warns
        assert config_from_args(old).capacity_bytes == 32 * 10**6
        assert "--cache-size is now --capacity" in capsys.readouterr().err
        args = parser.parse_args(["serve", "--max-body-size", "2MB"])
        assert config_from_args(args).body_limit(4096) == 2 * 10**6
        assert (config.header_timeout, config.body_timeout, config.max_connections,
                config.max_messages, config.max_content_parts) == (10, 30, 512, 4096, 4096)
        args = parser.parse_args(["serve", "--header-timeout", "2.5", "--body-timeout", "7",
                                  "--max-connections", "9", "--max-messages", "5",
                                  "--max-content-parts", "6"])
        config = config_from_args(args)
        assert (config.header_timeout, config.body_timeout, config.max_connections,
                config.max_messages, config.max_content_parts) == (2.5, 7, 9, 5, 6)

    @pytest.mark.parametrize(("flags", "said"), [
        (["--threads", "0"], "must be >= 1, got 0"),
        (["--served-model-name", ""], "--served-model-name must not be empty"),
        (["--header-timeout", "0"], "--header-timeout must be seconds in (0, 86400], got 0.0"),
        (["--body-timeout", "-2"], "--body-timeout must be seconds in (0, 86400]"),
        (["--max-connections", "0"], "--max-connections must be an integer >= 1, got 0"),
        (["--max-messages", "0"], "--max-messages must be an integer >= 1, got 0"),
        (["--system", "marconi+-overlap"], "--system marconi+-overlap cannot serve: its "
         "checkpoint placement keeps every sequence it has seen"),
        (["--system", "sparse-prefix"], "cannot serve: its checkpoint placement"),
    ])
    def test_serve_refuses_what_cannot_work(self, flags: list[str], said: str,
                                            capsys: pytest.CaptureFixture) -> None:
        from marconi.cli import main

        try:
            code = main(["serve", *flags])
        except SystemExit as stop:  # argparse's own refusal
            code = stop.code
        assert code == 2 and said in capsys.readouterr().err

    def test_serve_says_what_it_serves_and_where(self) -> None:
        """The real command: its first lines name the model, system, cache and URL."""
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        command = [sys.executable, "-m", "marconi", "serve", "--port", str(port),
                   "--capacity", "16MB", "--system", "sglang+", "--threads", "1"]
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                   text=True)
        try:
            lines = _read_lines(process, 3, timeout=300)  # a loaded CI machine
            wait_for(lambda: _healthy(f"http://127.0.0.1:{port}"), timeout=60,
                     what="the server to answer /health")
        finally:
            process.send_signal(signal.SIGINT)
            process.wait(30)
        banner = "\n".join(lines)
        for text in (EMBEDDED_MODEL, "context 4096 tokens", "system sglang+",
                     "prefix cache 16.00 MB", f"http://127.0.0.1:{port}/v1"):
            assert text in banner


def _read_lines(process: subprocess.Popen[str], n: int, timeout: float) -> list[str]:
    """The first `n` lines the process prints, waiting at most `timeout` seconds (a
    reader thread: a buffered pipe can hold lines that `select` no longer sees)."""
    lines: queue.Queue[str] = queue.Queue()
    assert process.stdout is not None
    stdout = process.stdout
    threading.Thread(target=lambda: [lines.put(line) for line in stdout], daemon=True).start()
    out: list[str] = []
    deadline = time.monotonic() + timeout
    while len(out) < n:
        left = deadline - time.monotonic()
        assert left > 0 and process.poll() is None, f"no banner; got {out}"
        with contextlib.suppress(queue.Empty):
            out.append(lines.get(timeout=min(left, 1.0)))
    return out


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
            return response.status == 200
    except OSError:
        return False


class TestEngineHook:
    def test_on_token_streams_and_stops_early(self, model: HybridModel) -> None:
        prompt = np.arange(10, 50, dtype=np.int32)
        full = Engine(model, "marconi", "64MB").generate(prompt, 12)
        seen: list[int] = []
        engine = Engine(model, "marconi", "64MB")
        part = engine.generate(prompt, 12, on_token=lambda t: seen.append(t) or len(seen) < 5)
        assert seen == list(part.output) == list(full.output[:5])
        assert part.logits.shape[0] == 5
        again = engine.generate(np.concatenate([prompt, part.output, [7]]), 3)
        assert again.hit == len(prompt) + 5  # the state after the stopped output was kept


class TestTuner:
    def test_each_system_gets_its_own_tuner(self) -> None:
        from marconi.paper.tuner import BootstrapTuner
        from marconi.plus.shadows import Boundaries, ShadowTuner
        from marconi.server.backend import _tuner as made

        thread = ThreadPoolExecutor(max_workers=1)

        def _tuner(config: ServerConfig) -> object:
            return made(config, thread)

        shadows = _tuner(ServerConfig(system="marconi+"))
        assert isinstance(shadows, ShadowTuner)
        assert shadows.expert.boundaries is Boundaries.FIRST  # a system prompt's end
        assert len(set(shadows.config.experts)) == len(shadows.config.experts) == 13
        assert shadows.config.overlap_memory is not None  # a server keeps a bounded planner
        plain = _tuner(ServerConfig(system="marconi+-no-boundaries"))
        assert isinstance(plain, ShadowTuner) and plain.expert.boundaries is Boundaries.NONE
        bootstrap = _tuner(ServerConfig(system="marconi"))
        assert isinstance(bootstrap, BootstrapTuner) and not bootstrap.wait
        assert _tuner(ServerConfig(system="sglang+")) is None
        assert _tuner(ServerConfig(system="marconi", alpha=1.0)) is None


class TestScheduler:
    def test_a_failed_generation_is_counted_and_reported(self, model: HybridModel) -> None:
        engine = Engine(model, "marconi", "16MB")
        metrics = ServerMetrics(engine)
        scheduler = Scheduler(engine, metrics, max_queue=2)
        events: list[Event] = []
        arrived = threading.Event()

        def emit(event: Event) -> None:
            events.append(event)
            arrived.set()

        scheduler.start()
        try:  # a prompt past the vocabulary: the HTTP layer refuses it, the engine too
            scheduler.submit(Job(prompt=[1, model.vocab_size], max_tokens=2, sampling=None,
                                 stop_ids=frozenset(), emit=emit))
            assert arrived.wait(30)
        finally:
            scheduler.stop()
        assert isinstance(events[-1], Failed) and isinstance(events[-1].error, ValueError)
        assert metrics.failed.labels(reason="invalid")._value.get() == 1


class TestSample:
    LOGITS = torch.tensor([0.5, 3.0, -1.0, 2.9])

    @pytest.mark.parametrize("temperature", [1e-40, 1e-300, 5e-324])
    def test_a_vanishing_temperature_is_the_argmax(self, temperature: float) -> None:
        assert sample(self.LOGITS, Sampling(temperature=temperature), 0) == 1

    def test_seeds_beyond_64_bits_wrap(self) -> None:
        draws = [sample(self.LOGITS, Sampling(temperature=1.0, seed=s), 0)
                 for s in (3, 3 + 2**64, 10**40)]
        assert draws[0] == draws[1] and draws[2] in range(4)

    def test_top_p_keeps_the_nucleus(self) -> None:
        kept = {sample(self.LOGITS, Sampling(temperature=1.0, top_p=0.6, seed=s), 0)
                for s in range(64)}
        assert kept == {1, 3}  # 1 alone holds < 0.6 of the mass; 1 and 3 hold more
        with pytest.raises(ValueError, match="top_p"):
            Sampling(top_p=0.0)
