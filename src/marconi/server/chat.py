"""Text <-> tokens for the server: prompts, chat templates, streaming detokenization.

Two codecs behind one protocol:

- `EmbeddedCodec`: Mistral's v1 sentencepiece tokenizer (offline, from `mistral-common`)
  and a simple template for the embedded model. Every piece is tokenized on its own, so a
  conversation's tokens only ever grow at the end and prefixes stay stable::

      <s> <|system|>{system} <|user|>{user} <|assistant|>{reply} <|user|>{user} <|assistant|>
      ^BOS  one marker + content per message                     generation prompt ^

  A reply the server generated is re-rendered with the exact tokens it was generated as
  (a bounded memo from reply text to token ids): decoding then re-encoding would change
  them, and the state the cache admitted after the reply would never match again.
- `HFCodec`: a local checkpoint's own tokenizer and chat template (`local_files_only`).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

ROLES = ("system", "developer", "user", "assistant")
ID_SLICE = 1 << 16  # token ids made Python ints in one call


@dataclass(frozen=True, slots=True)
class Message:
    """One chat message, content already flattened to text."""

    role: str  # one of ROLES
    content: str

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}, got {self.role!r}")


class Codec(Protocol):
    """What the server needs from a tokenizer."""

    eos_id: int | None  # generation stops after this token

    def encode_prompt(self, text: str) -> list[int]: ...

    def render_chat(self, messages: Sequence[Message]) -> list[int]: ...

    def render(self, messages: Sequence[Message]) -> tuple[list[int], tuple[int, ...]]: ...

    def decode(self, tokens: Sequence[int]) -> str: ...

    def token_bytes(self, token: int) -> bytes: ...

    def remember(self, text: str, tokens: Sequence[int]) -> None: ...


class EmbeddedCodec:
    """Mistral v1 sentencepiece + the template above; see the module docstring.

    Thread-safe: the server renders on a tokenizer thread and remembers replies on the
    event loop, so the memo is guarded by a lock.
    """

    def __init__(self, memo_size: int = 4096) -> None:
        import sentencepiece

        from marconi.workload.tokenizers import mistral_v1_path

        self._sp: Any = sentencepiece.SentencePieceProcessor(model_file=str(mistral_v1_path()))
        self.bos_id: int = int(self._sp.bos_id())
        self.eos_id: int | None = int(self._sp.eos_id())
        self.vocab_size: int = int(self._sp.vocab_size())
        self._markers = {r: self._encode(f"<|{r}|>") for r in ROLES}
        self._memo: OrderedDict[str, tuple[int, ...]] = OrderedDict()
        self._memo_size = memo_size
        self._lock = threading.Lock()

    def _encode(self, text: str) -> list[int]:
        """The ids of `text`. Asked for as a numpy array: a list of Python ints would be
        built inside the call, the GIL held all along (a stall of the event loop for a
        text of millions of tokens); the list is built here in slices instead, between
        which the event loop runs."""
        if not text:
            return []
        ids = self._sp.encode(text, out_type="numpy")
        out: list[int] = []
        for start in range(0, len(ids), ID_SLICE):
            out += ids[start:start + ID_SLICE].tolist()
        return out

    def encode_prompt(self, text: str) -> list[int]:
        return [self.bos_id, *self._encode(text)]

    def render_chat(self, messages: Sequence[Message]) -> list[int]:
        return self.render(messages)[0]

    def render(self, messages: Sequence[Message]) -> tuple[list[int], tuple[int, ...]]:
        """The prompt and where each message ends in it (for boundary-aware admission)."""
        tokens, ends = [self.bos_id], []
        for message in messages:
            tokens += self._markers[message.role] + self._content(message)
            ends.append(len(tokens))
        return tokens + self._markers["assistant"], tuple(ends)

    def _content(self, message: Message) -> list[int]:
        if message.role == "assistant":
            with self._lock:
                if (known := self._memo.get(message.content)) is not None:
                    self._memo.move_to_end(message.content)
                    return list(known)
        return self._encode(message.content)

    def decode(self, tokens: Sequence[int]) -> str:
        return str(self._sp.decode([int(t) for t in tokens]))

    def token_bytes(self, token: int) -> bytes:
        """The bytes `token` adds to a text (a byte-fallback piece: its one byte)."""
        piece = str(self._sp.id_to_piece(token))
        if self._sp.is_byte(token):
            return bytes([int(piece[3:5], 16)])  # "<0xE2>"
        if self._sp.is_control(token) or self._sp.is_unknown(token):
            return b""
        return piece.replace("\u2581", " ").encode()

    def remember(self, text: str, tokens: Sequence[int]) -> None:
        """Render `text` as these exact tokens when it comes back as an assistant message."""
        with self._lock:
            self._memo[text] = tuple(int(t) for t in tokens)
            self._memo.move_to_end(text)
            while len(self._memo) > self._memo_size:
                self._memo.popitem(last=False)


class HFCodec:
    """A local checkpoint's tokenizer files and chat template; never downloads."""

    def __init__(self, folder: str | Path) -> None:
        from transformers import AutoTokenizer

        try:
            self._tok: Any = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        except (OSError, ValueError) as err:
            raise ValueError(f"cannot load a tokenizer from {folder}: {err}") from None
        eos = self._tok.eos_token_id
        self.eos_id = int(eos) if eos is not None else None

    def encode_prompt(self, text: str) -> list[int]:
        return [int(t) for t in self._tok(text)["input_ids"]]

    def render_chat(self, messages: Sequence[Message]) -> list[int]:
        if not getattr(self._tok, "chat_template", None):
            raise ValueError("messages: this model's tokenizer has no chat template; "
                             "use /v1/completions")
        conversation = [{"role": m.role, "content": m.content} for m in messages]
        text = self._tok.apply_chat_template(conversation, add_generation_prompt=True,
                                             tokenize=False)
        return [int(t) for t in self._tok(text, add_special_tokens=False)["input_ids"]]

    def render(self, messages: Sequence[Message]) -> tuple[list[int], tuple[int, ...]]:
        """The prompt; message ends are unknown in a template's rendered text."""
        return self.render_chat(messages), ()

    def decode(self, tokens: Sequence[int]) -> str:
        return str(self._tok.decode([int(t) for t in tokens], skip_special_tokens=True))

    def token_bytes(self, token: int) -> bytes:
        return self.decode([token]).encode()

    def remember(self, text: str, tokens: Sequence[int]) -> None:
        """Nothing: a real template re-tokenizes replies (as vLLM and SGLang do)."""


class Detokenizer:
    """Incremental decoding: text deltas that concatenate to the whole output's text.

    Decodes a short window (`prefix` .. end) rather than everything each step, and holds
    back text ending in U+FFFD (an incomplete multi-byte character).
    """

    def __init__(self, codec: Codec, skip: frozenset[int] = frozenset()) -> None:
        self._codec, self._skip = codec, skip
        self._tokens: list[int] = []
        self._prefix = self._read = 0
        self.text = ""

    def push(self, token: int) -> str:
        """Add one token; the new text it completes ("" when none yet)."""
        if token in self._skip:
            return ""
        self._tokens.append(token)
        return self._delta(final=False)

    def flush(self) -> str:
        """Whatever text is still held back."""
        return self._delta(final=True)

    def _delta(self, *, final: bool) -> str:
        seen = self._codec.decode(self._tokens[self._prefix : self._read])
        now = self._codec.decode(self._tokens[self._prefix :])
        if len(now) <= len(seen) or (now.endswith("\ufffd") and not final):
            return ""
        delta = now[len(seen) :]
        self._prefix, self._read = self._read, len(self._tokens)
        self.text += delta
        return delta
