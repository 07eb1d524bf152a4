"""Log probabilities of the generated tokens, in either endpoint's OpenAI shape.

They are the model's own (log-softmax of the logits that chose each token, before
temperature, top-k or top-p), for the tokens that make up the text: a stop token is
left out, as it is from the text.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from marconi.engines.hf import Generation


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    token: bytes  # what the token adds to the text
    logprob: float
    top: tuple[tuple[bytes, float], ...]  # the most likely tokens at its step, best first


def token_logprobs(gen: Generation, token_bytes: Callable[[int], bytes],
                   skip: frozenset[int], top: int) -> list[TokenLogprob]:
    """One entry per output token not in `skip`, each with its `top` best alternatives."""
    rows = torch.log_softmax(gen.logits.float(), dim=-1)
    out = []
    for token, row in zip((int(t) for t in gen.output), rows, strict=True):
        if token in skip:
            continue
        best = torch.topk(row, top) if top else None
        alternatives = () if best is None else tuple(
            (token_bytes(int(i)), float(v)) for v, i in zip(best.values, best.indices,
                                                             strict=True))
        out.append(TokenLogprob(token_bytes(token), float(row[token]), alternatives))
    return out


def _text(token: bytes) -> str:
    return token.decode("utf-8", errors="replace")


def chat_logprobs(entries: list[TokenLogprob]) -> dict[str, Any]:
    """`choices[0].logprobs` of a chat completion."""

    def one(token: bytes, logprob: float) -> dict[str, Any]:
        return {"token": _text(token), "logprob": logprob, "bytes": list(token)}

    content = [one(e.token, e.logprob) | {"top_logprobs": [one(*t) for t in e.top]}
               for e in entries]
    return {"content": content, "refusal": None}


def completion_logprobs(entries: list[TokenLogprob]) -> dict[str, Any]:
    """`choices[0].logprobs` of a (legacy) completion: the chosen token is always among
    `top_logprobs`, so there may be one more than asked, as OpenAI documents."""
    offsets, at = [], 0
    for e in entries:
        offsets.append(at)
        at += len(_text(e.token))
    return {"tokens": [_text(e.token) for e in entries],
            "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": [{_text(t): lp for t, lp in (*e.top, (e.token, e.logprob))}
                             for e in entries],
            "text_offset": offsets}
