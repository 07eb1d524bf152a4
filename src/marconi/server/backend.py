"""What the server runs: an `Engine` (model + prefix cache) and the matching `Codec`.

With no `--model`, the embedded model: a tiny random-weight Bamba (attention + Mamba2
layers, `marconi.engine.tiny_model`) whose vocabulary is Mistral v1's 32K, so it serves
at once with no download. Its text is gibberish; its caching is real.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from marconi.core.tuning import Tuner
from marconi.engine import Engine, HybridModel, load_model, tiny_model
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
    engine = Engine(model, config.system, config.capacity, alpha=config.alpha,
                    tuner=_tuner(config), tune=False)
    return Backend(engine, codec, config.name)


def _tuner(config: ServerConfig) -> Tuner | None:
    """The system's tuner, its replays on a background thread so requests never wait.

    (The library default uses processes and waits: right for the simulator, wrong inside
    a server whose engine thread holds torch.) marconi+'s shadow experts run inline: a
    token-level lookup and commit per expert after each request.
    """
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="marconi-tuner")
    return get_system(config.system).make_tuner(
        config.alpha, TunerOptions(executor=executor, wait=False))
