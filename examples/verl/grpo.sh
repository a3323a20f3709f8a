#!/usr/bin/env bash
# GRPO with verl and the VRAG agent loop, one node of 8 GPUs; the two examples beside this file set
#   MODEL_PATH   the checkpoint (actor_rollout_ref.model.path)
#   AGENT_LOOP   the agent-loop file: agent_loop.yaml (tags) or agent_loop_tool_call.yaml
# Data: `vrag-rollout convert-dataset QA.json --layout verl [--action-format tool_call] --index INDEX
#        --out data/vrag-verl/train.parquet --val-out data/vrag-verl/val.parquet`; a retriever serving
#        INDEX at the URL of the agent-loop file. Extra key=value arguments override these (hydra).
# multi_turn.enable=True: without it verl's fully async trainer (fully_async_main) rolls every row out
# with single_turn_agent instead of the row's agent; the synchronous trainer reads it for nothing else.
# The live guard (docs/verl.md): the guarded agent-loop manager runs it on every batch in verl's
# workers and logs guard/ metrics (counts, per-turn drift); its mode is `guard` in the agent-loop file
# (drop). It needs verl's synchronous trainer as its workers build the batch: trainer.use_v1=False
# (verl 0.9.1's v1 trainer stores trajectories one by one in its TransferQueue; the manager refuses it).
# docs/verl.md.
set -euo pipefail
: "${MODEL_PATH:?set MODEL_PATH (or run grpo_qwen2_5_vl_7b.sh / grpo_qwen3_vl_4b_tool_call.sh)}"
: "${AGENT_LOOP:=agent_loop.yaml}"
cd "$(dirname "$0")/../.."
python -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    data.train_files=data/vrag-verl/train.parquet \
    data.val_files=data/vrag-verl/val.parquet \
    data.train_batch_size=64 \
    data.max_prompt_length=1024 \
    data.max_response_length=4096 \
    data.filter_overlong_prompts=False \
    data.return_raw_chat=True \
    actor_rollout_ref.model.path="$MODEL_PATH" \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.ppo_mini_batch_size=32 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2 \
    actor_rollout_ref.actor.use_kl_loss=True \
    actor_rollout_ref.actor.kl_loss_coef=0.01 \
    actor_rollout_ref.actor.kl_loss_type=low_var_kl \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.mode=async \
    actor_rollout_ref.rollout.n=8 \
    actor_rollout_ref.rollout.prompt_length=1024 \
    actor_rollout_ref.rollout.response_length=4096 \
    actor_rollout_ref.rollout.calculate_log_probs=True \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4 \
    actor_rollout_ref.rollout.agent.agent_loop_config_path="examples/verl/$AGENT_LOOP" \
    actor_rollout_ref.rollout.agent.default_agent_loop=vrag_agent \
    actor_rollout_ref.rollout.multi_turn.enable=True \
    +actor_rollout_ref.rollout.agent.agent_loop_manager_class=vrag_rollout.integrations.verl.guard.GuardedAgentLoopManager \
    trainer.use_v1=False \
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4 \
    reward.custom_reward_function.path=examples/reward_function/vrag_verl.py \
    reward.custom_reward_function.name=compute_score \
    trainer.logger=[console] \
    trainer.n_gpus_per_node=8 \
    trainer.nnodes=1 \
    trainer.total_epochs=1 \
    "$@"
