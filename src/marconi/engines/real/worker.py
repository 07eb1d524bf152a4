"""Running a worker: the trace out as one `.npz`, the engine's per-request columns back.

A worker is a module of this package run by its engine's interpreter (`envs.python_of`,
`envs.worker_command`). It reads
`--trace T.npz --options O.json`, writes `result.npz` and `meta.json` into `--out DIR`,
prints `progress DONE TOTAL` on stderr as it goes, and ends a failed run with one line
`error: ...` and a non-zero exit. Nothing it printed is lost: a failure carries the tail of
its stderr, and a result with fewer rows than the trace is an error, never a figure.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import threading
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import IO, Any

import numpy as np
from tqdm import tqdm

from marconi.engine_flags import Engine
from marconi.engines.real.envs import PeerError, python_of, worker_command
from marconi.workload.types import Request

TAIL = 20  # stderr lines a failure quotes
TTFT = Callable[[int, int], float]  # (request index, hit tokens) -> seconds to first token


def write_trace(requests: Iterable[Request], path: Path) -> int:
    """The requests as the workers read them: every full sequence (input, then output)
    in one int32 array, `offsets` (n + 1) cutting it, `n_input` and `arrival` per
    request. Returns the number of requests."""
    sequences, n_input, arrival = [], [], []
    for request in requests:
        sequences.append(request.tokens())
        n_input.append(request.n_input)
        arrival.append(request.arrival)
    offsets = np.zeros(len(sequences) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(s) for s in sequences])
    tokens = np.concatenate(sequences) if sequences else np.zeros(0, dtype=np.int32)
    np.savez(path, tokens=tokens.astype(np.int32), offsets=offsets,
             n_input=np.asarray(n_input, dtype=np.int64),
             arrival=np.asarray(arrival, dtype=np.float64))
    return len(sequences)


def run_worker(engine: Engine, requests: Iterable[Request], options: Mapping[str, Any], *,
               progress: bool = False, label: str = "",
               ttft: TTFT | None = None) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Replay `requests` through `engine`'s worker with `options`; its columns (one row
    per request) and its meta. PeerError when it fails or returns fewer rows. `ttft`:
    the latency model a concurrent replay asks (`ttft I HIT` lines, arrivals.py)."""
    python = python_of(engine)
    with tempfile.TemporaryDirectory(prefix=f"marconi-{engine.name}-") as tmp:
        folder = Path(tmp)
        n = write_trace(requests, folder / "trace.npz")
        (folder / "options.json").write_text(json.dumps(dict(options)))
        command, env = worker_command(python, engine)
        command += ["--trace", str(folder / "trace.npz"), "--options",
                    str(folder / "options.json"), "--out", str(folder)]
        _run(command, env, n, progress, label or engine.system, ttft)
        return _read(folder, n, engine)


def _run(command: list[str], env: dict[str, str], n: int, progress: bool, label: str,
         ttft: TTFT | None) -> None:
    tail: deque[str] = deque(maxlen=TAIL)
    bar = tqdm(total=n, desc=label, unit="req", leave=False,
               disable=None if progress else True)  # None: only on a terminal
    pipe = subprocess.PIPE if ttft is not None else subprocess.DEVNULL
    with subprocess.Popen(command, stdin=pipe, stdout=pipe, stderr=subprocess.PIPE,
                          text=True, env=env) as proc:
        assert proc.stderr is not None
        reader = threading.Thread(target=_read_stderr, args=(proc.stderr, bar, tail),
                                  daemon=True)
        reader.start()
        if ttft is not None:
            _answer(proc, ttft, tail)
        code = proc.wait()
        reader.join()
    bar.close()
    if code != 0:
        errors = [line for line in tail if line.startswith("error:")]
        reason = errors[-1][len("error:"):].strip() if errors else "no error line"
        quoted = "\n".join(f"  | {line}" for line in tail)
        raise PeerError(f"{label}: the engine's replay failed (exit {code}): {reason}\n"
                        f"  its stderr ended:\n{quoted}")


def _read_stderr(stream: IO[str], bar: Any, tail: deque[str]) -> None:
    for line in stream:
        words = line.split()
        if len(words) == 3 and words[0] == "progress" and words[1].isdigit():
            bar.update(int(words[1]) - bar.n)
        else:
            tail.append(line.rstrip())


def _answer(proc: subprocess.Popen[str], ttft: TTFT, tail: deque[str]) -> None:
    """Answer each `ttft I HIT` line of the worker's stdout with the seconds; any other
    line there is kept with its stderr."""
    assert proc.stdout is not None and proc.stdin is not None
    for line in proc.stdout:
        words = line.split()
        if len(words) == 3 and words[0] == "ttft" and words[1].isdigit() \
                and words[2].isdigit():
            try:
                proc.stdin.write(f"{ttft(int(words[1]), int(words[2]))!r}\n")
                proc.stdin.flush()
            except (BrokenPipeError, OSError):
                break  # it died: its exit status and stderr say why
        else:
            tail.append(line.rstrip())


def _read(folder: Path, n: int, engine: Engine) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    try:
        meta = json.loads((folder / "meta.json").read_text())
        with np.load(folder / "result.npz") as data:
            columns = {key: data[key] for key in data.files}
    except (OSError, ValueError) as err:
        raise PeerError(f"{engine.system}: the worker exited 0 but left no readable result "
                        f"({err})") from None
    short = {key: len(col) for key, col in columns.items() if len(col) != n}
    if short or meta.get("requests") != n:
        raise PeerError(f"{engine.system}: incomplete result ({short or meta.get('requests')} "
                        f"rows for {n} requests); nothing is reported")
    if str(meta.get("version")) != engine.version:
        raise PeerError(f"{engine.system}: the worker ran {engine.kind or engine.name} "
                        f"{meta.get('version')}, not {engine.version}")
    return columns, meta
