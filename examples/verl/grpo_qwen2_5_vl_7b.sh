#!/usr/bin/env bash
# GRPO with verl on Qwen2.5-VL-7B-Instruct, the VRAG agent loop in the tags format (grpo.sh).
MODEL_PATH=Qwen/Qwen2.5-VL-7B-Instruct AGENT_LOOP=agent_loop.yaml exec "$(dirname "$0")/grpo.sh" "$@"
