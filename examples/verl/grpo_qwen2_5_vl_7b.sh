#!/usr/bin/env bash
# GRPO with verl on Qwen2.5-VL-7B-Instruct and the VRAG agent loop (tags), one node of 8 GPUs.
# Data: `vrag-rollout convert-dataset QA.json --layout verl --index INDEX --out data/vrag-verl/train.parquet
#        --val-out data/vrag-verl/val.parquet`; a retriever serving INDEX at the URL of agent_loop.yaml.
# Extra key=value arguments override these (hydra). docs/verl.md.
set -euo pipefail
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
    actor_rollout_ref.model.path=Qwen/Qwen2.5-VL-7B-Instruct \
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
    actor_rollout_ref.rollout.agent.agent_loop_config_path=examples/verl/agent_loop.yaml \
    actor_rollout_ref.rollout.agent.default_agent_loop=vrag_agent \
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4 \
    reward.custom_reward_function.path=examples/reward_function/vrag_verl.py \
    reward.custom_reward_function.name=compute_score \
    trainer.logger=[console] \
    trainer.n_gpus_per_node=8 \
    trainer.nnodes=1 \
    trainer.total_epochs=1 \
    "$@"
