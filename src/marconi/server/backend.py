"""What the server runs: an `Engine` (model + prefix cache) and the matching `Codec`.

With no `--model`, the embedded model: a tiny random-weight Bamba (attention + Mamba2
layers, `marconi.engines.hf.tiny_model`) whose vocabulary is Mistral v1's 32K, so it serves
at once with no download. Its text is gibberish; its caching is real.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from marconi.core.tuning import Tuner
from marconi.core.units import format_size
from marconi.engines.hf import Engine, HybridModel, load_model, tiny_model
from marconi.server.chat import Codec, EmbeddedCodec, HFCodec
from marconi.server.config import ServerConfig
from marconi.systems import TunerOptions, get_system

EMBEDDED_VOCAB = 32000  # Mistral v1


@dataclass(frozen=True, slots=True)
class Backend:
    """The engine, its tokenizer, and the name clients address it by."""

    engine: Engine
    codec: Codec
    name: str
    tuner_thread: ThreadPoolExecutor | None = None  # where the tuner's replays run

    def close(self) -> None:
        """Stop the tuner's thread without waiting for it: a replay under way finishes
        (its result unused), none starts, and the thread ends."""
        if self.tuner_thread is not None:
            self.tuner_thread.shutdown(wait=False, cancel_futures=True)

    @property
    def max_context(self) -> int:
        """Longest prompt + completion accepted, in tokens."""
        return self.engine.model.max_context


def embedded_model(seed: int = 0) -> HybridModel:
    """The default model: tiny Bamba, random weights, Mistral v1 vocabulary."""
    return tiny_model("bamba", seed=seed, vocab_size=EMBEDDED_VOCAB)


def build_backend(config: ServerConfig, model: HybridModel | None = None) -> Backend:
    """Load the model (or take `model`, for tests sharing one) and wrap it in an engine."""
    codec: Codec
    if config.model is not None:
        model = model or load_model(config.model)
        codec = HFCodec(config.model)
    else:
        model = model or embedded_model(config.seed)
        codec = EmbeddedCodec()
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="marconi-tuner")
    tuner = _tuner(config, executor)
    engine = Engine(model, config.system, config.capacity, alpha=config.alpha, tuner=tuner,
                    tune=False)
    if tuner is not None:
        tuner.start(engine.cache)  # the first request is served by its first choice
    return Backend(engine, codec, config.name, executor)


def _tuner(config: ServerConfig, executor: ThreadPoolExecutor) -> Tuner | None:
    """The system's tuner, its replays on one named background thread so requests never
    wait (as the library's default does too; the simulator alone waits for each replay).
    marconi+'s shadow experts run inline: a token-level lookup and commit per expert
    after each request (13 experts, three of them planning each input: about 3 ms a
    request on 2 cores, benchmarks/RESULTS.md; `marconi+-no-overlap`'s 10 take half).

    marconi+ starts on the expert that checkpoints the first message's end
    (`first_boundary`), as the simulator's serving replay starts it: a chat server knows
    its requests start with system prompts, so it starts there and a system prompt hits
    on its second use (the sequential replay starts on plain judicious admission and
    adopts that expert once it leads). The shadows still switch away if it does not pay.
    """
    return get_system(config.system).make_tuner(
        config.alpha, TunerOptions(executor=executor, wait=False, first_boundary=True))


def describe(backend: Backend, config: ServerConfig) -> str:
    """What `marconi serve` prints before it listens: model, system, limits, where."""
    what = ("embedded tiny Bamba, random weights" if config.model is None
            else f"from {config.model}")
    spec = backend.engine.cache.spec
    host = f"[{config.host}]" if ":" in config.host else config.host
    return "\n".join((
        f"marconi serve: model `{backend.name}` ({what}; context {backend.max_context} "
        f"tokens; {spec.attention_layers} attention + {spec.ssm_layers} SSM layers)",
        f"  system {config.system}, prefix cache {format_size(config.capacity_bytes)} "
        f"(KV + SSM states), queue {config.max_queue}, default max_tokens "
        f"{config.max_tokens}, body limit {format_size(config.body_limit(backend.max_context))}",
        f"  OpenAI base URL http://{host}:{config.port}/v1  (also /health, /metrics)"))
