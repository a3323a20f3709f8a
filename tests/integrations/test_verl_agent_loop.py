"""The agent as a verl agent loop (`vrag_rollout.integrations.verl`), inside verl's own machinery:
verl 0.9.1's `AgentLoopWorker.generate_sequences` instantiates `vrag_agent` from its registry
(with the settings an `agent_loop_config_path` entry gives; `integrations/verl/local.py` builds the
worker without Ray), the loop generates through a server
manager backed by the real vLLM engine (the CPU build, answering as verl's vLLM server does:
token ids, logprobs, "completed"/"aborted"), and verl's own postprocessing pads the outputs and
computes the positions (the family's `get_rope_index`) and processor inputs into the DataProto it
trains on. Oracles: the project's `check` passes on that DataProto (positions against
transformers, pads against the processor, masks, tool-turn tokens against the template), and each
episode equals the EasyR1 rollout's at the same seeds, token for token. verl's code reads ids by
value, so every family's worker also runs on the released-shape tiny model (the released ids and
logits width), and `check` passes on the DataProto it makes."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("hydra", reason="verl's agent loop needs hydra-core (the test extra)")

from omegaconf import OmegaConf  # noqa: E402
from verl.protocol import DataProto  # noqa: E402
from verl.utils.dataset.rl_dataset import RLHFDataset  # noqa: E402

from tests.conftest import SAMPLE_RETRIEVAL  # noqa: E402
from tests.rollout.agent_helpers import make_agent, sample_prompts  # noqa: E402
from vrag_rollout.data.prompts import build_prompts  # noqa: E402
from vrag_rollout.devkit.demo import demo_config, demo_page_band  # noqa: E402
from vrag_rollout.devkit.tiny_model import RELEASED  # noqa: E402
from vrag_rollout.families import FAMILY_NAMES  # noqa: E402
from vrag_rollout.integrations.verl.agent_loop import AGENT_NAME  # noqa: E402
from vrag_rollout.integrations.verl.local import local_worker, prompt_rows  # noqa: E402
from vrag_rollout.retrieval.client import RetrieverClient  # noqa: E402
from vrag_rollout.retrieval.fixtures import FixtureTransport  # noqa: E402
from vrag_rollout.verify.check import check_batch  # noqa: E402
from vrag_rollout.verify.saved_batch import from_dataproto  # noqa: E402

ROWS = 4
REPO = Path(__file__).resolve().parents[2]


def rollout_settings(processor, action_format: str) -> dict:
    """The demo rollout's settings (as `make_agent` builds them), replayed retrieval included."""
    config = demo_config(**demo_page_band(processor), action_format=action_format, n=1,
                         retriever_fixtures=str(SAMPLE_RETRIEVAL))
    return {k: v for k, v in dataclasses.asdict(config).items() if v is not None}


@pytest.fixture(scope="module", params=[(family, fmt) for family in FAMILY_NAMES for fmt in ("tags", "tool_call")],
                ids=lambda p: f"{p[0]}-{p[1]}")
def both_rollouts(request, family_models):
    family, action_format = request.param
    model = family_models(family)
    settings = rollout_settings(model.processor, action_format)
    samples = sample_prompts(ROWS, with_images=False)
    worker = local_worker(model.model_dir, model.llm, settings)
    verl_out = asyncio.run(worker.generate_sequences(prompt_rows(samples, action_format)))
    agent = make_agent(model.model_dir, model.processor, model.llm,
                       RetrieverClient(None, transport=FixtureTransport.load(SAMPLE_RETRIEVAL)),
                       n=1, action_format=action_format)
    ours = agent.generate_sequences(build_prompts(samples, tokenizer=model.processor.tokenizer,
                                                  processor=model.processor, config=agent.config))
    return model, verl_out, ours


def test_verl_batch_passes_the_projects_check(both_rollouts):
    model, verl_out, _ = both_rollouts
    assert tuple(verl_out.batch["position_ids"].shape[1:2]) == (4,)  # verl's own (bs, 4, L) positions
    report = check_batch(from_dataproto(verl_out, model_path=model.model_dir), model.model_dir)
    assert report.ok, report.human()
    pages = sum(len(turn) for turns in verl_out.non_tensor_batch["page_ids"] for turn in turns)
    assert pages > 0, "the demo grammar retrieves before it answers: pages were shown"


@pytest.fixture(scope="module", ids=lambda p: f"{p[0]}-{p[1]}", params=[
    pytest.param(param, marks=pytest.mark.released_shape)
    for param in zip(FAMILY_NAMES, ("tags", "tool_call", "tool_call"))])
def released_verl_batch(request, family_models):
    """verl's DataProto from the released-shape model of each family (both formats among them)."""
    family, action_format = request.param
    model = family_models(family, RELEASED)
    worker = local_worker(model.model_dir, model.llm, rollout_settings(model.processor, action_format))
    samples = sample_prompts(2, with_images=False)
    return model, asyncio.run(worker.generate_sequences(prompt_rows(samples, action_format)))


def test_verls_batch_of_a_released_model_passes_the_projects_check(released_verl_batch):
    model, verl_out = released_verl_batch
    assert int(verl_out.batch["input_ids"].max()) > 151000  # the released ids reached verl
    report = check_batch(from_dataproto(verl_out, model_path=model.model_dir), model.model_dir)
    assert report.ok, report.human()


def test_verls_reward_manager_scores_as_the_project_does(both_rollouts):
    """verl's own NaiveRewardManager with the example reward function, on verl's batch, gives the
    project's reward of the same episode (answer, format, and retrieval from the pages shown)."""
    from verl.experimental.reward_loop.reward_manager.naive import NaiveRewardManager
    from verl.trainer.ppo.reward import get_custom_reward_fn

    from vrag_rollout.core.reward import score_response

    compute_score = get_custom_reward_fn(OmegaConf.create({"reward": {"custom_reward_function": {  # as verl loads it
        "path": str(REPO / "examples" / "reward_function" / "vrag_verl.py"), "name": "compute_score",
        "reward_kwargs": {}}}}))

    model, verl_out, ours = both_rollouts
    truths = [json.dumps({"answer": "3", "doc_id": doc, "gold_pages": [2]}) for doc in ours.non_tensor_batch["doc_id"]]
    verl_out.non_tensor_batch["data_source"] = np.array(["vrag"] * ROWS, dtype=object)
    verl_out.non_tensor_batch["reward_model"] = np.array([{"ground_truth": t, "style": "rule"} for t in truths],
                                                         dtype=object)
    verl_out.non_tensor_batch["extra_info"] = np.array([{} for _ in range(ROWS)], dtype=object)

    async def score_all():
        manager = NaiveRewardManager(OmegaConf.create({}), model.processor.tokenizer, compute_score)
        return [await manager.run_single(verl_out[row:row + 1]) for row in range(ROWS)]

    scored = asyncio.run(score_all())
    tokenizer, R = model.processor.tokenizer, ours.batch["responses"].shape[1]
    retrieval = []
    for row, result in enumerate(scored):
        used = int(ours.batch["attention_mask"][row, -R:].sum())
        text = tokenizer.decode(ours.batch["responses"][row, :used], skip_special_tokens=True)
        truth = {**json.loads(truths[row]), "page_ids": ours.non_tensor_batch["page_ids"][row]}
        expected = score_response(text, truth)
        assert result["reward_score"] == pytest.approx(expected["overall"]), row
        assert result["reward_extra_info"]["retrieval"] == pytest.approx(expected["retrieval"]), row
        retrieval.append(expected["retrieval"])
    # the page ids reached the reward through verl's tool_extra_fields: some episode saw page 2
    assert any(value > 0 for value in retrieval) or not any(
        "_2" in page for turns in ours.non_tensor_batch["page_ids"] for turn in turns for page in turn)


def test_episodes_equal_the_easyr1_rollouts_at_the_same_seeds(both_rollouts):
    model, verl_out, ours = both_rollouts
    R = ours.batch["responses"].shape[1]
    for row in range(ROWS):
        mine = ours.batch["attention_mask"][row, -R:].bool()
        theirs = verl_out.batch["attention_mask"][row, -verl_out.batch["responses"].shape[1]:].bool()
        assert verl_out.batch["responses"][row][theirs].tolist() == ours.batch["responses"][row][mine].tolist(), row
        assert (verl_out.batch["response_mask"][row][theirs].tolist()
                == ours.batch["loss_mask"][row][mine].tolist()), row
        # the same tokens under the same weights: logprobs agree to float noise (one request at a
        # time here, a batch there)
        assert torch.allclose(verl_out.batch["rollout_log_probs"][row][theirs], ours.batch["rollout_log_probs"][row][mine],
                              atol=1e-4)
        assert verl_out.non_tensor_batch["termination_reason"][row] == ours.non_tensor_batch["termination_reason"][row]
        assert verl_out.non_tensor_batch["page_ids"][row] == ours.non_tensor_batch["page_ids"][row]


def test_a_converted_dataset_runs_through_verls_dataset_and_worker(tmp_path, tiny_model_dir, tiny_processor, tiny_llm):
    """`convert-dataset --layout verl` -> verl's RLHFDataset and collate_fn -> the worker with
    `vrag_agent` (chosen by the rows' agent_name) -> a batch the project's check passes, whose
    rows carry the converted ground truth for verl's reward manager."""
    from retriever_server.sample_corpus import SAMPLE_FACTS
    from verl.utils.dataset.rl_dataset import collate_fn

    from vrag_rollout.cli import main as cli_main

    questions = [{"uid": f"q{k}", "query": f"Which page mentions the {fact}?", "reference_answer": str(page),
                  "meta_info": {"file_name": f"{doc}.pdf", "reference_page": [page]}}
                 for k, (fact, (doc, page)) in enumerate(list(SAMPLE_FACTS.items())[:3])]
    (tmp_path / "qa.json").write_text(json.dumps(questions))
    assert cli_main(["convert-dataset", str(tmp_path / "qa.json"), "--out", str(tmp_path / "train.parquet"),
                     "--layout", "verl"]) == 0
    settings = rollout_settings(tiny_processor, "tags")
    worker = local_worker(tiny_model_dir, tiny_llm, settings)
    dataset = RLHFDataset(str(tmp_path / "train.parquet"), worker.tokenizer, OmegaConf.create({
        "prompt_key": "prompt", "max_prompt_length": settings["prompt_length"], "filter_overlong_prompts": False,
        "cache_dir": str(tmp_path / "cache")}), processor=worker.processor)
    batch = DataProto.from_single_dict(collate_fn([dataset[i] for i in range(len(dataset))]))
    assert list(batch.non_tensor_batch["agent_name"]) == [AGENT_NAME] * 3
    out = asyncio.run(worker.generate_sequences(batch))
    report = check_batch(from_dataproto(out, model_path=tiny_model_dir), tiny_model_dir)
    assert report.ok, report.human()
    truths = [json.loads(item["ground_truth"]) for item in out.non_tensor_batch["reward_model"]]
    assert [t["gold_pages"] for t in truths] == [[q["meta_info"]["reference_page"][0]] for q in questions]
    assert list(out.non_tensor_batch["doc_id"]) == [q["meta_info"]["file_name"][:-4] for q in questions]


def test_a_saved_verl_batch_passes_check_forward_and_a_wrong_logprob_fails(tmp_path, tiny_model_dir, tiny_processor,
                                                                           tiny_llm, capsys):
    """What scripts/check_verl.py does, on the shared engine: verl's batch of freely sampled
    episodes saved with verl's own `DataProto.save_to_disk`, then `vrag-rollout check FILE --model
    M --forward` compares every sampled token's rollout logprob with the family's forward pass."""
    from vrag_rollout.cli import main as cli_main

    settings = {**rollout_settings(tiny_processor, "tags"), "response_length": 96}
    settings.pop("action_regex", None)
    settings.pop("first_turn_action_regex", None)
    worker = local_worker(tiny_model_dir, tiny_llm, settings)
    batch = asyncio.run(worker.generate_sequences(prompt_rows(sample_prompts(3, with_images=False), "tags", n=2)))
    path = tmp_path / "verl_batch.pkl"
    batch.save_to_disk(str(path))
    assert cli_main(["check", str(path), "--model", str(tiny_model_dir), "--forward"]) == 0, capsys.readouterr().out
    assert "forward:" in capsys.readouterr().out
    sampled = batch.batch["response_mask"][1].nonzero().flatten()
    batch.batch["rollout_log_probs"][1, sampled[len(sampled) // 2]] -= 0.01  # the control: one token off
    batch.save_to_disk(str(path))
    assert cli_main(["check", str(path), "--model", str(tiny_model_dir), "--forward"]) == 1
    assert "differs from the forward pass" in capsys.readouterr().out


def test_a_row_whose_document_the_retriever_lacks_is_refused_before_sampling(tiny_model_dir, tiny_processor, tiny_llm):
    from retriever_server.api.testing import serve_in_thread
    from vrag_rollout.data.prompts import PromptSample
    from vrag_rollout.devkit.demo import cache_dir, prepare_index
    from vrag_rollout.retrieval.preflight import RetrieverPreflightError

    with serve_in_thread(prepare_index(cache_dir())) as url:
        settings = {**rollout_settings(tiny_processor, "tags"), "retriever_url": url}
        settings.pop("retriever_fixtures")
        worker = local_worker(tiny_model_dir, tiny_llm, settings)
        rows = prompt_rows([PromptSample(question="Which page covers revenue?", doc_id="no_such_doc")], "tags")
        with pytest.raises(RetrieverPreflightError, match="does not serve 1 document.*no_such_doc"):
            asyncio.run(worker.generate_sequences(rows))
        assert worker.llm_client.calls == 0
        rows = prompt_rows([PromptSample(question="Which page covers revenue?", doc_id="annual_report")], "tags")
        out = asyncio.run(worker.generate_sequences(rows))  # the control: a served document runs
    assert worker.llm_client.calls > 0 and len(out) == 1


def test_a_prompt_longer_than_prompt_length_is_refused_with_the_fix(tiny_model_dir, tiny_processor, tiny_llm):
    from vrag_rollout.data.prompts import PromptSample

    settings = {**rollout_settings(tiny_processor, "tags"), "prompt_length": 64}
    worker = local_worker(tiny_model_dir, tiny_llm, settings)
    rows = prompt_rows([PromptSample(question="Which page covers revenue?", doc_id="annual_report")], "tags")
    with pytest.raises(ValueError, match=r"prompt of \d+ tokens .* exceeds actor_rollout_ref.rollout.prompt_length=64"):
        asyncio.run(worker.generate_sequences(rows))
    assert worker.llm_client.calls == 0
