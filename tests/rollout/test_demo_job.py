"""The demo job as `vrag-rollout demo` runs it (on the session's engine, recorded retrieval): the
saved batch passes the independent check with the forward pass (it records rollout logprobs), and
carries each row's ground truth and reward, which its HTML view shows."""

from __future__ import annotations

import json

from tests.conftest import SAMPLE_RETRIEVAL
from vrag_rollout.core.reward import score_response
from vrag_rollout.devkit.demo import run_demo
from vrag_rollout.verify.check import run_check
from vrag_rollout.verify.saved_batch import load_rollout


def test_the_demo_batch_checks_with_forward_and_carries_truths_and_rewards(tmp_path, tiny_model_dir, tiny_llm):
    result = run_demo(tmp_path / "demo.pt", model=str(tiny_model_dir), fixtures=str(SAMPLE_RETRIEVAL), llm=tiny_llm,
                      batch_size=2, n=2, max_turns=3)
    assert result["report"].ok
    saved = load_rollout(tmp_path / "demo.pt")
    assert "rollout_log_probs" in saved.tensors
    forward = run_check(tmp_path / "demo.pt", forward=True)  # the README's command, model from the batch
    assert forward.ok and forward.forward["tokens"] > 0
    truths = [json.loads(truth) for truth in saved.column("ground_truth")]
    rewards = list(saved.column("reward"))
    assert len(truths) == len(rewards) == 4 and all(set(t) == {"answer", "doc_id", "gold_pages"} for t in truths)
    assert truths[0] == truths[1] and truths[0] != truths[2]  # n=2 samples per question
    for reward in rewards:
        assert set(reward) == {"overall", "accuracy", "f1", "format", "retrieval"}
        assert 0 <= reward["overall"] <= 1
    # each stored reward is its own row's: recomputed from the row's decoded response and pages
    output, tokenizer = result["output"], result["processor"].tokenizer
    width = output.batch["responses"].shape[1]
    for row in range(len(output)):
        used = output.batch["attention_mask"][row, -width:].bool()
        text = tokenizer.decode(output.batch["responses"][row][used].tolist(), skip_special_tokens=True)
        pages = [list(turn) for turn in output.non_tensor_batch["page_ids"][row]]
        assert score_response(text, {**truths[row], "page_ids": pages}) == rewards[row]
    html = result["html"].read_text(encoding="utf-8")
    assert f"{rewards[0]['overall']:.2f}" in html
