"""`results.jsonl`'s header: every input that can change a score is in it, and a resume with any
one of them changed is refused, naming it. The index searched is one of them: a resume against
another index is refused."""

from __future__ import annotations

import copy
import inspect
from dataclasses import fields

import pytest
from fastapi.testclient import TestClient

from vrag_rollout.devkit.evaluate_job import index_identity, results_header, run_evaluation
from vrag_rollout.devkit.job_checks import JobInputError
from vrag_rollout.evaluation.index_identity import from_server
from vrag_rollout.evaluation.protocol import Protocol
from vrag_rollout.evaluation.results import ResultsFile, ResultsMismatch

JUDGE = {"model": "/models/judge", "fingerprint": "0123abcd", "prompt_version": "vrag-rl-criteria-1", "prompt": "p"}
INDEX = {"version": "a1b2c3d4e5f60718", "documents": 3, "pages": 13}


def header(**protocol) -> dict:
    return results_header(Protocol(**protocol), data="/data/vidoseek.parquet", data_sha256="d" * 64,
                          model="/models/policy", model_fingerprint="feedbeef", scopes=["corpus"], grammar=False,
                          index=dict(INDEX), sets=["vidoseek"])


HEADERS = {"with a judge": header(judge=JUDGE, search_required=True, scope="corpus"), "without": header()}

# Each input of `run_evaluation`: the header fields that record it, or why it cannot change a score.
RECORDED = {"data": ("data", "data_sha256", "sets"), "model": ("model", "model_fingerprint"),
            "family": ("model", "model_fingerprint"), "protocol": ("protocol",),
            "index": ("index",), "retriever_url": ("index",), "grammar": ("grammar",),
            "judge_model": ("protocol.judge",)}
NOT_SCORED = {
    "out": "where the files go",
    "limit": "which questions run; the report covers this run's questions only",
    "batch_size": "greedy decoding; a resume batches the questions left anyway (docs/evaluation.md)",
    "llm": "a running engine of the same model (tests)",
    "judge_llm": "a running engine of the same judge (tests)",
    "progress": "the progress lines",
}


def leaves(value, prefix=""):
    if isinstance(value, dict) and value:
        for key, item in value.items():
            yield from leaves(item, f"{prefix}{key}.")
    else:
        yield prefix[:-1], value


def changed(value):
    """Another value of the same kind."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1
    if isinstance(value, str):
        return value + "-other"
    if isinstance(value, list):
        return value + ["other"]
    return "other"  # None


def with_field(found: dict, name: str, value) -> dict:
    out = copy.deepcopy(found)
    *parents, last = name.split(".")
    target = out
    for part in parents:
        target = target[part]
    target[last] = value
    return out


@pytest.mark.parametrize("variant", sorted(HEADERS))
def test_a_resume_with_any_header_field_changed_is_refused_naming_it(variant, tmp_path):
    first = HEADERS[variant]
    path = tmp_path / "results.jsonl"
    ResultsFile.open(path, first).close()
    names = [name for name, _ in leaves(first)]
    assert {"protocol.max_turns", "protocol.search_required", "index.version", "model_fingerprint",
            "protocol.n", "protocol.temperature"} <= set(names)  # a resume with another n or temperature too
    for name, value in leaves(first):
        mutated = with_field(first, name, changed(value))
        with pytest.raises(ResultsMismatch) as refused:
            ResultsFile.open(path, mutated)
        message = str(refused.value)
        assert f"another {name} " in message and repr(value) in message and repr(changed(value)) in message, message
    ResultsFile.open(path, copy.deepcopy(first)).close()  # the same header resumes


def test_a_file_from_before_a_field_existed_is_refused(tmp_path):
    older = dict(HEADERS["without"])
    del older["index"]  # written before the header recorded the index
    path = tmp_path / "results.jsonl"
    ResultsFile.open(path, older).close()
    with pytest.raises(ResultsMismatch, match=r"another index \('\(none\)', now \{"):
        ResultsFile.open(path, HEADERS["without"])


def test_every_input_of_the_job_is_recorded_or_cannot_change_a_score():
    parameters = set(inspect.signature(run_evaluation).parameters)
    assert parameters == set(RECORDED) | set(NOT_SCORED)
    names = {name for name, _ in leaves(HEADERS["with a judge"])}
    for recorded in RECORDED.values():
        for field in recorded:
            assert any(name == field or name.startswith(field + ".") for name in names), field
    # every protocol switch is in the header, by name
    assert {f"protocol.{f.name}" for f in fields(Protocol)} - {"protocol.judge"} <= names


@pytest.fixture(scope="module")
def two_indexes(tmp_path_factory):
    """The sample corpus indexed twice, at two page sizes: the same documents and pages, another index."""
    from retriever_server.indexing.indexer import build_index
    from retriever_server.sample_corpus import write_sample_corpus

    work = tmp_path_factory.mktemp("indexes")
    pdfs = write_sample_corpus(work / "corpus")
    build_index(pdfs, work / "a", min_pixels=32 * 28 * 28, max_pixels=128 * 28 * 28)
    build_index(pdfs, work / "b", min_pixels=32 * 28 * 28, max_pixels=64 * 28 * 28)
    return work / "a", work / "b"


def test_the_index_identity_is_what_the_retriever_reports(two_indexes):
    from retriever_server.api.app import create_app

    first, second = two_indexes
    here = index_identity(first, None)
    assert here["documents"] == 3 and here["pages"] > 3 and len(here["version"]) == 16
    client = TestClient(create_app(first))
    served = from_server(client.get("/ready").json(), client.get("/health").json(), client.get("/documents").json(),
                         "http://retriever")
    assert served == here  # --index and --retriever-url of one index agree
    other = index_identity(second, None)
    assert (other["documents"], other["pages"]) == (here["documents"], here["pages"])
    assert other["version"] != here["version"]
    assert from_server(None, None, None, "http://x") == {"url": "http://x"}


def test_a_resume_against_another_index_is_refused(two_indexes, tmp_path, tiny_model_dir):
    from tests.rollout.test_converted_sets_roll_out import written_in
    from vrag_rollout.data import dataset

    first, second = two_indexes
    data = tmp_path / "vidoseek.parquet"
    dataset.convert_dataset(written_in("vidoseek", tmp_path), data, index_dir=first, source_format="vidoseek")
    run = dict(data=data, model=str(tiny_model_dir), protocol=Protocol(max_turns=2), limit=0, progress=False)
    out = tmp_path / "eval"
    run_evaluation(out, index=first, **run)  # the header only: no question rolled out
    run_evaluation(out, index=first, **run)  # the same index resumes
    with pytest.raises(JobInputError, match=r"another index\.version"):
        run_evaluation(out, index=second, **run)
