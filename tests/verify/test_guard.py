"""The live guard (`verify/guard.py`) on real rollout batches: clean batches pass, and each planted
defect marks exactly the sample `check` (the independent checker, on the same batch) fails; the
policy drops, stops or only reports."""

from __future__ import annotations

import dataclasses
import html
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from vrag_rollout.core.pages import pixels
from vrag_rollout.verify.check import check_batch
from vrag_rollout.verify.guard import Guard, GuardFailure, apply
from vrag_rollout.devkit.planted_defects import DEFECTS, plant
from vrag_rollout.verify.saved_batch import from_dataproto, load_rollout


def trainer_batch(saved) -> SimpleNamespace:
    """The saved batch as the trainer holds it in memory: tensors, columns, PIL images."""
    columns = {name: np.array(values, dtype=object) for name, values in saved.columns.items()}
    columns["multi_modal_data"] = np.array([{"images": saved.decoded_images(s)} for s in range(len(saved))],
                                           dtype=object)
    return SimpleNamespace(batch=dict(saved.tensors), non_tensor_batch=columns, meta_info=dict(saved.meta))


@pytest.fixture(scope="module")
def guard(grammar_rollout):
    return Guard(grammar_rollout.model_dir, positions_fraction=1.0)


@pytest.fixture
def saved(grammar_rollout):
    return load_rollout(grammar_rollout.path)  # a fresh copy per test


def bad_per_check(saved, model_dir) -> set[int]:
    return {f.sample for f in check_batch(saved, model_dir).failures}


@pytest.mark.engine  # its rollouts are requested by name
@pytest.mark.parametrize("name", ["grammar_rollout", "free_rollout", "tempered_rollout"])
def test_clean_batches_pass(name, request):
    rollout = request.getfixturevalue(name)
    report = Guard(rollout.model_dir, positions_fraction=1.0).inspect(rollout.output, rollout.config)
    assert report.ok, report.lines()
    assert report.positions_checked == list(range(len(rollout.output)))


def resaved(batch, rollout, processor):
    """The trainer batch as `check` reads it from disk."""
    return from_dataproto(batch, processor=processor, model_path=rollout.model_dir, config=rollout.config)


@pytest.mark.parametrize("name", list(DEFECTS))
def test_each_planted_defect_marks_the_sample_check_fails(name, saved, guard, grammar_rollout, tiny_processor):
    batch = trainer_batch(saved)
    row = plant(name, batch, tiny_processor, set())
    report = guard.inspect(batch, grammar_rollout.config)
    assert report.bad_samples == [row], report.lines()
    assert bad_per_check(resaved(batch, grammar_rollout, tiny_processor), grammar_rollout.model_dir) == {row}


def test_all_six_defects_in_one_batch_each_on_its_own_sample(saved, guard, grammar_rollout, tiny_processor):
    """What `scripts/check_easyr1.py --plant all` and `scripts/check_verl.py --plant all` do."""
    batch = trainer_batch(saved)
    taken: set = set()
    rows = {name: plant(name, batch, tiny_processor, taken) for name in DEFECTS}
    assert len(set(rows.values())) == len(DEFECTS)
    report = guard.inspect(batch, grammar_rollout.config)
    assert report.bad_samples == sorted(rows.values()), report.lines()
    with pytest.raises(ValueError, match="unknown defect 'typo'"):
        plant("typo", batch, tiny_processor, set())


def test_drop_masks_exactly_the_bad_samples_and_fail_stops(saved, guard, grammar_rollout, tiny_processor):
    batch = trainer_batch(saved)
    taken: set = set()
    rows = {plant("observation_in_loss", batch, tiny_processor, taken), plant("vision_token_sampled", batch, tiny_processor, taken)}
    before = {key: batch.batch[key].clone() for key in ("response_mask", "loss_mask")}
    report = guard.inspect(batch, grammar_rollout.config)
    assert set(report.bad_samples) == rows
    with pytest.raises(GuardFailure, match=rf"guard: {len(rows)} of {len(saved)} samples fail"):
        apply(batch, report, "fail")
    assert apply(batch, report, "warn")["guard/dropped"] == 0
    assert all(torch.equal(batch.batch[key], before[key]) for key in before)
    metrics = apply(batch, report, "drop")
    assert metrics["guard/dropped"] == len(rows) and metrics["guard/bad"] == len(rows)
    for key, old in before.items():
        assert int(batch.batch[key][sorted(rows)].sum()) == 0
        kept = [s for s in range(len(saved)) if s not in rows]
        assert torch.equal(batch.batch[key][kept], old[kept])
    with pytest.raises(ValueError, match="guard must be one of"):
        apply(batch, report, "skip")


def test_positions_are_compared_on_the_chosen_fraction(grammar_rollout):
    report = Guard(grammar_rollout.model_dir, positions_fraction=0.25, seed=3).inspect(
        grammar_rollout.output, grammar_rollout.config)
    assert len(report.positions_checked) == round(0.25 * len(grammar_rollout.output))
    assert report.metrics()["guard/positions_checked"] == len(report.positions_checked)


def test_a_guarded_rollout_acts_on_every_batch_and_learn_records_it(saved, guard, grammar_rollout, tiny_processor):
    """What `vrag-rollout learn --guard` wires: the rollout's batch is inspected and acted on before
    the update, and the step's metrics line carries the counts."""
    from vrag_rollout.training.learn import guard_fields
    from vrag_rollout.verify.guard import LiveGuard, guarded

    planted = trainer_batch(saved)
    row = plant("observation_in_loss", planted, tiny_processor, set())
    batch = guarded(lambda prompts: planted, LiveGuard(guard, "drop", config=grammar_rollout.config))(None)
    assert int(batch.batch["loss_mask"][row].sum()) == 0 and int(batch.batch["response_mask"][row].sum()) == 0
    assert guard_fields(batch) == {"guard_checked": float(len(saved)), "guard_bad": 1.0, "guard_dropped": 1.0}
    assert guard_fields(SimpleNamespace(meta_info={})) == {"guard_checked": 0.0, "guard_bad": 0.0,
                                                           "guard_dropped": 0.0}
    again = trainer_batch(load_rollout(grammar_rollout.path))
    row = plant("observation_in_loss", again, tiny_processor, set())
    with pytest.raises(GuardFailure, match=f"sample {row}"):
        guarded(lambda prompts: again, LiveGuard(guard, "fail", config=grammar_rollout.config))(None)
    with pytest.raises(ValueError, match="guard must be one of"):
        LiveGuard(guard, "strict")


def test_row_verdicts_survive_a_split_and_sum_back_to_the_report(saved, guard, grammar_rollout, tiny_processor):
    """A trainer splits the batch over data-parallel ranks and concatenates it again: the per-row
    column keeps each sample's verdict, and its sums are the report's counts."""
    from vrag_rollout.verify.guard import GUARD_COLUMN, LiveGuard, column_metrics

    batch = trainer_batch(saved)
    taken: set = set()
    rows = sorted({plant("observation_in_loss", batch, tiny_processor, taken),
                   plant("vision_token_sampled", batch, tiny_processor, taken)})
    metrics = LiveGuard(guard, "drop", config=grammar_rollout.config)(batch)
    column = batch.non_tensor_batch[GUARD_COLUMN]
    halves = [column[: len(column) // 2], column[len(column) // 2:]]
    summed = column_metrics(np.concatenate(halves[::-1]))
    assert summed["guard/checked"] == metrics["guard/checked"] == len(saved)
    assert summed["guard/bad"] == summed["guard/dropped"] == metrics["guard/dropped"] == len(rows)
    assert {name: value for name, value in summed.items() if name.startswith("guard/bad/")} == \
        {name: value for name, value in metrics.items() if name.startswith("guard/bad/")}
    assert {name: value for name, value in summed.items() if name.startswith("guard/dropped/")} == \
        {name: value for name, value in metrics.items() if name.startswith("guard/dropped/")} != {}
    assert [s for s in range(len(saved)) if column[s]["bad"]] == rows


def test_the_first_bad_samples_are_saved_where_check_and_view_read_them(saved, guard, grammar_rollout, tiny_processor,
                                                                         tmp_path):
    from vrag_rollout.verify.guard import BadSampleLog, LiveGuard
    from vrag_rollout.verify.view import write_html

    planted = trainer_batch(saved)
    row = plant("observation_in_loss", planted, tiny_processor, set())
    log = BadSampleLog(tmp_path / "bad", limit=1, processor=tiny_processor, model_path=grammar_rollout.model_dir,
                       config=grammar_rollout.config)
    live = LiveGuard(guard, "drop", log, config=grammar_rollout.config)
    planted_mask = saved.tensors["loss_mask"][row].clone()
    live(trainer_batch(load_rollout(grammar_rollout.path)))  # a clean step: nothing written, but counted
    assert live.last.ok and log.paths == []
    live(planted)  # drops the sample: its masks are zeroed in place
    assert int(saved.tensors["loss_mask"][row].sum()) == 0
    assert log.paths == [tmp_path / "bad" / "step_00002.pt"]
    kept = load_rollout(log.paths[0])
    assert len(kept) == 1 and kept.columns["guard_sample"] == [row] and kept.columns["guard_step"] == [2]
    assert kept.columns["doc_id"] == [saved.columns["doc_id"][row]]
    # saved as the rollout made it (before drop zeroed the masks), so check finds the same defect
    assert torch.equal(kept.tensors["loss_mask"][0], planted_mask)
    assert kept.columns["guard_failures"][0] == [str(f) for f in live.last.failures[row]]
    assert {f.check for f in check_batch(kept, grammar_rollout.model_dir).failures} >= {"observations"}
    page = write_html(log.paths[0], tmp_path / "bad.html").read_text()
    assert f'<p class="guard"><b>guard</b> {html.escape(str(live.last.failures[row][0]))}</p>' in page
    again = trainer_batch(load_rollout(grammar_rollout.path))
    plant("vision_token_sampled", again, tiny_processor, set())
    live(again)  # bad again, but the limit is reached: nothing more is written
    assert not live.last.ok and len(log.paths) == 1 and log.saved == 1


@pytest.mark.parametrize("family", ["qwen2-vl", "qwen2.5-vl", "qwen3-vl"])
def test_positions_grids_from_sizes_are_the_processors(family, monkeypatch):
    """The mrope comparison's grids come from the images' sizes (the processor's own resize rule),
    never from running the processor, and equal what the processor makes of the pixels."""
    from PIL import Image

    from vrag_rollout.devkit.tiny_model import build_tiny_model, default_model_dir
    from vrag_rollout.verify.check.images import trainer_rescale

    guard = Guard(build_tiny_model(default_model_dir(family), family))
    images = [Image.new("RGB", size) for size in [(784, 1008), (200, 180), (37, 1200), (3000, 2000), (64, 64)]]
    for band in ({}, {"trainer_min_pixels": 200704, "trainer_max_pixels": 401408}):
        views = [trainer_rescale(image, band.get("trainer_min_pixels"), band.get("trainer_max_pixels"))
                 for image in images]
        expected = guard.oracle.expand_images(views)[1]
        with monkeypatch.context() as patched:
            patched.setattr(guard.oracle, "expand_images", lambda *a: pytest.fail("the processor ran"))
            assert torch.equal(guard._grids(images, band), expected), band


@pytest.fixture(scope="module")
def hf_model(grammar_rollout):
    from transformers import AutoModelForImageTextToText

    return AutoModelForImageTextToText.from_pretrained(grammar_rollout.model_dir, dtype=torch.float32).eval()


def actor_forward(hf_model, processor, batch, row):
    """The trainer's forward pass of one sample: its attended tokens, its images through the processor."""
    ids = batch.batch["input_ids"][row][batch.batch["attention_mask"][row].bool()]
    images = [pixels(image) for image in batch.non_tensor_batch["multi_modal_data"][row]["images"]]
    inputs = {"input_ids": ids[None], "attention_mask": torch.ones_like(ids)[None],
              "mm_token_type_ids": (ids == token_of(processor, "<|image_pad|>")).int()[None]}
    if images:
        inputs.update(processor.image_processor(images=images, return_tensors="pt"))
    with torch.no_grad():
        return hf_model(**inputs).logits


def token_of(processor, name):
    return processor.tokenizer.convert_tokens_to_ids(name)


@pytest.mark.parametrize("name", ["image_pads_cut", "vision_token_sampled"])
def test_drop_empties_a_sample_the_trainers_forward_could_not_take(name, saved, guard, grammar_rollout,
                                                                    tiny_processor, hf_model):
    """A zeroed mask does not keep a sample out of the actor's forward, which raises for the whole
    batch when a sample's image pads and images disagree: drop empties that sample's response."""
    from vrag_rollout.verify.guard import LiveGuard

    batch = trainer_batch(saved)
    row = plant(name, batch, tiny_processor, set())
    with pytest.raises(ValueError, match="Image features and image tokens do not match"):
        actor_forward(hf_model, tiny_processor, batch, row)
    metrics = LiveGuard(guard, "drop", config=grammar_rollout.config)(batch)
    from vrag_rollout.verify.guard import GUARD_COLUMN, column_metrics

    assert column_metrics(batch.non_tensor_batch[GUARD_COLUMN])["guard/emptied"] == 1
    assert metrics["guard/emptied"] == 1 and int(batch.batch["attention_mask"][row, batch.batch["prompts"].shape[1]:].sum()) == 0
    actor_forward(hf_model, tiny_processor, batch, row)  # goes through now
    assert all(f.check != "image_tokens" for f in guard.inspect(batch, grammar_rollout.config).failures.get(row, []))


def image_runs(batch, row, processor):
    from vrag_rollout.devkit.planted_defects import runs

    ids = batch.batch["input_ids"][row][batch.batch["attention_mask"][row].bool()].tolist()
    return runs(ids, token_of(processor, "<|image_pad|>"))


def row_with_prompt_and_page_images(batch, processor) -> int:
    """A sample whose prompt shows an image and whose response shows a page of another pad count."""
    P = batch.batch["prompts"].shape[1]
    for row in range(len(batch.batch["responses"])):
        runs = image_runs(batch, row, processor)
        prompt_runs = int((batch.batch["attention_mask"][row, :P] != 0).sum())  # attended prompt tokens
        starts = [start for start, _ in runs]
        first_page = next((k for k, start in enumerate(starts) if start >= prompt_runs), None)
        if first_page == 1 and runs[0][1] - runs[0][0] != runs[1][1] - runs[1][0]:
            return row
    pytest.fail("no sample with a prompt image and a page of another size")


@pytest.mark.parametrize("fault", ["prompt_image_resized", "page_ahead_of_the_prompt_image"])
def test_drop_is_safe_when_the_bad_image_is_in_the_prompt(fault, saved, guard, grammar_rollout, tiny_processor,
                                                          hf_model):
    """A bad image in the prompt: emptying the response is not enough (the prompt's own pad run
    disagrees with the image kept for it). Drop leaves a text-only prompt the forward takes, with
    positions the family's `get_rope_index` gives it; the other samples are untouched."""
    from vrag_rollout.verify.guard import LiveGuard

    batch = trainer_batch(saved)
    row = row_with_prompt_and_page_images(batch, tiny_processor)
    images = [pixels(image) for image in batch.non_tensor_batch["multi_modal_data"][row]["images"]]
    if fault == "prompt_image_resized":
        images[0] = images[0].resize((images[0].width + 64, images[0].height))
    else:
        images[0], images[1] = images[1], images[0]
    batch.non_tensor_batch["multi_modal_data"][row] = {"images": images}
    before = {name: value.clone() for name, value in batch.batch.items()}
    if fault == "prompt_image_resized":
        with pytest.raises(ValueError, match="Image features and image tokens do not match"):
            actor_forward(hf_model, tiny_processor, batch, row)
    # swapped images hold as many features in all as the row has pads: the forward takes them
    # (in the wrong places), and a row emptied down to its prompt's share would not
    assert {f.check for f in guard.inspect(batch, grammar_rollout.config).failures[row]} == {"image_tokens"}
    metrics = LiveGuard(guard, "drop", config=grammar_rollout.config)(batch)
    assert metrics["guard/emptied"] == 1
    assert batch.non_tensor_batch["multi_modal_data"][row]["images"] == []
    assert not image_runs(batch, row, tiny_processor)
    actor_forward(hf_model, tiny_processor, batch, row)  # goes through now
    ids, attention = batch.batch["input_ids"][row], batch.batch["attention_mask"][row]
    assert tiny_processor.tokenizer.decode(ids[attention.bool()]).count("Question") >= 1  # the prompt's text stays
    expected = guard.oracle.rope_index(ids.long(), attention, None)
    positions = batch.batch["position_ids"][row]
    rope = positions[-3:] if positions.dim() == 2 else positions
    assert torch.equal(rope[:, attention.bool()], expected[:, attention.bool()])
    others = [r for r in range(len(batch.batch["responses"])) if r != row]
    for name, value in before.items():
        assert torch.equal(batch.batch[name][others], value[others]), name


def test_an_emptied_sample_scores_as_an_empty_response(saved, guard, grammar_rollout, tiny_processor):
    """Its retrieval part came from pages it no longer shows: the page columns are emptied with it."""
    from vrag_rollout.training.learn import episode_scores
    from vrag_rollout.verify.guard import LiveGuard

    batch = trainer_batch(saved)
    row = plant("image_pads_cut", batch, tiny_processor, set())
    shown = [page for turn in batch.non_tensor_batch["page_ids"][row] for page in turn]
    assert shown
    doc, page = shown[0].rsplit("_", 1)
    truth = {"answer": "the answer", "doc_id": doc, "gold_pages": [int(page)]}
    truths = [truth] * (len(batch.batch["responses"]) // grammar_rollout.config.n)

    def score():
        return episode_scores(batch, tiny_processor.tokenizer, truths)[row]

    assert score()["retrieval"] > 0
    LiveGuard(guard, "drop", config=grammar_rollout.config)(batch)
    assert list(batch.non_tensor_batch["page_ids"][row]) == []
    from vrag_rollout.core.reward import score_response

    assert score() == {key: float(value) for key, value in score_response("", {**truth, "page_ids": []}).items()}
    assert score()["overall"] == 0.0


def test_uid_strangers_nan_log_probs_and_over_budget_are_named(saved, guard, grammar_rollout):
    """Blind spots of the last round: a sample given another prompt's uid (or an n-chunk that is
    not one prompt's), a NaN rollout log-prob, and an over-budget batch's message naming no sample."""
    batch = trainer_batch(load_rollout(grammar_rollout.path))  # a fresh copy each time
    n = grammar_rollout.config.n
    size = len(batch.batch["responses"])
    assert n > 1 and size > n
    uids = np.array([f"prompt-{row // n}" for row in range(size)], dtype=object)  # as the trainers set them
    batch.non_tensor_batch["uid"] = uids
    assert guard.inspect(batch, grammar_rollout.config).ok
    uids[0] = uids[n]  # sample 0 now claims the second prompt's group
    report = guard.inspect(batch, grammar_rollout.config)
    assert [f.check for f in report.failures[0]] == ["grpo"] and "differs from the prompt of its group" in \
        str(report.failures[0][0])
    assert report.bad_samples == [0]

    batch = trainer_batch(load_rollout(grammar_rollout.path))  # a fresh copy each time  # no uid: groups by n-chunk; a sample of prompt 2 moved into chunk 1
    for name, value in batch.batch.items():
        value[1] = value[n].clone()
    batch.non_tensor_batch["multi_modal_data"][1] = batch.non_tensor_batch["multi_modal_data"][n]
    bad = guard.inspect(batch, grammar_rollout.config).failures
    assert any(f.check == "grpo" and "differs" in f.message for f in bad.get(0, []) + bad.get(1, []))

    batch = trainer_batch(load_rollout(grammar_rollout.path))  # a fresh copy each time
    real = batch.batch["attention_mask"][2, batch.batch["prompts"].shape[1]:].bool()
    batch.batch["rollout_log_probs"][2, int(real.sum()) // 2] = float("nan")
    report = guard.inspect(batch, grammar_rollout.config)
    assert report.bad_samples == [2] and "rollout_log_probs holds nan" in report.lines()[0]

    batch = trainer_batch(load_rollout(grammar_rollout.path))  # a fresh copy each time
    budget = int(batch.batch["attention_mask"][:, batch.batch["prompts"].shape[1]:].sum(1).max()) - 1
    config = dataclasses.replace(grammar_rollout.config, response_length=budget)
    with pytest.raises(GuardFailure, match=r"over the budget: sample \d+ \(\d+ tokens\)"):
        apply(batch, guard.inspect(batch, config), "fail")


def test_the_guard_reads_image_paths_as_easyr1_datasets_hold_them(guard, grammar_rollout, tmp_path):
    """EasyR1 datasets with `image_dir` hold file paths (`{"path": ..., "bytes": None}` or a plain
    path); the guard reads them as the rollout does and finds the clean batch clean."""
    batch = trainer_batch(load_rollout(grammar_rollout.path))
    column = batch.non_tensor_batch["multi_modal_data"]
    for row, item in enumerate(column):
        entries = []
        for k, image in enumerate(item["images"]):
            path = tmp_path / f"{row}_{k}.png"
            pixels(image).save(path)
            entries.append({"path": str(path), "bytes": None} if k % 2 else str(path))
        column[row] = {"images": entries}
    report = guard.inspect(batch, grammar_rollout.config)
    assert report.ok, report.lines()
    assert sum(len(item["images"]) for item in column) > len(column)


def test_a_shifted_mrope_is_caught_at_the_default_share_in_every_batch(guard, grammar_rollout, tiny_processor):
    """Every sample's positions are compared with the mrope rule, whatever the draw of the samples
    also compared with `get_rope_index`: 16 draws, 16 catches (at 1/8 the draw alone caught 4)."""
    batch = trainer_batch(load_rollout(grammar_rollout.path))
    row = plant("shifted_positions", batch, tiny_processor, set())
    for seed in range(16):
        drawn = Guard(oracle=guard.oracle, seed=seed)  # the default positions_fraction
        report = drawn.inspect(batch, grammar_rollout.config)
        assert report.bad_samples == [row] and report.failures[row][0].check == "positions", (seed, report.lines())
