#!/usr/bin/env bash
# A real vLLM server (vLLM 0.32's CPU build) with marconi's plugin, serving a tiny hybrid
# model (GraniteMoeHybrid, random weights: nothing is downloaded) on 127.0.0.1:${PORT:-8000}
# (docs/integrations.md, "Serving with vLLM"). Builds vLLM's environment first if needed.
#   bash scripts/serve-vllm.sh                  # marconi (bootstrap-tuned alpha)
#   bash scripts/serve-vllm.sh marconi+         # marconi+'s shadow experts choose alpha
#   bash scripts/serve-vllm.sh lfu              # a registered declared priority orders the
#                                               # Mamba states (any other name: the plugin
#                                               # refuses it with one line)
#   bash scripts/serve-vllm.sh stock --num-gpu-blocks-override 64   # any vLLM flag after
# MARCONI_SERVE_MODEL names another model folder (written there if it has no config.json).
# The model takes chat requests (its template puts each message on a line) and token ids;
# SIGTERM or Ctrl-C stops every vLLM process cleanly (vLLM 0.32 may log one traceback of
# its output handler after the drain: docs/integrations.md, "Serving with vLLM").
set -euo pipefail
cd "$(dirname "$0")/.."
policy="${1:-marconi}"
[ $# -gt 0 ] && shift
case "$policy" in
    -*) echo "serve-vllm: the first argument is the policy (marconi, marconi+, stock, or a" \
             "declared priority such as lfu), then vLLM's flags; got '$policy'" >&2; exit 2 ;;
esac
bash scripts/setup-peers.sh vllm >&2
py="$PWD/.venv-peers/vllm/bin/python"
[ -n "${MARCONI_PEERS_DIR:-}" ] && py="$MARCONI_PEERS_DIR/vllm/bin/python"
model="${MARCONI_SERVE_MODEL:-$PWD/.venv-peers/models/granitemoehybrid}"
[ -f "$model/config.json" ] || "$py" -m marconi.engines.real.vllm_server model "$model" >&2
read -r -a cmd <<< "$("$py" -m marconi.engines.real.vllm_server command "$model" \
    --policy "$policy" --port "${PORT:-8000}")"
echo "serve-vllm: ${cmd[*]} $*" >&2
# Stopped as vLLM stops cleanly: SIGTERM to its API server alone, which drains its engine
# core (the command's --shutdown-timeout; SIGINT to every process, or no timeout, kills
# the core: EngineDeadError's traceback, shared-memory objects leaked). vLLM runs in a
# process group of its own, so a terminal's Ctrl-C reaches this script only, which passes
# it on as that SIGTERM.
set -m
env "${cmd[@]}" "$@" </dev/null &
server=$!
set +m
trap 'kill -TERM "$server" 2>/dev/null || true' INT TERM
status=0
wait "$server" || status=$?
while kill -0 "$server" 2>/dev/null; do  # a trapped signal ends `wait` early
    status=0
    wait "$server" || status=$?
done
exit "$status"
