"""`ServerConfig`: every knob of `marconi serve`, validated once."""

from __future__ import annotations

import warnings
from dataclasses import InitVar, dataclass
from pathlib import Path

from marconi.core.units import parse_size
from marconi.settings import DEFAULT, RUN
from marconi.systems import get_system

EMBEDDED_MODEL = "marconi-tiny-bamba"  # name served when no --model is given
# A prompt that fits the context is at most 32 characters a token (the server refuses
# longer text untokenized), and JSON spends at most 6 bytes on a character ("\u00e9").
BODY_BYTES_PER_TOKEN = 256
MIN_BODY_BYTES = 2**20  # chat history and fields around a short-context prompt
MAX_TIMEOUT_S = 86400  # a day: longer is a typo (and past what asyncio timers are for)


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerConfig:
    """What to serve and how; `ValueError` on nonsense so the CLI can say it in one line."""

    model: Path | None = None  # local HF checkpoint folder; None: the embedded tiny model
    served_name: str | None = None  # name clients pass as `model`; None: derived
    # bound on the prefix cache's KV + SSM state bytes: less than a replay's default
    # (settings.DEFAULT.capacity), since a served model shares the machine's memory
    capacity: int | str = "1GB"
    system: str = DEFAULT.system  # caching system, as in the simulator
    alpha: float | None = None  # fixed alpha; None: bootstrap-tuned (FLOP-aware systems)
    host: str = "127.0.0.1"  # loopback by default: exposing a server is a choice
    port: int = 8000
    max_queue: int = 64  # requests allowed to wait; one more gets 429
    max_tokens: int = 16  # default completion length when a request sets none
    seed: int = 0  # random weights of the embedded model
    max_body_size: int | str | None = None  # bytes of a request body; None: from the context
    max_messages: int = 4096  # messages in one chat body
    max_content_parts: int = 4096  # content parts in one chat body, all messages together
    header_timeout: float = 10.0  # seconds to send a request's headers
    body_timeout: float = 30.0  # seconds a request body may go without a byte arriving
    body_deadline: float = 120.0  # seconds a whole request body may take, however it drips
    max_connections: int = 512  # open connections; past it a connection's request gets 503
    # the old name of `capacity` (before the server named it as the simulator does): still
    # taken, with a warning
    cache_size: InitVar[int | str | None] = None

    def body_limit(self, max_context: int) -> int:
        """The request body limit: as set, or `BODY_BYTES_PER_TOKEN` per token of the
        model's context (at least `MIN_BODY_BYTES`): room for any prompt that fits."""
        if self.max_body_size is not None:
            return parse_size(self.max_body_size)
        return max(MIN_BODY_BYTES, BODY_BYTES_PER_TOKEN * max_context)

    def __post_init__(self, cache_size: int | str | None) -> None:
        if cache_size is not None:
            warnings.warn("ServerConfig(cache_size=...) is now ServerConfig(capacity=...), as "
                          "the simulator names it; cache_size will go", FutureWarning,
                          stacklevel=3)
            object.__setattr__(self, "capacity", cache_size)
        if self.served_name is not None and not self.served_name.strip():
            raise ValueError("--served-model-name must not be empty (it is the name "
                             "clients pass as `model`)")
        unbounded = get_system(self.system).unbounded  # ValueError listing the known systems
        if unbounded:
            raise ValueError(f"--system {self.system} cannot serve: {unbounded} (it is for "
                             "replays: marconi simulate, compare)")
        parse_size(self.capacity)  # ValueError naming a bad size
        RUN["alpha"].check(self.alpha)
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in [0, 65535], got {self.port!r}")
        if self.max_queue < 1:
            raise ValueError(f"max queue must be >= 1, got {self.max_queue!r}")
        if self.max_tokens < 1:
            raise ValueError(f"max tokens must be >= 1, got {self.max_tokens!r}")
        if self.max_body_size is not None and parse_size(self.max_body_size) < 1024:
            raise ValueError(f"max body size must be >= 1KB, got {self.max_body_size!r}")
        for flag, value in (("--max-messages", self.max_messages),
                            ("--max-content-parts", self.max_content_parts),
                            ("--max-connections", self.max_connections)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{flag} must be an integer >= 1, got {value!r}")
        for flag, seconds in (("--header-timeout", self.header_timeout),
                              ("--body-timeout", self.body_timeout),
                              ("--body-deadline", self.body_deadline)):
            if isinstance(seconds, bool) or not isinstance(seconds, int | float) or \
                    not 0 < seconds <= MAX_TIMEOUT_S:
                raise ValueError(f"{flag} must be seconds in (0, {MAX_TIMEOUT_S}], got "
                                 f"{seconds!r}")
        if self.model is not None and not Path(self.model).is_dir():
            raise ValueError(f"--model {self.model}: not a folder (a local HF checkpoint)")

    @property
    def capacity_bytes(self) -> int:
        """The cache's capacity in bytes."""
        return parse_size(self.capacity)

    @property
    def name(self) -> str:
        """The model name clients must use (and `/v1/models` lists)."""
        if self.served_name:
            return self.served_name
        return Path(self.model).name if self.model is not None else EMBEDDED_MODEL
