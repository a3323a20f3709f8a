"""`vrag-rollout check` on real rollout batches: the clean batch passes, and every planted defect
is caught with a failure naming the sample and the position."""

from __future__ import annotations

import json
import pickle

import pytest
import torch

from tests.verify.helpers import (caught, copy_sample, delete_response_token, observation_blocks, pickled_trainer_batch,
                                  response_image_runs, rows_with_response_images, runs, token_id)
from vrag_rollout.verify.check import CheckInputError, check_batch, run_check
from vrag_rollout.cli import main as cli_main
from vrag_rollout.verify.saved_batch import load_rollout


# ---------------------------------------------------------------------------- the clean batches


def test_clean_batch_passes(grammar_rollout):
    report = run_check(grammar_rollout.path, grammar_rollout.model_dir)
    assert report.ok, report.human()
    assert report.samples == len(grammar_rollout.output)
    assert report.model_family == "qwen2_vl"


def test_clean_batch_passes_the_cli_with_a_json_last_line(grammar_rollout, capsys):
    code = cli_main(["check", str(grammar_rollout.path), "--model", str(grammar_rollout.model_dir)])
    out = capsys.readouterr().out.strip().splitlines()
    assert code == 0, "\n".join(out)
    verdict = json.loads(out[-1])
    assert verdict["ok"] is True and verdict["failures"] == 0 and verdict["samples"] == len(grammar_rollout.output)
    assert "PASS" in out[-2]


def test_the_batch_exercises_every_check(grammar_rollout, tiny_processor):
    """The clean batch must hold what the defects below plant into: pages in responses,
    observation blocks, EOS endings with room left, and n=2 groups."""
    saved = load_rollout(grammar_rollout.path)
    image_pad = token_id(tiny_processor, "<|image_pad|>")
    assert rows_with_response_images(saved, image_pad)
    assert any(observation_blocks(saved, row) for row in range(len(saved)))
    assert "answered" in saved.columns["termination_reason"]
    assert saved.action_grammar is True and saved.config["n"] == 2


def test_forward_without_grammar_agrees_with_the_rollout_logprobs(free_rollout):
    report = run_check(free_rollout.path, free_rollout.model_dir, forward=True)
    assert report.ok, report.human()
    assert report.forward["grammar"] is False and report.forward["tokens"] > 0
    assert report.forward["max_gap"] < 1e-3
    assert report.forward["mean_gap"] <= report.forward["max_gap"]


def test_forward_follows_temperature_top_k_and_top_p(tempered_rollout):
    saved = load_rollout(tempered_rollout.path)
    assert saved.meta.get("rollout_log_probs_mode") == "processed_logprobs"
    report = check_batch(saved, tempered_rollout.model_dir, forward=True)
    assert report.ok, report.human()
    assert report.forward["tokens"] > 0 and report.forward["max_gap"] < 1e-3
    saved.config["temperature"] = 1.0  # the same batch read at the wrong temperature is refused
    assert not check_batch(saved, tempered_rollout.model_dir, forward=True).ok


def test_forward_under_a_grammar_replays_it_and_compares_exactly(grammar_rollout, capsys):
    """The batch records its grammars: each turn's is replayed as vLLM applied it (xgrammar), so
    the constrained log-probs are compared, not excused."""
    code = cli_main(["check", str(grammar_rollout.path), "--model", str(grammar_rollout.model_dir), "--forward"])
    out = capsys.readouterr().out.strip().splitlines()
    verdict = json.loads(out[-1])
    assert code == 0 and verdict["ok"], "\n".join(out)
    assert verdict["forward"]["grammar"] is True and verdict["forward"]["grammar_replayed"] is True
    assert verdict["forward"]["tokens"] > 0 and verdict["forward"]["max_gap"] < 1e-3
    assert any("replayed" in note for note in verdict["notes"]) and out[-2] == "PASS"


def test_a_grammar_the_tokens_do_not_follow_fails_the_replay(grammar_rollout):
    saved = load_rollout(grammar_rollout.path)
    # the same batch read against a grammar whose answers are digits only: the sampled answers break it
    saved.config["action_regex"] = saved.config["action_regex"].replace("<answer>[a-z0-9 ]", "<answer>[0-9]")
    report = check_batch(saved, grammar_rollout.model_dir, forward=True)
    assert any("does not allow there" in f.message for f in report.failures), report.human()


def test_a_trainer_batch_carries_its_grammars_in_its_meta(grammar_rollout):
    """What EasyR1's worker hands back (the rollout's meta_info, no config): replayed all the same."""
    from verl.protocol import DataProto

    from vrag_rollout.verify.saved_batch import from_dataproto

    output = grammar_rollout.output
    proto = DataProto.from_dict(tensors=dict(output.batch.items()), non_tensors=dict(output.non_tensor_batch),
                                meta_info=dict(output.meta_info))
    report = check_batch(from_dataproto(proto, model_path=grammar_rollout.model_dir), grammar_rollout.model_dir,
                         forward=True)
    assert report.ok and report.forward["grammar_replayed"] and report.forward["max_gap"] < 1e-3, report.human()


def test_forward_under_an_unrecorded_grammar_says_so_instead_of_failing(grammar_rollout):
    saved = load_rollout(grammar_rollout.path)
    saved.config.pop("action_regex"), saved.config.pop("first_turn_action_regex", None)  # as a trainer pickle
    report = check_batch(saved, grammar_rollout.model_dir, forward=True)
    assert report.ok, report.human()
    assert report.forward["grammar"] is True and report.forward["grammar_replayed"] is False
    assert report.forward["max_gap"] > 1e-2  # constrained logprobs really differ ...
    assert any("grammar" in note for note in report.notes)  # ... and the report says why
    assert report.human().splitlines()[-1].startswith("PASS (logprobs not compared to the forward pass: an action")


def test_the_verdict_of_a_grammar_free_forward_check_is_plain(free_rollout, capsys):
    code = cli_main(["check", str(free_rollout.path), "--model", str(free_rollout.model_dir), "--forward"])
    out = capsys.readouterr().out.strip().splitlines()
    assert code == 0 and out[-2] == "PASS", "\n".join(out)


def test_check_is_independent_of_the_code_it_checks(grammar_rollout, monkeypatch):
    """check reads the file through saved_batch only (and its image reader, a leaf), and passes with the rollout's own token,
    position, observation and vision code sabotaged."""
    import ast
    import importlib
    import inspect
    import pkgutil
    from importlib.util import resolve_name

    from vrag_rollout.core import batch, observation, positions, vision
    from vrag_rollout.verify import check, image_entries, saved_batch

    parts = [importlib.import_module(f"{check.__name__}.{info.name}") for info in pkgutil.iter_modules(check.__path__)]
    assert len(parts) > 1, parts
    own = {check.__name__} | {part.__name__ for part in parts}
    for module, allowed in [(m, own | {saved_batch.__name__}) for m in (check, *parts)] + [(saved_batch, {image_entries.__name__}),
                                                                                     (image_entries, set())]:
        tree = ast.parse(inspect.getsource(module))
        package = module.__name__ if hasattr(module, "__path__") else module.__name__.rpartition(".")[0]
        relative = {resolve_name("." * node.level + (node.module or ""), package)
                    for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level}
        absolute = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and not node.level}
        absolute |= {a.name for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names}
        assert relative <= allowed, (module.__name__, relative - allowed)
        assert not any(name.startswith("vrag_rollout") for name in absolute), (module.__name__, absolute)

    def sabotaged(*args, **kwargs):
        raise AssertionError("check used the rollout's own code")

    for module, name in ((positions, "rope_positions"), (positions, "text_positions"),
                         (observation, "ObservationBuilder"), (observation, "VisionTokens"),
                         (batch, "response_position_ids"), (vision, "fit_to_band"), (vision, "decode_page")):
        monkeypatch.setattr(module, name, sabotaged)
    report = run_check(grammar_rollout.path, grammar_rollout.model_dir)
    assert report.ok, report.human()


def test_forward_under_a_grammar_still_catches_impossible_logprobs(grammar_rollout):
    """A constrained logprob below the unconstrained one cannot come from this model and sequence."""
    saved = load_rollout(grammar_rollout.path)
    P = saved.tensors["prompts"].shape[1]
    row = 1
    position = int(saved.tensors["loss_mask"][row].nonzero()[3])
    saved.tensors["rollout_log_probs"][row, position] = -60.0
    report = check_batch(saved, grammar_rollout.model_dir, forward=True)
    caught(report, "forward", row, P + position, "under the replayed grammar")
    saved.config.pop("action_regex"), saved.config.pop("first_turn_action_regex", None)  # unrecorded: the bound
    report = check_batch(saved, grammar_rollout.model_dir, forward=True)
    caught(report, "forward", row, P + position, "below the unconstrained")


# ---------------------------------------------------------------------------- planted defects


@pytest.fixture
def saved(grammar_rollout):
    return load_rollout(grammar_rollout.path)  # a fresh copy per test


@pytest.mark.parametrize("rows", [slice(None), slice(1, None), slice(0, 1)], ids=["all-rows", "mrope-rows", "text-row"])
def test_positions_shifted_by_one(saved, grammar_rollout, tiny_processor, rows):
    image_pad = token_id(tiny_processor, "<|image_pad|>")
    row = rows_with_response_images(saved, image_pad)[0]
    P = saved.tensors["prompts"].shape[1]
    first_image = response_image_runs(saved, row, image_pad)[0][0]
    saved.tensors["position_ids"][row, rows, P + first_image:] += 1
    report = check_batch(saved, grammar_rollout.model_dir)
    caught(report, "positions", row, P + first_image)


def test_pad_run_cut_short(saved, grammar_rollout, tiny_processor):
    image_pad = token_id(tiny_processor, "<|image_pad|>")
    row = rows_with_response_images(saved, image_pad)[0]
    P = saved.tensors["prompts"].shape[1]
    start, end = response_image_runs(saved, row, image_pad)[0]
    delete_response_token(saved, row, end - 1)
    report = check_batch(saved, grammar_rollout.model_dir)
    failure = caught(report, "image_tokens", row, P + start, "pad run of")
    assert f"{end - start - 1} tokens" in failure.message


def test_a_sampled_padded_vocabulary_row(saved, grammar_rollout, tiny_processor):
    """Released checkpoints pad the embedding past the tokenizer; an id there decodes to nothing.
    A sampled one is a rollout defect (it must be banned), not a batch of another model."""
    row, P = 0, saved.tensors["prompts"].shape[1]
    position = int(saved.tensors["loss_mask"][row].nonzero()[2])
    padded = len(tiny_processor.tokenizer) + 5
    for key in ("responses", "input_ids"):
        offset = 0 if key == "responses" else P
        saved.tensors[key][row, offset + position] = padded
    report = check_batch(saved, grammar_rollout.model_dir)
    caught(report, "contract", row, P + position, f"token id {padded} is a padded row")


def test_observation_text_token_in_the_loss_mask(saved, grammar_rollout):
    row = next(r for r in range(len(saved)) if observation_blocks(saved, r))
    start, end = observation_blocks(saved, row)[0]
    P = saved.tensors["prompts"].shape[1]
    saved.tensors["loss_mask"][row, start + 1] = 1  # a token of the "<result>" text
    report = check_batch(saved, grammar_rollout.model_dir)
    caught(report, "observations", row, P + start + 1)


def test_observation_image_token_in_the_loss_mask(saved, grammar_rollout, tiny_processor):
    image_pad = token_id(tiny_processor, "<|image_pad|>")
    row = rows_with_response_images(saved, image_pad)[0]
    start, _ = response_image_runs(saved, row, image_pad)[0]
    P = saved.tensors["prompts"].shape[1]
    saved.tensors["loss_mask"][row, start + 2] = 1
    report = check_batch(saved, grammar_rollout.model_dir)
    caught(report, "image_tokens", row, P + start + 2, "loss mask")


def test_whole_observation_in_the_loss_mask(saved, grammar_rollout):
    """No masked block is left to look at: the sampled run going on past the tool call shows it."""
    row = next(r for r in range(len(saved)) if observation_blocks(saved, r))
    start, end = observation_blocks(saved, row)[0]
    P = saved.tensors["prompts"].shape[1]
    saved.tensors["loss_mask"][row, start:end] = 1
    report = check_batch(saved, grammar_rollout.model_dir)
    caught(report, "observations", row, P + start, "after the tool call")


def test_identical_grpo_group(saved, grammar_rollout):
    first, second = 2, 3  # prompt 1's two samples
    copy_sample(saved, first, second)
    report = check_batch(saved, grammar_rollout.model_dir)
    failure = caught(report, "grpo", first, saved.tensors["prompts"].shape[1], "identical")
    assert "[2, 3]" in failure.message
    assert {f.check for f in report.failures} == {"grpo"}


def test_two_images_in_the_wrong_order(saved, grammar_rollout, tiny_processor):
    """Images whose grids differ: the pad runs no longer match the processor's expansions."""
    image_pad = token_id(tiny_processor, "<|image_pad|>")
    row = next(r for r in rows_with_response_images(saved, image_pad)
               if len({im.size for im in saved.decoded_images(r)}) > 1)
    images = saved.images[row]
    sizes = [im.size for im in saved.decoded_images(row)]
    k = next(i for i in range(1, len(sizes)) if sizes[i] != sizes[0])
    images[0], images[k] = images[k], images[0]
    full_runs = runs(saved.tensors["input_ids"][row].tolist(), image_pad)
    report = check_batch(saved, grammar_rollout.model_dir)
    caught(report, "image_tokens", row, full_runs[0][0], "wrong order")
    caught(report, "image_tokens", row, full_runs[k][0], f"image {k}: pad run")


def test_two_equal_size_images_in_the_wrong_order_need_the_forward_pass(free_rollout):
    """Same grids: token counts and positions are right, but the pixels the engine sampled from
    are not the ones the trainer will use; only the rollout logprobs can tell."""
    saved = load_rollout(free_rollout.path)
    row = 0
    assert len(saved.images[row]) == 2 and len({im.size for im in saved.decoded_images(row)}) == 1
    saved.images[row].reverse()
    assert check_batch(saved, free_rollout.model_dir).ok  # invisible to the token checks
    report = check_batch(saved, free_rollout.model_dir, forward=True)
    assert report.forward["max_gap"] > 1e-3
    failure = next(f for f in report.failures if f.check == "forward")
    assert failure.sample == row and failure.position >= saved.tensors["prompts"].shape[1]
    assert f"sample {row}" in str(failure)


@pytest.mark.parametrize("with_attention", [True, False], ids=["masks-agree", "response-mask-only"])
def test_response_mask_running_past_eos(saved, grammar_rollout, with_attention):
    P, R = saved.tensors["prompts"].shape[1], saved.tensors["responses"].shape[1]
    reasons = saved.columns["termination_reason"]
    row = next(r for r in range(len(saved)) if reasons[r] == "answered"
               and int(saved.tensors["response_mask"][r].sum()) < R - 3)
    used = int(saved.tensors["response_mask"][row].sum())
    saved.tensors["response_mask"][row, used:used + 3] = 1
    if with_attention:
        saved.tensors["attention_mask"][row, P + used:P + used + 3] = 1
        caught(check_batch(saved, grammar_rollout.model_dir), "contract", row, P + used, "past its EOS")
    else:
        caught(check_batch(saved, grammar_rollout.model_dir), "contract", row, P + used, "attention_mask is 0")


def test_input_ids_not_prompts_plus_responses(saved, grammar_rollout):
    P = saved.tensors["prompts"].shape[1]
    saved.tensors["responses"][5, 3] += 1
    caught(check_batch(saved, grammar_rollout.model_dir), "contract", 5, P + 3, "prompts+responses")


def test_wrong_widths_are_reported_not_crashed_on(saved, grammar_rollout):
    saved.tensors["responses"] = saved.tensors["responses"][:, :-1]
    report = check_batch(saved, grammar_rollout.model_dir)
    assert not report.ok and all(f.check == "contract" for f in report.failures)
    assert any("responses" in f.message for f in report.failures)


# ---------------------------------------------------------------------------- other inputs


def test_a_pickled_trainer_batch_is_checked_too(grammar_rollout, tmp_path):
    """EasyR1's layout: a pickled verl DataProto, response_mask = the loss mask, v0.3's "image"
    key with {"bytes": ...} entries."""
    import verl.protocol  # noqa: F401  (part of the test extra: missing fails, never skips)
    path = pickled_trainer_batch(grammar_rollout.output, tmp_path / "trainer_batch.pkl")
    loaded = load_rollout(path)
    assert loaded.source == "dataproto" and loaded.image_key == "image" and loaded.model_family is None
    assert torch.equal(loaded.tensors["response_mask"], grammar_rollout.output.batch["loss_mask"])
    report = run_check(path, grammar_rollout.model_dir)
    assert report.ok, report.human()


def test_not_a_batch_is_a_clear_error(tmp_path, grammar_rollout, capsys):
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"definitely not a batch")
    code = cli_main(["check", str(junk), "--model", str(grammar_rollout.model_dir)])
    out = capsys.readouterr().out.strip().splitlines()
    assert code == 2
    assert "not a saved rollout batch" in out[0]
    assert json.loads(out[-1])["ok"] is False
    tensor_file = tmp_path / "tensor.pt"
    torch.save({"weights": torch.zeros(3)}, tensor_file)
    with pytest.raises(CheckInputError, match="not a saved rollout batch"):
        run_check(tensor_file, grammar_rollout.model_dir)
    legacy = tmp_path / "legacy.pt"
    torch.save({"responses": torch.zeros(1, 2), "image_grid_thw": [[]]}, legacy)
    with pytest.raises(CheckInputError, match="older `vrag-rollout demo`"):
        run_check(legacy, grammar_rollout.model_dir)
    pickled = tmp_path / "list.pkl"
    pickled.write_bytes(pickle.dumps([1, 2, 3]))
    with pytest.raises(CheckInputError, match="DataProto"):
        run_check(pickled, grammar_rollout.model_dir)


def test_model_of_another_family_is_a_clear_error(saved, grammar_rollout, tmp_path):
    saved.model_family = "qwen3_vl"
    with pytest.raises(CheckInputError, match="made by a qwen3_vl model but --model .* is qwen2_vl"):
        check_batch(saved, grammar_rollout.model_dir)
    with pytest.raises(CheckInputError, match="cannot read a model config"):
        check_batch(saved, tmp_path)


def test_turn_ids_follow_the_turns_and_a_shifted_turn_is_caught(saved, grammar_rollout):
    """The rollout's turn ids: 1 on the first turn, one more at each sampled run after an
    observation, the observation answering a turn carries its number, 0 on padding; and the
    observation blocks of a turn hold the pages its `turn_page_ids` entry names."""
    t = saved.tensors
    P = t["prompts"].shape[1]
    row = next(r for r in range(len(saved)) if len(observation_blocks(saved, r)) >= 2)
    used = int(t["attention_mask"][row, P:].sum())
    turns = t["turn_ids"][row]
    assert int(turns[0]) == 1 and int(turns[used:].abs().sum()) == 0
    blocks = observation_blocks(saved, row)
    for k, (start, end) in enumerate(blocks):
        assert int(turns[start - 1]) == int(turns[start]) == int(turns[end - 1]), "an observation shares its turn"
        if end < used:
            assert int(turns[end]) == int(turns[start]) + 1, "the next sampled run starts a new turn"
    assert int(turns[:used].max()) == saved.columns["num_turns"][row]
    per_turn = saved.columns["turn_page_ids"][row]
    assert len(per_turn) == saved.columns["num_turns"][row]
    assert [page for pages in per_turn for page in pages] == [p for obs in saved.columns["page_ids"][row] for p in obs]
    start, end = blocks[1]
    t["turn_ids"][row, start:end] += 1  # the second observation numbered as the turn after it
    caught(check_batch(saved, grammar_rollout.model_dir), "turns", row, P + start, "on an observation token")
