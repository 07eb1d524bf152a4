"""Loader output pinned: every file format read from small, seeded fixtures must give
exactly the trace (sessions, turns, arrivals, token arrays, boundaries, name, load report)
whose digest is written below. The digests were taken with the plain `json` readers the
fast ones replace; a reader that changes a single token, time or count fails here.

The files are awkward on purpose: CRLF and blank lines, non-ASCII text and ids, extra
keys, empty token lists, ids at the int32 limit, integer timestamps, spaces inside lists.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from marconi.workload import Trace, TraceOptions, load_trace
from marconi.workload.report import META_KEY

INT32_MAX = 2**31 - 1


def digest(trace: Trace) -> str:
    """A hash of everything a load returns, but where the disk cache sits."""
    h = hashlib.sha256()
    meta = {k: v for k, v in trace.meta.items() if k not in ("cache", "source")}
    h.update(json.dumps([trace.name, meta], sort_keys=True, default=str).encode())
    for r in trace:
        h.update(json.dumps([r.session_id, r.turn, repr(r.arrival), list(r.boundaries)]).encode())
        h.update(r.input_tokens.astype("<i4").tobytes() + b"|")
        h.update(r.output_tokens.astype("<i4").tobytes() + b"|")
    return h.hexdigest()[:24]


def _ids(rng: np.random.Generator, n: int) -> list[int]:
    return [int(x) for x in rng.integers(0, 32000, n)]


WORDS = ["alpha", "beta", "gamma", "délta", "ε", "zeta", "日本", "code()", "{x}", "\"q\""]


def _text(rng: np.random.Generator, n: int) -> str:
    return " ".join(WORDS[int(i)] for i in rng.integers(0, len(WORDS), n))


def artifact_file(root: Path) -> Path:
    rng = np.random.default_rng(7)
    lines = []
    for i in range(40):
        row: dict[str, Any] = {"session_id": ["s-ä", 17, "s\u00e9"][i % 3], "turn_id": i // 3,
                               "ts": float(rng.uniform(0, 50)) if i % 4 else i,
                               "input_tokens": _ids(rng, int(rng.integers(0, 60))),
                               "output_tokens": _ids(rng, int(rng.integers(0, 5)))}
        if i == 5:
            row["input_tokens"] = [0, INT32_MAX, 1]
        if i % 7 == 0:
            row = {"extra": {"nested": [1.5, None]}, **row}
        text = json.dumps(row, ensure_ascii=i % 2 == 0)
        if i % 5 == 0:
            text = text.replace(", ", ",").replace("[", "[ ").replace("]", " ]")
        lines.append(text + ("\r\n" if i % 6 == 0 else "\n") + ("\n" if i % 9 == 0 else ""))
    path = root / "artifact.jsonl"
    path.write_bytes("".join(lines).encode())
    return path


def mooncake_file(root: Path) -> Path:
    rng = np.random.default_rng(8)
    rows = []
    for i in range(30):
        ids = [int(x) for x in rng.integers(0, 6, int(rng.integers(1, 5)))]
        rows.append({"timestamp": 100 * i + int(rng.integers(0, 90)), "input_length":
                     int(rng.integers(1, 512 * len(ids) + 1)), "output_length":
                     int(rng.integers(0, 40)), "hash_ids": ids})
    path = root / "mooncake.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _chat(rng: np.random.Generator, turns: int) -> list[tuple[str, str]]:
    return [(("human", "gpt")[k % 2], _text(rng, int(rng.integers(1, 30))))
            for k in range(2 * turns)]


def sharegpt_file(root: Path) -> Path:
    rng = np.random.default_rng(9)
    convs = [{"id": f"c{i}", "conversations": [{"from": w, "value": t}
                                               for w, t in _chat(rng, 3 + i % 4)]}
             for i in range(12)]
    path = root / "sharegpt.json"
    path.write_text(json.dumps(convs, indent=2, ensure_ascii=False))
    return path


def lmsys_file(root: Path) -> Path:
    rng = np.random.default_rng(10)
    role = {"human": "user", "gpt": "assistant"}
    rows = [{"conversation_id": f"l{i}", "conversation": [
        {"role": role[w], "content": t} for w, t in _chat(rng, 2 + i % 3)]} for i in range(10)]
    path = root / "lmsys.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=i % 2 == 0) + "\n"
                            for i, r in enumerate(rows)))
    return path


def openai_file(root: Path) -> Path:
    rng = np.random.default_rng(11)
    rows = []
    for s in range(4):
        messages = [{"role": "system", "content": f"system {s}"}]
        for k in range(3):
            messages.append({"role": "user", "content": _text(rng, 8)})
            reply = _text(rng, 6)
            rows.append({"messages": list(messages), "timestamp": 1_700_000_000 + 10 * k + s,
                         "response": {"choices": [{"message": {"content": reply}}]}})
            messages.append({"role": "assistant", "content": reply})
    path = root / "openai.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def sweagent_dir(root: Path) -> Path:
    rng = np.random.default_rng(12)
    folder = root / "trajs"
    for i in range(3):
        messages = [{"role": "system", "content": "You are an agent."},
                    {"role": "user", "content": _text(rng, 20)}]
        for _ in range(4 + i):
            messages.append({"role": "assistant", "content": _text(rng, 10)})
            messages.append({"role": "user", "content": [{"type": "text",
                                                          "text": _text(rng, 15)}]})
        path = folder / f"task-{i}" / f"task-{i}.traj.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps({"instance_id": f"task-{i}", "messages": messages}))
    return folder


# digest of each format's load, taken with the plain `json` readers
PINNED = {
    "artifact": (artifact_file, {}, "c17294d9490a5603808a0929"),
    "mooncake": (mooncake_file, {}, "5c9750688ada5a065822062c"),
    "sharegpt": (sharegpt_file, {"min_turns": 1}, "97f70a98547b5c3ede7a95f5"),
    "lmsys": (lmsys_file, {"min_turns": 1}, "043654a0664e356cb075cff2"),
    "openai": (openai_file, {}, "8ae6a24c6803de651d738fec"),
    "swe-agent": (sweagent_dir, {"mean_gap": 2.0}, "ac7220827228e7ef8c3455ac"),
}


@pytest.mark.parametrize("fmt", sorted(PINNED))
@pytest.mark.parametrize("cache", [False, True])
def test_each_format_loads_the_pinned_trace(tmp_path: Path, fmt: str, cache: bool) -> None:
    make, knobs, pinned = PINNED[fmt]
    source = make(tmp_path)
    options = TraceOptions(use_cache=cache, **knobs)
    first = load_trace(source, format=fmt, options=options)
    assert first.meta[META_KEY]
    assert digest(first) == pinned
    if cache:  # the second load comes from the disk cache, and is the same trace
        again = load_trace(source, format=fmt, options=options)
        assert "cache" in again.meta
        assert digest(again) == pinned
