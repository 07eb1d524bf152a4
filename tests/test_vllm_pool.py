"""The served block size and pool, read from a vLLM server's own log
(marconi.engines.real.vllm_server.read_pool), on excerpts of real logs: a vLLM 0.32 CPU
server of benchmarks/bench_serve.py's tiny GraniteMoeHybrid, `--num-gpu-blocks-override
96 --max-model-len 2048`, with prefix caching (`tests/fixtures/vllm-0.32-stock.log`) and
without (`vllm-0.32-nocache.log`): the lines at its KV cache's start, as logged."""

from __future__ import annotations

from pathlib import Path

import pytest

from marconi.engines.real.vllm_server import Pool, read_pool

FIXTURES = Path(__file__).with_name("fixtures")
STOCK = FIXTURES / "vllm-0.32-stock.log"
NOCACHE = FIXTURES / "vllm-0.32-nocache.log"


def test_the_served_block_size_is_the_logged_lcm_not_the_mamba_chunk() -> None:
    # the model's Mamba chunk is 256 tokens; the server's blocks are 128 (a 1,200-token
    # prompt sent twice hit 1,152 tokens: 9 blocks of 128)
    assert read_pool(STOCK) == Pool(block_size=128, blocks=96, group_sizes=(128,) * 4)


def test_without_prefix_caching_the_server_logs_other_blocks() -> None:
    assert read_pool(NOCACHE) == Pool(block_size=2048, blocks=96,
                                      group_sizes=(2048, 2048, 2048, 128))


def _without(tmp_path: Path, words: str) -> Path:
    log = tmp_path / "server.log"
    log.write_text("".join(ln for ln in STOCK.read_text().splitlines(keepends=True)
                           if words not in ln))
    return log


@pytest.mark.parametrize(("words", "named"), [
    ("kv lcm block sizes", "'kv lcm block sizes N'"),
    ("Overriding num_gpu_blocks", "'Overriding num_gpu_blocks=N with "
                                  "num_gpu_blocks_override=N'"),
    ("kv cache group sizes", "'kv cache group sizes (N, ...)'"),
])
def test_a_log_without_the_line_names_the_log_and_the_line(tmp_path: Path, words: str,
                                                           named: str) -> None:
    log = _without(tmp_path, words)
    with pytest.raises(ValueError) as err:
        read_pool(log)
    assert str(log) in str(err.value) and named in str(err.value)


def test_two_starts_that_disagree_are_refused(tmp_path: Path) -> None:
    log = tmp_path / "two.log"
    log.write_text(STOCK.read_text() + NOCACHE.read_text())
    with pytest.raises(ValueError, match=r"two\.log: its 'kv lcm block sizes N' lines "
                                         r"disagree: \['128', '2048'\]"):
        read_pool(log)


def test_a_missing_log_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read_pool(tmp_path / "absent.log")
