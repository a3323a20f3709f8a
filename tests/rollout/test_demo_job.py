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


def test_the_region_demo_looks_closer_and_prints_its_crops(tmp_path, tiny_model_dir, tiny_llm, capsys):
    """Issue 32, defect 9: `vrag-rollout demo --region-action` as a new user runs it (its
    defaults: 4 questions, 2 samples each, 4 turns, the embedded retriever, which renders the
    crops). Its later turns look closer at the last page shown or answer, mostly the former
    (`demo.region_turn_regex`), so the batch holds crops: each a region of a page the episode was
    shown first; the summary has a crop column with each sample's count and lists the regions;
    the saved batch passes the check."""
    result = run_demo(tmp_path / "demo.pt", model=str(tiny_model_dir), llm=tiny_llm, region_action=True,
                      batch_size=4, n=2, max_turns=4)
    output = result["output"]
    columns = output.non_tensor_batch
    crops = [int(count) for count in columns["num_crops"]]
    assert sum(crops) >= 1, list(columns["termination_reason"])
    for row, count in enumerate(crops):
        regions = [region for region in columns["image_regions"][row] if region is not None]
        assert len(regions) == count and all(0 <= v <= 1 for region in regions for v in region)
        if count:
            assert columns["image_regions"][row][0] is None  # a whole page was shown before its crops
    assert result["report"].ok, result["report"].human()
    # pages once: every sample shown a page holds its one entry; a crop is never its page's entry
    entries = [list(item["images"]) for item in columns["multi_modal_data"]]
    one_each: dict = {}
    for row in entries:
        for entry in row:
            assert one_each.setdefault(entry.key, entry) is entry
    assert sum(len(row) for row in entries) > len(one_each)
    shown = [(entry.key, region) for row, regions in zip(entries, columns["image_regions"])
             for entry, region in zip(row, regions)]
    crop_keys = {key for key, region in shown if region}
    page_keys = {key for key, region in shown if not region}
    assert crop_keys and not crop_keys & page_keys

    printed = capsys.readouterr().out.splitlines()
    header = next(i for i, line in enumerate(printed) if line.split()[:2] == ["#", "doc"])
    assert printed[header].split()[:9] == ["#", "doc", "end", "turns", "srch", "ftch", "fail", "crop", "resp"]
    for row, line in enumerate(printed[header + 1: header + 1 + len(output)]):
        assert int(line.split()[7]) == crops[row], line
        assert (" crops [" in line) == (crops[row] > 0), line
    assert f"crops={sum(crops):.2f}" in printed[header + 1 + len(output)]


def test_without_the_region_action_the_summary_has_no_crop_column(capsys):
    from vrag_rollout.devkit.episode_table import print_summary

    print_summary(_one_row_output())
    header, row, _ = capsys.readouterr().out.splitlines()
    assert "crop" not in header and "crops" not in row


def test_the_summary_counts_each_samples_failed_calls(capsys):
    """Issue 33, item 9: a fetch of a page past the document's end (a refused request) and a
    retriever fault are that sample's failed calls, shown in its `fail` column."""
    from vrag_rollout.devkit.episode_table import print_summary

    output = _one_row_output(retriever_errors=1, bad_requests=1)
    output.meta_info["metrics"] = {"rollout/retriever_errors": 1.0, "rollout/bad_requests": 1.0}
    print_summary(output)
    header, row, metrics = capsys.readouterr().out.splitlines()
    assert header.split()[4:7] == ["srch", "ftch", "fail"] and row.split()[4:7] == ["1", "0", "2"]
    assert "retriever_errors=1.00" in metrics and "bad_requests=1.00" in metrics


def _one_row_output(retriever_errors: int = 0, bad_requests: int = 0):
    import numpy as np
    import torch

    from vrag_rollout.protocol import DataProto, object_array

    return DataProto.from_dict(
        tensors={"response_mask": torch.ones(1, 3), "loss_mask": torch.tensor([[1, 0, 1]])},
        non_tensors={"doc_id": np.array(["d"], dtype=object), "termination_reason": np.array(["answered"], dtype=object),
                     "num_turns": np.array([2]), "num_searches": np.array([1]), "num_fetches": np.array([0]),
                     "num_crops": np.array([0]), "page_ids": object_array([[["d_1"]]]),
                     "retriever_errors": np.array([retriever_errors]), "bad_requests": np.array([bad_requests]),
                     "image_regions": object_array([[None]])},
        meta_info={"metrics": {}})


def test_the_summary_shows_each_episodes_reward_and_answer_and_corpus_rows(capsys):
    """Issue 48, item 4: a scored batch's table has a reward and an answer column; a question that
    searches the whole corpus shows `(corpus)`, not Python's None."""
    from vrag_rollout.devkit.episode_table import print_summary
    from vrag_rollout.protocol import object_array

    output = _one_row_output()
    output.non_tensor_batch["doc_id"] = object_array([None])
    output.non_tensor_batch["reward"] = object_array([{"overall": 0.55, "accuracy": 1.0}])
    output.non_tensor_batch["answer"] = object_array(["the car park by the north gate, level 2"])
    print_summary(output)
    header, row, _ = capsys.readouterr().out.splitlines()
    assert header.split()[8:11] == ["obs", "reward", "answer"]
    assert row.split()[1] == "(corpus)" and "None" not in row
    assert " 0.550 " in row and '"the car park by the n…"' in row and row.rstrip().endswith("d_1")


def test_a_segmented_batch_numbers_rows_by_episode_and_scores_only_its_last_row(capsys):
    """Under a context policy an episode is several rows: `episode.row` labels, `edit` endings,
    and a reward and answer only on the row that scores the episode."""
    import numpy as np

    from vrag_rollout.devkit.episode_table import print_summary
    from vrag_rollout.protocol import DataProto, object_array

    one = _one_row_output()
    tensors = {key: one.batch[key].repeat(2, 1) for key in ("response_mask", "loss_mask")}
    columns = {key: np.concatenate([value, value]) for key, value in one.non_tensor_batch.items()}
    columns.update(termination_reason=object_array(["context_edit", "answered"]), episode_id=np.array([3, 3]),
                   segment_index=np.array([0, 1]), reward=object_array([{"overall": 0.9}, {"overall": 0.4}]),
                   answer=object_array([None, "page 2"]))
    print_summary(DataProto.from_dict(tensors=tensors, non_tensors=columns, meta_info={"metrics": {}}))
    _, first, last, _ = capsys.readouterr().out.splitlines()
    assert first.split()[:3] == ["3.0", "d", "edit"] and " 0.900 " not in first
    assert last.split()[:3] == ["3.1", "d", "answered"] and " 0.400 " in last and '"page 2"' in last
