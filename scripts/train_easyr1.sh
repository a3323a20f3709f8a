#!/usr/bin/env bash
# Start the retriever on an index, wait until it is ready, then run the EasyR1 trainer with the
# vrag agent rollout against it; the retriever is stopped when the trainer exits.
#
#   scripts/train_easyr1.sh INDEX_DIR [CONFIG_YAML] [key=value ...]
#
#   INDEX_DIR     built with `vrag-retriever index PDFS --out INDEX_DIR`
#   CONFIG_YAML   default examples/easyr1_vrag.yaml; overrides as in `python -m verl.trainer.main`
# Environment: RETRIEVER_PORT (8002), RETRIEVER_WORKERS (2), PYTHON (python),
#              READY_TIMEOUT seconds to wait for the retriever (120).
# The data files the yaml names come from `vrag-rollout convert-dataset` (docs/easyr1.md).
# With several nodes, run the retriever where every node reaches it and pass
# worker.rollout.retriever_url=... instead of using this script's local one.
set -euo pipefail

if [ $# -lt 1 ]; then
    sed -n '2,13p' "$0" >&2
    exit 2
fi
index=$1
shift
config=examples/easyr1_vrag.yaml
if [ $# -gt 0 ] && [ "${1#*=}" = "$1" ]; then
    config=$1
    shift
fi
port=${RETRIEVER_PORT:-8002}
python=${PYTHON:-python}
[ -f "$index/manifest.json" ] || { echo "train_easyr1.sh: $index is not a retriever index (no manifest.json)" >&2; exit 2; }
[ -f "$config" ] || { echo "train_easyr1.sh: no config $config" >&2; exit 2; }

"$python" -m retriever_server.cli serve --index "$index" --host 127.0.0.1 --port "$port" \
    --workers "${RETRIEVER_WORKERS:-2}" &
retriever=$!
trap 'kill "$retriever" 2>/dev/null || true; wait "$retriever" 2>/dev/null || true' EXIT

deadline=$(( $(date +%s) + ${READY_TIMEOUT:-120} ))
until "$python" -c "import sys, urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/ready', timeout=2)" 2>/dev/null; do
    if ! kill -0 "$retriever" 2>/dev/null; then
        echo "train_easyr1.sh: the retriever exited before it was ready" >&2
        exit 1
    fi
    if [ "$(date +%s)" -ge "$deadline" ]; then
        echo "train_easyr1.sh: the retriever was not ready after ${READY_TIMEOUT:-120}s" >&2
        exit 1
    fi
    sleep 1
done
echo "retriever ready on 127.0.0.1:$port ($index)"

"$python" -m vrag_rollout.integrations.easyr1 "config=$config" \
    "worker.rollout.retriever_url=http://127.0.0.1:$port" "$@"
