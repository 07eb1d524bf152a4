#!/usr/bin/env bash
# Build the engines' own environments for the real-engine systems sglang-0.5.23, vllm-0.32,
# vllm-0.33 and vllm-0.34 (docs/peers.md): one virtual environment per engine under .venv-peers/ (or
# $MARCONI_PEERS_DIR), each with torch 2.13.0 (the CPU build) and exactly the packages of
# scripts/peers-lock-ENGINE.txt, installed without dependencies (the engines' own pins
# clash with ours and would pull a CUDA torch). vLLM's also gets marconi itself (editable,
# without dependencies), so that a real vLLM server started from it loads marconi's plugin
# (docs/integrations.md, "Serving with vLLM"). Idempotent: an environment already built
# from an unchanged lock (and pyproject.toml) is left alone.
#   bash scripts/setup-peers.sh            # all four
#   bash scripts/setup-peers.sh vllm       # one (sglang, vllm, vllm-0.33 or vllm-0.34)
set -euo pipefail
cd "$(dirname "$0")/.."
root="${MARCONI_PEERS_DIR:-.venv-peers}"
engines=("$@")
[ ${#engines[@]} -gt 0 ] || engines=(sglang vllm vllm-0.33 vllm-0.34)
fail() { echo "setup-peers: $1" >&2; exit 1; }
for engine in "${engines[@]}"; do
    lock="scripts/peers-lock-$engine.txt"
    [ -f "$lock" ] || fail "unknown engine '$engine' (known: sglang, vllm, vllm-0.33, vllm-0.34)"
    venv="$root/$engine"
    stamp="$venv/.marconi-peer"
    want=$(cat "$lock" pyproject.toml | sha256sum | cut -c1-16)
    if [ -x "$venv/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
        echo "setup-peers: $engine: up to date ($venv)"
        continue
    fi
    echo "setup-peers: $engine: building $venv" >&2
    rm -rf "$venv"
    python3 -m venv "$venv" || fail "$engine: could not create a virtual environment at $venv"
    log="$venv/setup.log"
    # torch first and alone: this exact spec is the CPU build; any other pulls a CUDA one
    "$venv/bin/python" -m pip install -q --disable-pip-version-check torch==2.13.0 >"$log" 2>&1 \
        || fail "$engine: could not install torch==2.13.0 (see $log)"
    grep -v '^torch==' "$lock" | grep -v '^#' > "$venv/lock.txt"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps \
        -r "$venv/lock.txt" >>"$log" 2>&1 \
        || fail "$engine: could not install the packages of $lock (see $log)"
    if [ "$engine" = vllm ]; then
        "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps -e . \
            >>"$log" 2>&1 || fail "$engine: could not install marconi into $venv (see $log)"
    fi
    PYTHONPATH=src "$venv/bin/python" -P -m "marconi.engines.real.${engine%%-*}_worker" \
        --version >>"$log" 2>&1 \
        || fail "$engine: installed, but its worker cannot load the engine (see $log)"
    echo "$want" > "$stamp"
    echo "setup-peers: $engine: ready ($venv)"
done
