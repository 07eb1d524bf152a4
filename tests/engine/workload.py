"""A seeded request mix for the engine fuzz: each request depends on what came before.

Kinds (docs/architecture.md, "Admission" and "Eviction", name what each exercises):

- `new`: fresh tokens (cold; a later branch splits its edge);
- `system`: one of two shared system prompts, then new tokens (a branch point that many
  requests resume at);
- `turn`: the last conversation's prompt + output + new tokens (resumes at its end);
- `branch-prompt` / `branch-output`: an earlier sequence cut inside its prompt or its
  output, then new tokens (a new branch point: a split edge, a state mid-sequence);
- `repeat`: an earlier prompt, or an earlier prompt + output, exactly (hit == input);
- `long`: more KV than the whole capacity (refused at commit, nothing evicted).

Some requests teacher-force their output (`forced`) or stop early (`stop`, `on_token`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

VOCAB = 256
KINDS = ("new", "system", "turn", "branch-prompt", "branch-output", "repeat", "long")
WEIGHTS = (0.14, 0.12, 0.22, 0.17, 0.15, 0.12, 0.08)
# kinds drawn at fixed request numbers, so every mix reaches each path whatever its seed
# (a shared prompt's second use, a repeat of a prompt plus its output, a refusal)
SCHEDULE = {1: "system", 2: "system", 4: "turn", 6: "repeat", 8: "branch-output",
            10: "long", 13: "system", 16: "repeat", 22: "long"}
MAX_TURN = 110  # a conversation longer than this starts over (it must fit the capacity)


@dataclass(frozen=True, slots=True)
class Request:
    kind: str
    prompt: np.ndarray
    steps: int = 4  # tokens to decode (or the forced output's length)
    forced: np.ndarray | None = None  # teacher-forced output (`Engine.generate(output=)`)
    stop: int | None = None  # stop decoding after this many tokens (`on_token`)


class Mix:
    """Draws requests; `done(prompt, output)` records each served one for later kinds."""

    def __init__(self, seed: int, long_len: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.long_len = long_len
        self.history: list[tuple[np.ndarray, np.ndarray]] = []
        self.last: tuple[np.ndarray, np.ndarray] | None = None  # the running conversation
        self.systems = [self.tokens(20, 40) for _ in range(2)]
        self.drawn = 0

    def tokens(self, lo: int, hi: int) -> np.ndarray:
        return self.rng.integers(0, VOCAB, int(self.rng.integers(lo, hi + 1))).astype(np.int32)

    def done(self, prompt: np.ndarray, output: np.ndarray, kind: str) -> None:
        if kind != "long":
            self.history.append((prompt, np.asarray(output, dtype=np.int32)))
            self.last = self.history[-1]

    def next(self) -> Request:
        kind = str(self.rng.choice(KINDS, p=WEIGHTS)) if self.history else "new"
        kind = SCHEDULE.get(self.drawn, kind) if self.history else kind
        self.drawn += 1
        prompt = self._prompt(kind)
        roll = self.rng.random()
        if roll < 0.15:
            forced = self.tokens(2, 5)
            return Request(kind, prompt, len(forced), forced=forced)
        if roll < 0.3:
            return Request(kind, prompt, 4, stop=int(self.rng.integers(1, 4)))
        return Request(kind, prompt)

    def _prompt(self, kind: str) -> np.ndarray:
        if kind == "long":
            return self.tokens(self.long_len, self.long_len + 10)
        if kind == "new" or (kind == "turn" and self.last is None):
            return self.tokens(12, 50)
        if kind == "system":
            system = self.systems[int(self.rng.integers(len(self.systems)))]
            return np.concatenate([system, self.tokens(3, 15)])
        prompt, out = self.last if kind == "turn" and self.last else self._earlier()
        full = np.concatenate([prompt, out])
        if kind == "turn":  # a conversation grown too long starts over
            return self.tokens(12, 50) if len(full) > MAX_TURN else \
                np.concatenate([full, self.tokens(3, 10)])
        if kind == "repeat":  # every other one: the prompt plus its output
            return full if self.drawn in SCHEDULE or self.rng.random() < 0.5 else prompt
        lo, hi = (1, len(prompt)) if kind == "branch-prompt" else (len(prompt), len(full))
        cut = int(self.rng.integers(lo, hi)) if hi > lo else lo
        return np.concatenate([full[:cut], self.tokens(3, 12)])

    def _earlier(self) -> tuple[np.ndarray, np.ndarray]:
        return self.history[int(self.rng.integers(len(self.history)))]
