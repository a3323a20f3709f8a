"""The saved-batch format: a real rollout round-trips with its images, columns and metadata."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image

from tests.verify.helpers import pickled_trainer_batch
from vrag_rollout.core.pages import PageEntry, pixels
from vrag_rollout.verify.check import check_batch
from vrag_rollout.verify.view import render
from vrag_rollout.verify.saved_batch import FORMAT, FORMAT_VERSION, NotABatchError, SavedBatch, encode_image, load_rollout


def test_round_trip_of_a_real_rollout(grammar_rollout):
    out = grammar_rollout.output
    saved = load_rollout(grammar_rollout.path)
    assert saved.version == FORMAT_VERSION and saved.source == "vrag-rollout"
    assert set(saved.tensors) == set(out.batch.keys())
    assert "rollout_log_probs" in saved.tensors
    for key in out.batch.keys():
        assert torch.equal(saved.tensors[key], out.batch[key]), key
    for row, item in enumerate(out.non_tensor_batch["multi_modal_data"]):
        originals = item["images"]
        decoded = saved.decoded_images(row)
        assert len(decoded) == len(originals)
        for original, back in zip(originals, decoded):  # lossless: the very pixels, the very grid
            assert back.size == original.size
            original = pixels(original)
            assert np.array_equal(np.asarray(back.convert("RGB")), np.asarray(original.convert("RGB")))
    for name in ("doc_id", "termination_reason", "num_turns", "num_searches", "num_fetches"):
        assert saved.columns[name] == [v.item() if hasattr(v, "item") else v for v in out.non_tensor_batch[name]]
    assert saved.columns["page_ids"] == [[list(turn) for turn in row] for row in out.non_tensor_batch["page_ids"]]
    assert saved.metrics == out.meta_info["metrics"]
    assert saved.model_family == "qwen2_vl" and saved.action_grammar is True
    assert saved.config["n"] == grammar_rollout.config.n and saved.config["action_regex"]
    band = saved.pixel_band
    assert (band["page_min_pixels"], band["page_max_pixels"]) == (grammar_rollout.config.page_min_pixels,
                                                                  grammar_rollout.config.page_max_pixels)
    assert band["patch_size"] == 14 and band["merge_size"] == 2
    assert saved.token_text and all(int(t) in saved.token_text for t in torch.unique(saved.tensors["input_ids"]))


def test_own_files_load_without_unpickling_code(grammar_rollout):
    data = torch.load(grammar_rollout.path, weights_only=True)  # plain data only
    assert data["format"] == FORMAT and isinstance(data["images"][0], list)


def test_each_distinct_page_is_saved_once(grammar_rollout):
    """The file holds each distinct page's bytes once; every sample refers to it by index, and
    the loaded batch's samples share the one bytes object."""
    column = grammar_rollout.output.non_tensor_batch["multi_modal_data"]
    entries = [image for item in column for image in item["images"]]
    distinct = {image.key for image in entries if isinstance(image, PageEntry)}
    assert len(entries) > len(distinct) >= 1  # the batch shows some page more than once
    data = torch.load(grammar_rollout.path, weights_only=True)
    prompt_images = {encode_image(image) for image in entries if not isinstance(image, PageEntry)}
    assert len(data["pages"]) == len(distinct) + len(prompt_images)
    assert sorted(len(refs) for refs in data["images"]) == sorted(len(item["images"]) for item in column)
    saved = load_rollout(grammar_rollout.path)
    loaded = {id(data) for row in saved.images for data in row}
    assert len(loaded) == len(data["pages"])


def test_a_version_1_file_still_opens_in_check_and_view(grammar_rollout, tmp_path):
    """Version 1 held every sample's image bytes inline (one copy per sample); such files still
    load, check and view as before."""
    saved = load_rollout(grammar_rollout.path)
    old = saved.to_dict()
    old["version"] = 1
    old["images"] = [list(row) for row in saved.images]
    del old["pages"]
    path = tmp_path / "version1.pt"
    torch.save(old, path)
    back = load_rollout(path)
    assert back.version == 1 and back.images == saved.images
    report = check_batch(back, str(grammar_rollout.model_dir))
    assert report.ok, report.human()
    assert render(back, str(grammar_rollout.model_dir)).count("<img") >= sum(len(row) for row in back.images)


def test_a_newer_format_version_is_refused(grammar_rollout, tmp_path):
    data = torch.load(grammar_rollout.path, weights_only=True)
    data["version"] = FORMAT_VERSION + 1
    path = tmp_path / "future.pt"
    torch.save(data, path)
    with pytest.raises(NotABatchError, match=f"format version {FORMAT_VERSION + 1}"):
        load_rollout(path)


def test_free_batch_without_grammar_is_recorded_so(free_rollout):
    saved = load_rollout(free_rollout.path)
    assert saved.action_grammar is False
    assert all(len(images) == 2 for images in saved.images)


def test_pickled_trainer_batch_loads(grammar_rollout, tmp_path):
    import verl.protocol  # noqa: F401  (part of the test extra: missing fails, never skips)
    path = pickled_trainer_batch(grammar_rollout.output, tmp_path / "batch.pkl")
    saved = load_rollout(path)
    assert saved.source == "dataproto" and saved.image_key == "image"
    assert saved.model_family is None and saved.action_grammar is None and not saved.token_text
    columns = grammar_rollout.output.non_tensor_batch
    assert [len(x) for x in saved.images] == [len(x["images"]) for x in columns["multi_modal_data"]]
    as_torch = tmp_path / "batch_torch.pt"  # torch.save of a DataProto reads the same
    torch.save(pickle_load(path), as_torch)
    assert torch.equal(load_rollout(as_torch).tensors["responses"], saved.tensors["responses"])


def pickle_load(path):
    import pickle

    with open(path, "rb") as f:
        return pickle.load(f)


def test_encode_image_keeps_original_bytes_and_pngs_pil(tmp_path):
    jpeg = io.BytesIO()
    Image.new("RGB", (20, 10), (200, 10, 10)).save(jpeg, format="JPEG")
    raw = jpeg.getvalue()
    assert encode_image(raw) == raw
    assert encode_image({"bytes": raw, "path": None}) == raw
    file = tmp_path / "page.jpg"
    file.write_bytes(raw)
    assert encode_image(str(file)) == raw and encode_image({"bytes": None, "path": str(file)}) == raw
    png = encode_image(Image.new("RGB", (7, 5)))
    assert png.startswith(b"\x89PNG") and Image.open(io.BytesIO(png)).size == (7, 5)
    with pytest.raises(TypeError, match="cannot encode"):
        encode_image(3.5)


def test_missing_file_and_bad_dict():
    with pytest.raises(FileNotFoundError):
        load_rollout("/nonexistent/batch.pt")
    with pytest.raises(NotABatchError, match="version"):
        SavedBatch.from_dict({"format": FORMAT, "tensors": {}, "images": []})
