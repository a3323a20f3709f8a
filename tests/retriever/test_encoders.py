"""The encoder plug-in on a tiny, randomly initialised ColQwen2 built offline, and the guard that
keeps an index from being searched with another encoder."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from PIL import Image

from retriever_server.backends import open_backend
from retriever_server.cli import main
from retriever_server.encoders import ENV_ENCODER, EncoderMismatch, resolve_encoder
from retriever_server.encoders import encoder_fingerprint, load_encoder, parse_spec
from retriever_server.indexing.dense_index import DenseOptions
from retriever_server.storage.manifest import read_manifest

from .dense_support import dense_index, tiny_colqwen2


@pytest.fixture(autouse=True)
def _no_encoder_env(monkeypatch):
    # `serve` exports --encoder for its workers; keep that from leaking into other tests.
    monkeypatch.setenv(ENV_ENCODER, "")


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return tmp_path_factory.getbasetemp()


@pytest.fixture(scope="module")
def encoder(base):
    return load_encoder(f"colqwen2:{tiny_colqwen2(base)}")


def _jpeg(color, size=(300, 400)) -> bytes:
    out = io.BytesIO()
    image = Image.new("RGB", size, color)
    image.paste((0, 0, 0), (20, 20, 120, 60))
    image.save(out, "JPEG")
    return out.getvalue()


def test_tiny_model_is_deterministic(base, tmp_path):
    again = tiny_colqwen2(tmp_path, seed=0)
    assert encoder_fingerprint(f"colqwen2:{again}") == encoder_fingerprint(
        f"colqwen2:{tiny_colqwen2(base)}")
    other = tiny_colqwen2(tmp_path, seed=1)
    assert encoder_fingerprint(f"colqwen2:{other}") != encoder_fingerprint(f"colqwen2:{again}")


def test_query_vectors_are_normalised_and_unpadded(encoder):
    queries = ["terminal", "how do I configure the output terminal of the plotting program"]
    batched = encoder.encode_queries(queries)
    # Oracle: each query encoded alone has no padding at all.
    alone = [encoder.encode_queries([q])[0] for q in queries]
    for b, a in zip(batched, alone, strict=True):
        assert b.shape == a.shape and b.shape[1] == encoder.dim and b.dtype == np.float32
        np.testing.assert_allclose(b, a, atol=1e-4)
        np.testing.assert_allclose(np.linalg.norm(b, axis=1), 1.0, atol=1e-5)
    assert batched[0].shape[0] < batched[1].shape[0]


@pytest.mark.process
def test_image_vectors_have_one_row_per_token(encoder):
    pages = [_jpeg("white"), _jpeg("white", (600, 200))]
    vectors = encoder.encode_images(pages)
    for jpeg, v in zip(pages, vectors, strict=True):
        # Oracle: the processor's own token count for this image alone.
        inputs = encoder.processor.process_images(images=[Image.open(io.BytesIO(jpeg))])
        assert v.shape == (inputs["input_ids"].shape[1], encoder.dim)
    assert vectors[0].shape != vectors[1].shape  # the page's aspect ratio sets its grid


def test_spec_errors_are_clear(tmp_path):
    with pytest.raises(ValueError, match="NAME:PATH"):
        parse_spec("colpali:/x")
    with pytest.raises(ValueError, match="NAME:PATH"):
        parse_spec("/models/colqwen2")
    with pytest.raises(ValueError, match="no config.json"):
        parse_spec(f"colqwen2:{tmp_path}")


def test_index_options_are_checked_before_work(base):
    spec = f"colqwen2:{tiny_colqwen2(base)}"
    assert DenseOptions.from_args(None, None, None, None) is None
    assert DenseOptions.from_args(spec, None, None, None).search == "hybrid"
    with pytest.raises(ValueError, match="needs --backend qdrant"):
        DenseOptions.from_args(spec, "bm25", None, None)
    with pytest.raises(ValueError, match="needs --encoder"):
        DenseOptions.from_args(None, "qdrant", None, None)
    with pytest.raises(ValueError, match="need --backend qdrant"):
        DenseOptions.from_args(None, None, "http://localhost:6333", None)


@pytest.mark.process
def test_manifest_records_the_encoder(base, encoder):
    info = read_manifest(dense_index(base)).backend
    assert info["kind"] == "qdrant"
    assert info["encoder"] == {"spec": encoder.spec, "fingerprint": encoder.fingerprint,
                               "dim": encoder.dim}


@pytest.mark.process
def test_guard_refuses_another_encoder(base, tmp_path):
    info = read_manifest(dense_index(base)).backend
    same = f"colqwen2:{tiny_colqwen2(base)}"
    assert resolve_encoder(info, None) == info["encoder"]["spec"]
    assert resolve_encoder(info, same) == same
    other = f"colqwen2:{tiny_colqwen2(tmp_path, seed=1)}"
    with pytest.raises(EncoderMismatch, match="built for encoder"):
        resolve_encoder(info, other)
    with pytest.raises(EncoderMismatch, match="without an encoder"):
        resolve_encoder({"kind": "bm25"}, same)
    moved = {**info, "encoder": {**info["encoder"], "spec": f"colqwen2:{tmp_path / 'gone'}"}}
    with pytest.raises(EncoderMismatch, match="needs encoder"):
        resolve_encoder(moved, None)


@pytest.mark.process
def test_serve_and_open_backend_refuse_another_encoder(base, tmp_path, capsys, monkeypatch):
    index = dense_index(base)
    other = f"colqwen2:{tiny_colqwen2(tmp_path, seed=1)}"
    assert main(["serve", "--index", str(index), "--encoder", other]) == 2
    assert "built for encoder" in capsys.readouterr().err
    monkeypatch.setenv(ENV_ENCODER, other)
    with pytest.raises(EncoderMismatch):
        open_backend(index)


def test_serve_refuses_an_encoder_for_a_bm25_index(sample_index, base, capsys):
    assert main(["serve", "--index", str(sample_index), "--encoder",
                 f"colqwen2:{tiny_colqwen2(base)}"]) == 2
    assert "without an encoder" in capsys.readouterr().err


def test_a_replaced_checkpoint_is_refused(base, tmp_path):
    # The checkpoint at the recorded path changes after indexing: the guard notices.
    import shutil

    ckpt = shutil.copytree(tiny_colqwen2(base), tmp_path / "ckpt")
    info = {"encoder": {"spec": f"colqwen2:{ckpt}",
                        "fingerprint": encoder_fingerprint(f"colqwen2:{ckpt}"), "dim": 32}}
    assert resolve_encoder(info, None) == f"colqwen2:{ckpt}"
    config = json.loads((ckpt / "config.json").read_text())
    config["embedding_dim"] = 16
    (ckpt / "config.json").write_text(json.dumps(config))
    with pytest.raises(EncoderMismatch):
        resolve_encoder(info, None)


@pytest.mark.process
def test_cli_index_with_an_encoder(base, sample_pdfs, tmp_path, capsys):
    spec = f"colqwen2:{tiny_colqwen2(base)}"
    out = tmp_path / "idx"
    assert main(["index", str(sample_pdfs[2]), "--out", str(out), "--encoder", spec,
                 "--search", "dense", "--max-pixels", str(128 * 28 * 28),
                 "--min-pixels", str(64 * 28 * 28)]) == 0
    assert "4 page(s)" in capsys.readouterr().out
    info = read_manifest(out).backend
    assert (info["kind"], info["search"], info["qdrant"]["path"]) == ("qdrant", "dense", "qdrant")
    assert main(["index", str(sample_pdfs[0]), "--out", str(tmp_path / "x"),
                 "--backend", "qdrant"]) == 2
    assert "needs --encoder" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


@pytest.mark.process
def test_serve_refuses_several_workers_on_a_local_qdrant_index(base, capsys):
    assert main(["serve", "--index", str(dense_index(base)), "--workers", "2"]) == 2
    assert "local mode" in capsys.readouterr().err
