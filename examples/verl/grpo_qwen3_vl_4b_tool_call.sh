#!/usr/bin/env bash
# GRPO with verl on Qwen3-VL-4B-Instruct, the VRAG agent loop in native tool calls (grpo.sh).
# Convert the data with `--action-format tool_call`.
MODEL_PATH=Qwen/Qwen3-VL-4B-Instruct AGENT_LOOP=agent_loop_tool_call.yaml exec "$(dirname "$0")/grpo.sh" "$@"
