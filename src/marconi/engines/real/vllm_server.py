"""A real vLLM server with marconi's plugin (docs/integrations.md, "Serving with vLLM"):
the tiny hybrid model folder it serves, the command that starts it, and a harness that
starts one, waits for it and stops it (benchmarks/bench_serve.py, tests/test_serve_vllm.py).

The model is random weights (`--load-format dummy`: nothing comes from a hub) over a
config this module writes, with a word-level tokenizer of `<i>` tokens written by the
`tokenizers` library, so that any token id below the vocabulary size round-trips, and a
chat template (`CHAT_TEMPLATE`), so that chat requests are served too. The benchmarks send
token ids and read token ids back (`return_token_ids`), so the text never matters.

    python -m marconi.engines.real.vllm_server model DIR [--family granitemoehybrid]
    python -m marconi.engines.real.vllm_server command DIR [--policy marconi] [--blocks 48]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from marconi.engine_flags import ENGINES
from marconi.engines.real.envs import python_of

VOCAB = 8192  # token ids of a trace are taken modulo this (the bench does)
NAME = "tiny-hybrid"  # the model name clients address
# chat requests: each message's text on a line of its own, then the reply (vLLM refuses a
# chat request to a model with no template); `<i>` words are token i, any other word <0>
CHAT_TEMPLATE = ("{% for message in messages %}{{ message['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<2>{% endif %}")
START_TIMEOUT = 300.0  # seconds a server may take to answer /health (40-90 s here)
# a stop drains the engine core for up to this long (`--shutdown-timeout`); without it
# vLLM kills the core: EngineDeadError's traceback in the log, two shared-memory objects
# leaked
SHUTDOWN_S = 10

_SHARED = {"vocab_size": VOCAB, "hidden_size": 256, "intermediate_size": 512,
           "num_attention_heads": 4, "num_key_value_heads": 4, "max_position_embeddings": 4096,
           "rms_norm_eps": 1e-5, "hidden_act": "silu", "tie_word_embeddings": True,
           "torch_dtype": "float32", "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0,
           "rope_theta": 10000.0}
# each family: 4 small layers; GraniteMoeHybrid (the one the benchmarks serve), Bamba and
# Nemotron-H with the second attention and the rest Mamba2 (8 heads of 64, d_state 64)
FAMILIES: dict[str, dict[str, Any]] = {
    "granitemoehybrid": {
        "architectures": ["GraniteMoeHybridForCausalLM"], "model_type": "granitemoehybrid",
        "num_hidden_layers": 4, "layer_types": ["mamba", "attention", "mamba", "mamba"],
        "shared_intermediate_size": 512, "num_local_experts": 0, "num_experts_per_tok": 0,
        "mamba_n_heads": 8, "mamba_d_head": 64, "mamba_d_state": 64, "mamba_n_groups": 1,
        "mamba_d_conv": 4, "mamba_expand": 2, "mamba_chunk_size": 256,
        "mamba_conv_bias": True, "mamba_proj_bias": False, "position_embedding_type": "rope",
        "embedding_multiplier": 1.0, "logits_scaling": 1.0, "residual_multiplier": 1.0,
        "attention_multiplier": 0.125},
    "bamba": {
        "architectures": ["BambaForCausalLM"], "model_type": "bamba", "num_hidden_layers": 4,
        "attn_layer_indices": [1], "mamba_n_heads": 8, "mamba_d_head": 64,
        "mamba_d_state": 64, "mamba_n_groups": 1, "mamba_d_conv": 4, "mamba_expand": 2,
        "mamba_chunk_size": 256, "mamba_conv_bias": True, "mamba_proj_bias": False},
    "nemotron_h": {
        "architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h",
        "num_hidden_layers": 4, "hybrid_override_pattern": "M*MM", "mamba_num_heads": 8,
        "mamba_head_dim": 64, "ssm_state_size": 64, "n_groups": 1, "conv_kernel": 4,
        "expand": 2, "chunk_size": 256, "use_conv_bias": True, "use_bias": False,
        "head_dim": 64, "mlp_hidden_act": "relu2", "layer_norm_epsilon": 1e-5},
    "falcon_h1": {  # attention and Mamba2 side by side in every layer
        "architectures": ["FalconH1ForCausalLM"], "model_type": "falcon_h1",
        "num_hidden_layers": 4, "head_dim": 64, "mamba_n_heads": 8, "mamba_d_head": 64,
        "mamba_d_ssm": 512, "mamba_d_state": 64, "mamba_n_groups": 1, "mamba_d_conv": 4,
        "mamba_expand": 2, "mamba_chunk_size": 256, "mamba_conv_bias": True,
        "mamba_proj_bias": False, "mamba_rms_norm": False},
    "mamba2": {  # no attention at all
        "architectures": ["Mamba2ForCausalLM"], "model_type": "mamba2", "num_hidden_layers": 4,
        "num_heads": 8, "head_dim": 64, "state_size": 64, "n_groups": 1, "conv_kernel": 4,
        "expand": 2, "chunk_size": 256, "use_conv_bias": True, "use_bias": False,
        "layer_norm_epsilon": 1e-5},
    "jamba": {  # Mamba1 layers
        "architectures": ["JambaForCausalLM"], "model_type": "jamba", "num_hidden_layers": 4,
        "attn_layer_period": 4, "attn_layer_offset": 1, "expert_layer_period": 2,
        "expert_layer_offset": 1, "num_experts": 1, "num_experts_per_tok": 1,
        "mamba_d_state": 16, "mamba_d_conv": 4, "mamba_expand": 2, "mamba_dt_rank": 16,
        "use_mamba_kernels": False},
    "qwen3_next": {  # gated delta-net linear attention
        "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next",
        "num_hidden_layers": 4, "full_attention_interval": 2, "head_dim": 64,
        "linear_num_value_heads": 4, "linear_num_key_heads": 2, "linear_key_head_dim": 64,
        "linear_value_head_dim": 64, "linear_conv_kernel_dim": 4, "num_experts": 4,
        "num_experts_per_tok": 1, "moe_intermediate_size": 128,
        "shared_expert_intermediate_size": 128, "decoder_sparse_step": 1, "mlp_only_layers": []},
}


def write_model(folder: str | Path, family: str = "granitemoehybrid") -> Path:
    """Write the tiny `family` model's config and tokenizer into `folder` (created);
    the weights are vLLM's dummy ones. Returns the folder."""
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r} (known: {', '.join(FAMILIES)})")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    config = {**_SHARED, **FAMILIES[family]}
    (out / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    tokenizer = Tokenizer(models.WordLevel(vocab={f"<{i}>": i for i in range(VOCAB)},
                                           unk_token="<0>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins with spaces
    tokenizer.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 4096,
         "unk_token": "<0>", "eos_token": "<1>", "bos_token": "<2>", "pad_token": "<0>",
         "chat_template": CHAT_TEMPLATE}, indent=1) + "\n")
    return out


@dataclass(frozen=True, kw_only=True)
class ServerConfig:
    """One server: its model folder and policy ("stock", "marconi", "marconi+", a system
    whose eviction is a declared priority such as "lfu", or "nocache": prefix caching
    off), the pool (`blocks`: vLLM's block count, None: from `VLLM_CPU_KVCACHE_SPACE`), and
    what else it is given."""

    model: Path
    policy: str = "stock"
    blocks: int | None = None
    alpha: float | None = None  # policy marconi: fixed instead of tuned
    max_num_seqs: int = 4
    # a step's tokens, given so that a replay models the step the server ran (its log
    # does not state it)
    max_num_batched_tokens: int = 2048
    max_model_len: int = 4096
    cpu_split: bool = True  # MARCONI_VLLM_CPU_SPLIT=1 (the CPU build's crash; see plugin)
    tuner: str = "process"
    extra: tuple[str, ...] = ()

    def command(self, port: int) -> list[str]:
        cmd = [str(python_of(ENGINES["vllm"])), "-m", "vllm.entrypoints.openai.api_server",
               "--model", str(self.model), "--served-model-name", NAME,
               "--load-format", "dummy", "--dtype", "float32", "--seed", "0",
               "--max-model-len", str(self.max_model_len),
               "--max-num-seqs", str(self.max_num_seqs),
               "--max-num-batched-tokens", str(self.max_num_batched_tokens), "--enforce-eager",
               "--enable-prompt-tokens-details", "--host", "127.0.0.1", "--port", str(port),
               "--shutdown-timeout", str(SHUTDOWN_S)]
        if self.policy == "nocache":
            cmd += ["--no-enable-prefix-caching"]
        else:
            cmd += ["--enable-prefix-caching", "--mamba-cache-mode", "align"]
        if self.blocks is not None:
            cmd += ["--num-gpu-blocks-override", str(self.blocks)]
        return cmd + list(self.extra)

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("MARCONI_")}
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
        env["VLLM_LOGGING_LEVEL"] = "INFO"
        if self.cpu_split:
            env["MARCONI_VLLM_CPU_SPLIT"] = "1"
        if self.policy not in ("stock", "nocache"):
            # marconi's, or a registered declared priority (`lfu`): the plugin refuses,
            # and the server exits, on a name it does not know
            env.update(MARCONI_VLLM=self.policy, MARCONI_MODEL=str(self.model / "config.json"))
            if self.policy in ("marconi", "marconi+"):
                env["MARCONI_TUNER"] = self.tuner
            if self.alpha is not None:
                env["MARCONI_ALPHA"] = str(self.alpha)
        return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    """A running vLLM server (`with Server(config, log_path) as server:`): started, waited
    for (`START_TIMEOUT`), stopped with its process group at the end."""

    config: ServerConfig
    log_path: Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> Server:
        self.start()
        return self.wait()

    def start(self) -> None:
        """Start the process (`wait` for it to answer); several may start at once."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as out:
            self.proc = subprocess.Popen(self.config.command(self.port), env=self.config.env(),
                                         stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)

    def wait(self) -> Server:
        """Until /health answers; RuntimeError naming the root cause if the server exits
        first, or after `START_TIMEOUT`."""
        assert self.proc is not None
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vllm server ({self.config.policy}) exited with code "
                                   f"{self.proc.returncode} at start: {self.last_error()}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(1.0)
        self.stop()
        raise RuntimeError(f"vllm server ({self.config.policy}) did not answer /health within "
                           f"{START_TIMEOUT:.0f} s (log: {self.log_path})")

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """As vLLM stops cleanly (and scripts/serve-vllm.sh stops it): SIGTERM to the API
        server alone, which drains its engine core and ends its processes; whatever of its
        process group is left after that (or after 60 s) is killed."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(SHUTDOWN_S + 50)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def pool(self) -> Pool:
        """The block size and pool the server logged (`read_pool`)."""
        return read_pool(self.log_path)

    def last_error(self) -> str:
        """The log's root cause (its last `XError: ...` line that is not vLLM's "see
        above"), else its last line, for a message."""
        lines = [ln for ln in self.log().splitlines() if ln.strip()]
        errors = [ln for ln in lines if re.search(r"\b\w*(Error|Exception): ", ln)
                  and "root cause" not in ln]
        return (errors or lines or ["(empty log)"])[-1].strip()[-400:]

    def metrics(self) -> dict[str, float]:
        """`/metrics`' samples summed over their labels (`name` -> value)."""
        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as r:
            return parse_metrics(r.read().decode())


@dataclass(frozen=True)
class Pool:
    """A server's KV pool as its own log states it (`read_pool`)."""

    block_size: int  # tokens per block: the scheduler's, the lcm of the groups' sizes
    blocks: int  # blocks in the pool, shared by every KV cache group
    group_sizes: tuple[int, ...]  # each KV cache group's block size, in tokens


# vLLM 0.32's lines (v1/core/kv_cache_utils.py), logged by the engine core at start:
#   ... [kv_cache_utils.py:854] kv lcm block sizes 128
#   ... [kv_cache_utils.py:2619] Overriding num_gpu_blocks=8192 with num_gpu_blocks_override=96
#   ... [kv_cache_utils.py:853] kv cache group sizes (128, 128, 128, 128)
# each with what the reader is told where a log lacks it
_POOL_LINES = {
    "block_size": ("kv lcm block sizes N", re.compile(r"kv lcm block sizes (\d+)\b"),
                   "vLLM 0.32 logs it where the model has several KV cache groups"),
    "blocks": ("Overriding num_gpu_blocks=N with num_gpu_blocks_override=N",
               re.compile(r"Overriding num_gpu_blocks=\d+ with num_gpu_blocks_override=(\d+)"),
               "logged where the server is given --num-gpu-blocks-override, the pool it then "
               "has; without one no line states the pool"),
    "groups": ("kv cache group sizes (N, ...)",
               re.compile(r"kv cache group sizes \((\d+(?:, *\d+)*),?\)"),
               "logged beside 'kv lcm block sizes N'"),
}


def read_pool(log_path: str | Path) -> Pool:
    """The block size and the block count a vLLM server logged at start (real excerpts in
    tests/fixtures/). ValueError naming the log and the line it lacks, or the lines that
    disagree (two starts in one log): never a default."""
    path = Path(log_path)
    text = path.read_text(errors="replace")
    found: dict[str, str] = {}
    for key, (line, pattern, hint) in _POOL_LINES.items():
        got = set(pattern.findall(text))
        if not got:
            raise ValueError(f"{path}: no '{line}' line, and the server's block size and "
                             f"pool are read from its log, never assumed ({hint}; is the "
                             "log a vLLM 0.32 server's, past its start?)")
        if len(got) > 1:
            raise ValueError(f"{path}: its '{line}' lines disagree: {sorted(got)}")
        found[key] = got.pop()
    groups = tuple(int(g) for g in found["groups"].split(","))
    pool = Pool(block_size=int(found["block_size"]), blocks=int(found["blocks"]),
                group_sizes=groups)
    if pool.block_size < 1 or pool.blocks < 1 or min(groups) < 1:
        raise ValueError(f"{path}: a pool of {pool.blocks} blocks of {pool.block_size} "
                         f"tokens (groups {groups}) is no pool")
    return pool


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text format: each sample name's values summed over its labels."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m:
            out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(3))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m marconi.engines.real.vllm_server",
                                     description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    model = sub.add_parser("model", help="write the tiny model folder")
    model.add_argument("folder")
    model.add_argument("--family", default="granitemoehybrid", choices=sorted(FAMILIES))
    command = sub.add_parser("command", help="print the server's environment and command")
    command.add_argument("folder")
    command.add_argument("--policy", default="marconi",
                         help="stock, marconi, marconi+, nocache, or a system whose eviction "
                              "is a declared priority (lfu, slru)")
    command.add_argument("--blocks", type=int, default=None)
    command.add_argument("--port", type=int, default=8000)
    args = parser.parse_args(argv)
    if args.what == "model":
        print(write_model(args.folder, args.family))
        return 0
    config = ServerConfig(model=Path(args.folder).resolve(), policy=args.policy,
                          blocks=args.blocks)
    env = config.env()
    ours = {k: v for k, v in env.items() if k.startswith(("MARCONI_", "VLLM_"))}
    print(" ".join([*(f"{k}={v}" for k, v in sorted(ours.items())),
                    *config.command(args.port)]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
