"""Exact values of the engine's prefill, snapshots and tensor store that the mutation
pass (benchmarks/bench_mutation.py) found no test asserting: capture points, segment
counts, the guards of `prefill`, `KVBlock.slice` and `restore` and their
messages, byte counters, and what a freed handle keeps."""

from __future__ import annotations

import time

import pytest
import torch

from marconi.engines.hf.prefill import Capture, capture_points, prefill
from marconi.engines.hf.state import (
    KVBlock,
    SSMState,
    concat_kv,
    restore,
    snapshot_kv,
    snapshot_state,
)
from marconi.engines.hf.tensor_store import KVSource, TensorStore


def _tokens(n: int) -> torch.Tensor:
    return torch.arange(1, n + 1) % 200


class TestCapturePoints:
    def test_exact_points_lie_in_the_range(self) -> None:
        assert capture_points([3, 0, 5, 10, 11, 5], 3, 10, Capture.EXACT, None) == (5, 10)

    def test_chunk_points_move_down_to_a_chunk_and_the_end_stays(self) -> None:
        assert capture_points([20, 33, 40], 0, 40, Capture.CHUNK, 16) == (16, 32, 40)
        assert capture_points([17, 20], 16, 40, Capture.CHUNK, 16) == ()
        assert capture_points([32], 31, 40, Capture.CHUNK, 16) == (32,)
        assert capture_points([40], 0, 40, Capture.CHUNK, None) == (40,)
        with pytest.raises(ValueError, match=r"^chunk-boundary capture needs a model with a "
                                             r"chunked scan$"):
            capture_points([20], 0, 40, Capture.CHUNK, None)


class TestPrefill:
    def test_segments_and_states_where_asked(self, get_model) -> None:
        model = get_model("bamba")
        tokens = _tokens(30)
        done = prefill(model, tokens, model.new_cache(), 0, [10, 20, 30])
        assert sorted(done.states) == [10, 20, 30] and done.segments == 3
        assert [done.states[p].position for p in (10, 20, 30)] == [10, 20, 30]
        assert done.forward_s > 0 and done.snapshot_s > 0
        assert done.logits.dim() == 1 and done.logits.dtype == torch.float32
        plain = prefill(model, tokens, model.new_cache(), 0)
        assert plain.states == {} and plain.segments == 1
        assert torch.allclose(plain.logits, done.logits, atol=1e-4)
        assert torch.equal(done.states[30].logits, done.logits)

    def test_nothing_to_compute_is_an_error(self, get_model) -> None:
        model = get_model("bamba")
        for start in (-1, 5):
            with pytest.raises(ValueError,
                               match=f"^prefill from {start} of 5 tokens: nothing to compute$"):
                prefill(model, _tokens(5), model.new_cache(), start)


class TestBlocksAndStates:
    def test_slices_and_joins(self, get_model) -> None:
        model = get_model("bamba")
        done = prefill(model, _tokens(12), model.new_cache(), 0)
        block = snapshot_kv(model, done.cache, 0, 12)
        assert block.tokens == 12
        assert block.nbytes == 12 * model.spec.kv_bytes_per_token
        head, tail = block.slice(0, 5), block.slice(5, 12)
        assert (head.tokens, tail.tokens, block.slice(3, 3).tokens) == (5, 7, 0)
        for start, stop in ((-1, 3), (4, 3), (0, 13)):
            with pytest.raises(ValueError, match=rf"^KV slice \[{start}, {stop}\) outside a "
                                                 r"block of 12$"):
                block.slice(start, stop)
        joined = concat_kv([head, tail])
        assert joined is not None and joined.tokens == 12
        assert all(torch.equal(a, b) for a, b in zip(joined.keys, block.keys, strict=True))
        assert concat_kv([]) is None and concat_kv([head]) is head
        block.free()
        assert block.tokens == 0 and block.nbytes == 0 and block.keys == ()

    def test_a_freed_state_keeps_nothing(self, get_model) -> None:
        model = get_model("bamba")
        state = prefill(model, _tokens(8), model.new_cache(), 0, [8]).states[8]
        assert state.nbytes == model.spec.ssm_bytes
        assert state.logits_bytes == 4 * state.logits.numel() > 0
        state.free()
        assert (state.nbytes, state.logits_bytes, state.conv, state.recurrent) == (0, 0, (), ())


class TestRestoreGuards:
    def test_kv_and_state_must_describe_the_same_prefix(self, get_model) -> None:
        model = get_model("bamba")
        done = prefill(model, _tokens(10), model.new_cache(), 0, [10])
        state, block = done.states[10], snapshot_kv(model, done.cache, 0, 10)
        with pytest.raises(ValueError, match=r"^restoring KV without the SSM state of the "
                                             r"same prefix$"):
            restore(model, block, None)
        with pytest.raises(ValueError, match=r"^KV holds 9 tokens but the state is at 10$"):
            restore(model, block.slice(0, 9), state)
        with pytest.raises(ValueError, match=r"^KV holds 0 tokens but the state is at 10$"):
            restore(model, None, state)
        empty = restore(model, block.slice(0, 0), None)  # an empty block: a cold start
        assert empty.get_seq_length() == 0
        assert restore(model, block, state).get_seq_length() == 10


class TestTensorStore:
    def test_counters_follow_the_tensors(self, get_model) -> None:
        model = get_model("bamba")
        store = TensorStore(model)
        done = prefill(model, _tokens(10), model.new_cache(), 0, [10])
        state = store.track(done.states[10])
        assert store.state(state) is state
        assert (store.state_bytes, store.logits_bytes) == (state.nbytes, state.logits_bytes)
        part = store.kv_slice(KVSource(done.cache), 2, 6)
        assert part.tokens == 4 and store.kv_bytes == 4 * model.spec.kv_bytes_per_token
        store.release(part, None)
        assert store.kv_bytes == 0 and part.tokens == 0
        block = store.kv_slice(KVSource(done.cache), 0, 10)
        assert store.kv_bytes == block.nbytes == 10 * model.spec.kv_bytes_per_token
        assert store.nbytes == block.nbytes + state.nbytes + state.logits_bytes
        head, tail = store.kv_split(block, 4)
        assert (head.tokens, tail.tokens) == (4, 6)
        joined = store.kv_join(head, tail)
        assert joined.tokens == 10 and head.tokens == 0 and tail.tokens == 0
        gathered = store.gather([joined.slice(0, 3), joined.slice(3, 10)])
        assert gathered is not None and gathered.tokens == 10 and store.gather([]) is None
        store.release(joined, state)
        assert (store.kv_bytes, store.state_bytes, store.logits_bytes, store.nbytes) == (
            0, 0, 0, 0)
        assert joined.tokens == 0
        assert isinstance(state, SSMState) and state.nbytes == 0
        store.release(None, None)  # nothing to release
        assert store.nbytes == 0


class TestRestoreShapes:
    def test_a_state_of_one_token_needs_its_kv(self, get_model) -> None:
        model = get_model("bamba")
        state = prefill(model, _tokens(2), model.new_cache(), 0, [1]).states[1]
        with pytest.raises(ValueError, match=r"^KV holds 0 tokens but the state is at 1$"):
            restore(model, None, state)

    def test_layers_must_match_the_model(self, get_model) -> None:
        model = get_model("bamba")
        done = prefill(model, _tokens(10), model.new_cache(), 0, [10])
        state, block = done.states[10], snapshot_kv(model, done.cache, 0, 10)
        short = SSMState(10, state.conv[:-1], state.recurrent[:-1], state.logits)
        with pytest.raises(ValueError, match="zip"):
            restore(model, block, short)
        extra = KVBlock((*block.keys, block.keys[0]), (*block.values, block.values[0]))
        with pytest.raises(ValueError, match="zip"):
            restore(model, extra, state)


class TestSnapshotsAndTimes:
    def test_a_fresh_cache_has_no_state_to_snapshot(self, get_model) -> None:
        model = get_model("bamba")
        with pytest.raises(RuntimeError, match=r"^cache layer holds no tensor yet: run a "
                                               r"forward pass first$"):
            snapshot_state(model, model.new_cache(), 0, torch.zeros(1))

    def test_times_are_summed_within_the_call(self, get_model) -> None:
        model = get_model("bamba")
        t0 = time.perf_counter()
        done = prefill(model, _tokens(20), model.new_cache(), 0, [5, 10, 15, 20])
        elapsed = time.perf_counter() - t0
        assert done.segments == 4 and done.forward_s > 0 and done.snapshot_s > 0
        assert done.forward_s + done.snapshot_s <= elapsed
