#!/usr/bin/env bash
# Start the retriever on an index, wait until it is ready, then run the EasyR1 trainer with the
# vrag agent rollout against it; the retriever is stopped when the trainer exits.
#
#   scripts/train_easyr1.sh INDEX_DIR [CONFIG_YAML] [key=value ...]
#
#   INDEX_DIR     built with `vrag-retriever index PDFS --out INDEX_DIR`
#   CONFIG_YAML   default examples/easyr1_vrag.yaml; overrides as in `python -m verl.trainer.main`
# Environment: RETRIEVER_PORT (8002), RETRIEVER_WORKERS (2), READY_TIMEOUT seconds to wait for
#              the retriever (120), PYTHON (default: the project's .venv/bin/python).
# The data files the yaml names come from `vrag-rollout convert-dataset` (docs/easyr1.md).
# Runs from any directory: INDEX_DIR and CONFIG_YAML are taken from where you are (the default
# config from the repository), and the trainer runs in the repository root, where the config's
# relative paths (data files, reward function) and relative data.* overrides are resolved.
# Before anything starts it checks EasyR1, the config, its data files and the index.
# With several nodes, run the retriever where every node reaches it and pass
# worker.rollout.retriever_url=... instead of using this script's local one.
set -euo pipefail

if [ $# -lt 1 ]; then
    sed -n '2,19p' "$0" >&2
    exit 2
fi
repo=$(cd "$(dirname "$0")/.." && pwd)
absolute() { case $1 in /*) printf '%s\n' "$1" ;; *) printf '%s/%s\n' "$PWD" "$1" ;; esac; }
index=$(absolute "$1")
shift
config=$repo/examples/easyr1_vrag.yaml
if [ $# -gt 0 ] && [ "${1#*=}" = "$1" ]; then
    config=$(absolute "$1")
    shift
fi
port=${RETRIEVER_PORT:-8002}
if [ -n "${PYTHON:-}" ]; then
    python=$PYTHON
elif [ -x "$repo/.venv/bin/python" ]; then
    python=$repo/.venv/bin/python
else
    echo "train_easyr1.sh: no $repo/.venv (run scripts/setup.sh, or set PYTHON)" >&2
    exit 2
fi
cd "$repo"
"$python" -m vrag_rollout.integrations.easyr1.preflight "$config" "$index" "$@" || exit 2

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
