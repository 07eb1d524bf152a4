#!/usr/bin/env bash
# Set up .venv (simulator extras only), then compare the four systems of the paper and
# ours (marconi+) on ShareGPT: first 100 sessions with >= 10 rounds, 1 session/s,
# paper-7b, 2 GB.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh traces,plot
mkdir -p out
.venv/bin/marconi compare sharegpt --systems vanilla,vllm+,sglang+,marconi,marconi+ \
    --model paper-7b --capacity 2GB --sessions 100 --min-turns 10 --sps 1 \
    --plot out/compare-sharegpt.png "$@"
