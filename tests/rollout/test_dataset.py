"""vrag-rollout convert-dataset (vrag_rollout.data.dataset): parquet contents, index report, malformed rows."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from retriever_server.storage.manifest import DocEntry, Manifest, PageEntry, image_name, write_manifest
from vrag_rollout.data import dataset, questions
from vrag_rollout.cli import main as cli_main
from vrag_rollout.data.prompts import AGENT_INSTRUCTIONS
from vrag_rollout.core.reward import score_response


def question(uid, file_name="report.pdf", pages=(3, 5), query="Who?", answer="Ada"):
    return {"uid": uid, "query": query, "reference_answer": answer,
            "meta_info": {"file_name": file_name, "reference_page": list(pages), "source": "x"}}


def write_jsonl(path: Path, rows) -> Path:
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


def make_index(tmp_path: Path, docs: dict) -> Path:
    index = tmp_path / "index"
    index.mkdir()
    doc_entries, pages = [], []
    for doc_id, count in docs.items():
        doc_entries.append(DocEntry(doc_id, f"{doc_id}.pdf", count, len(pages)))
        for page in range(1, count + 1):
            pages.append(PageEntry(doc_id, page, "", "pdf", image_name(len(pages)), 10, 10, 1))
    write_manifest(index, Manifest(doc_entries, pages, {}, {}))
    return index


def test_parquet_columns_and_values(tmp_path):
    src = write_jsonl(tmp_path / "qa.jsonl", [question("q1"), question(7, "dir/annual_2023.pdf", [1], "How much?", "12%")])
    report = dataset.convert_dataset(src, tmp_path / "out" / "train.parquet")
    table = pq.read_table(tmp_path / "out" / "train.parquet").to_pydict()
    assert list(table) == ["prompt", "answer", "doc_id", "gold_pages", "question_id"]
    assert table["doc_id"] == ["report", "annual_2023"]
    assert table["question_id"] == ["q1", "7"]
    assert table["prompt"][1] == AGENT_INSTRUCTIONS + "\nQuestion: How much?"
    assert json.loads(table["answer"][0]) == {"answer": "Ada", "doc_id": "report", "gold_pages": [3, 5]}
    assert json.loads(table["gold_pages"][1]) == [1]
    assert (report.rows, report.written, report.missing_documents) == (2, 2, [])
    # the answer column is the reward's ground truth as is
    assert score_response("<answer>Ada</answer>", table["answer"][0])["accuracy"] == 1.0


def test_zero_based_source_pages_are_written_one_based(tmp_path):
    src = write_jsonl(tmp_path / "qa.jsonl", [question("q", pages=[0, 4, 4])])
    dataset.convert_dataset(src, tmp_path / "t.parquet", page_base=0)
    assert json.loads(pq.read_table(tmp_path / "t.parquet").to_pydict()["gold_pages"][0]) == [1, 5]
    with pytest.raises(dataset.DatasetError, match=r"line 1: field 'meta_info.reference_page.0'"):
        dataset.convert_dataset(src, tmp_path / "t.parquet", page_base=1)


@pytest.mark.parametrize("row, where, field", [
    ({"uid": "a", "query": "q", "reference_answer": "r"}, "line 2", "meta_info"),
    ({"uid": "a", "query": "q", "reference_answer": "r", "meta_info": {"reference_page": [1]}},
     "line 2", "meta_info.file_name"),
    ({"uid": "a", "query": "", "reference_answer": "r", "meta_info": {"file_name": "f", "reference_page": []}},
     "line 2", "query"),
    ({"uid": "a", "query": "q", "reference_answer": "r", "meta_info": {"file_name": "f", "reference_page": ["3"]}},
     "line 2", "meta_info.reference_page.0"),
    ({"uid": "q1", "query": "q", "reference_answer": "r", "meta_info": {"file_name": "f", "reference_page": [1]}},
     "line 2", "uid"),
    ("[1, 2]", "line 2", "<row>"),
    ("{not json", "line 2", "<json>"),
])
def test_malformed_rows_name_line_and_field(tmp_path, row, where, field):
    src = write_jsonl(tmp_path / "qa.jsonl", [question("q1"), row])
    with pytest.raises(dataset.DatasetError) as caught:
        dataset.convert_dataset(src, tmp_path / "t.parquet")
    assert (caught.value.where, caught.value.field) == (where, field)
    assert not (tmp_path / "t.parquet").exists()  # nothing half-written


def test_json_array_errors_name_the_item(tmp_path):
    src = tmp_path / "qa.json"
    src.write_text(json.dumps([question("a"), question("b"), {"uid": "c"}], indent=2))
    with pytest.raises(dataset.DatasetError, match=r"item 3: field 'query'"):
        dataset.convert_dataset(src, tmp_path / "t.parquet")


def test_index_report_keeps_or_drops_and_lists_every_missing_question(tmp_path):
    index = make_index(tmp_path, {"report": 5})
    src = write_jsonl(tmp_path / "qa.jsonl", [question("a"), question("b", "other.pdf"), question("c", pages=[2])])
    report = dataset.convert_dataset(src, tmp_path / "keep.parquet", index_dir=index)
    assert [m["question_id"] for m in report.missing_documents] == ["b"]
    assert report.missing_documents[0]["where"] == "line 2"
    assert report.pages_out_of_range == []
    assert pq.read_table(tmp_path / "keep.parquet").num_rows == 3 and report.dropped == []

    report = dataset.convert_dataset(src, tmp_path / "drop.parquet", index_dir=index, drop_missing=True)
    assert pq.read_table(tmp_path / "drop.parquet").to_pydict()["question_id"] == ["a", "c"]
    assert (report.rows, report.written, report.dropped) == (3, 2, ["b"])
    with pytest.raises(ValueError, match="index"):
        dataset.convert_dataset(src, tmp_path / "x.parquet", drop_missing=True)


def test_cli(tmp_path, capsys):
    index = make_index(tmp_path, {"report": 9})
    src = write_jsonl(tmp_path / "qa.jsonl", [question("a"), question("b", "gone.pdf")])
    out, report = tmp_path / "train.parquet", tmp_path / "report.json"
    assert cli_main(["convert-dataset", str(src), "--out", str(out), "--index", str(index), "--report", str(report)]) == 0
    printed = capsys.readouterr()
    assert "wrote 2 of 2" in printed.out and "document 'gone'" in printed.err  # kept: the closing warning
    assert json.loads(report.read_text())["missing_documents"][0]["question_id"] == "b"
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"uid": 1}])
    assert cli_main(["convert-dataset", str(bad), "--out", str(out)]) == 2
    assert "line 1: field 'query'" in capsys.readouterr().err


def test_tool_call_prompts_carry_the_tool_call_instructions(tmp_path):
    from vrag_rollout.data.prompts import TOOL_CALL_INSTRUCTIONS

    src = write_jsonl(tmp_path / "qa.jsonl", [question("q1", query="How much?")])
    out = tmp_path / "tools.parquet"
    assert cli_main(["convert-dataset", str(src), "--out", str(out), "--action-format", "tool_call"]) == 0
    assert pq.read_table(out).to_pydict()["prompt"] == [TOOL_CALL_INSTRUCTIONS + "\nQuestion: How much?"]
    with pytest.raises(ValueError, match="action_format must be one of"):
        dataset.convert_dataset(src, out, action_format="json")


@pytest.mark.parametrize("action_format, taught", [("tags", "<crop>N, [x1, y1, x2, y2]</crop>"),
                                                   ("tool_call", "Call crop to look closer")])
def test_region_action_prompts_teach_the_region_action(tmp_path, action_format, taught):
    from vrag_rollout.data.prompts import instructions_for

    src = write_jsonl(tmp_path / "qa.jsonl", [question("q1", query="How much?")])
    plain, regions = tmp_path / "plain.parquet", tmp_path / "regions.parquet"
    assert cli_main(["convert-dataset", str(src), "--out", str(plain), "--action-format", action_format]) == 0
    assert cli_main(["convert-dataset", str(src), "--out", str(regions), "--action-format", action_format,
                     "--region-action"]) == 0
    (without,) = pq.read_table(plain).to_pydict()["prompt"]
    (with_regions,) = pq.read_table(regions).to_pydict()["prompt"]
    assert taught not in without and taught in with_regions
    assert with_regions == instructions_for(action_format, True) + "\nQuestion: How much?"
    assert instructions_for(action_format, True).startswith(instructions_for(action_format))


@pytest.mark.parametrize("action_format", ["tags", "tool_call"])
def test_read_questions_gives_back_what_was_converted(tmp_path, action_format):
    from vrag_rollout.data.prompts import TOOL_CALL_INSTRUCTIONS

    src = write_jsonl(tmp_path / "qa.jsonl", [question("q1", query="Who?\nQuestion: really?"),
                                              question("q2", "b.pdf", [2], "How much?", "12%"),
                                              question("q3")])
    dataset.convert_dataset(src, tmp_path / "train.parquet", action_format=action_format)
    samples, truths = questions.read_questions(tmp_path / "train.parquet", limit=2)
    instructions = TOOL_CALL_INSTRUCTIONS if action_format == "tool_call" else AGENT_INSTRUCTIONS
    assert [(s.question, s.doc_id, s.instructions) for s in samples] == [
        ("Who?\nQuestion: really?", "report", instructions), ("How much?", "b", instructions)]
    assert truths == [{"answer": "Ada", "doc_id": "report", "gold_pages": [3, 5]},
                      {"answer": "12%", "doc_id": "b", "gold_pages": [2]}]


def test_read_questions_refuses_a_file_that_is_not_a_converted_dataset(tmp_path):
    import pyarrow as pa

    pq.write_table(pa.table({"question": ["x"]}), tmp_path / "other.parquet")
    with pytest.raises(dataset.DatasetError, match="field 'answer,doc_id,prompt': no such column"):
        questions.read_questions(tmp_path / "other.parquet")
    pq.write_table(pa.table({"prompt": ["p\nQuestion: q"], "answer": ["{oops"], "doc_id": ["d"]}), tmp_path / "bad.parquet")
    with pytest.raises(dataset.DatasetError, match="row 1: field 'answer': not JSON"):
        questions.read_questions(tmp_path / "bad.parquet")


# --- issue 24, item 10: what a new user hits first


def test_a_json_object_file_is_named_and_the_data_wrapper_is_accepted(tmp_path, capsys):
    wrapped = {"version": "1.0", "data": [question("a"), question("b", "b.pdf", [2])]}
    for name, text in (("pretty.json", json.dumps(wrapped, indent=2)), ("flat.json", json.dumps(wrapped))):
        (tmp_path / name).write_text(text)
        dataset.convert_dataset(tmp_path / name, tmp_path / "t.parquet")
        assert pq.read_table(tmp_path / "t.parquet").to_pydict()["question_id"] == ["a", "b"]
    # errors inside the wrapper name the item, as in an array
    (tmp_path / "bad.json").write_text(json.dumps({"data": [question("a"), {"uid": "c"}]}, indent=2))
    with pytest.raises(dataset.DatasetError, match=r"item 2: field 'query'"):
        dataset.convert_dataset(tmp_path / "bad.json", tmp_path / "t.parquet")
    # any other object: say what it is and what is expected, not "not valid JSON"
    (tmp_path / "other.json").write_text(json.dumps({"questions": [question("a")], "split": "train"}, indent=2))
    with pytest.raises(dataset.DatasetError) as caught:
        dataset.convert_dataset(tmp_path / "other.json", tmp_path / "o.parquet")
    message = str(caught.value)
    assert "one JSON object" in message and "'questions'" in message and "not valid JSON" not in message
    assert "JSON array of questions" in message and "JSON Lines" in message and '{"data": [...]}' in message
    assert not (tmp_path / "o.parquet").exists()
    (tmp_path / "flat_other.json").write_text(json.dumps({"questions": [question("a")]}))
    with pytest.raises(dataset.DatasetError, match=r"line 1: field '<json>': the file is one JSON object"):
        dataset.convert_dataset(tmp_path / "flat_other.json", tmp_path / "o.parquet")
    # a one-line file holding one question is still JSON Lines of one row
    write_jsonl(tmp_path / "one.jsonl", [question("solo")])
    dataset.convert_dataset(tmp_path / "one.jsonl", tmp_path / "t.parquet")
    assert pq.read_table(tmp_path / "t.parquet").to_pydict()["question_id"] == ["solo"]
    # a pretty-printed question is one object too: the error says one question per line
    (tmp_path / "q.json").write_text(json.dumps(question("q"), indent=2))
    with pytest.raises(dataset.DatasetError, match="one question object per line"):
        dataset.convert_dataset(tmp_path / "q.json", tmp_path / "t.parquet")


@pytest.mark.parametrize("text", ["", "\n \n", "[]", '{"data": []}'])
def test_an_empty_input_is_refused_and_nothing_is_written(tmp_path, capsys, text):
    src = tmp_path / "qa.json"
    src.write_text(text)
    out = tmp_path / "t.parquet"
    with pytest.raises(dataset.DatasetError, match="no questions"):
        dataset.convert_dataset(src, out)
    assert cli_main(["convert-dataset", str(src), "--out", str(out)]) == 2
    assert "no questions" in capsys.readouterr().err
    assert not out.exists()


def test_a_conversion_that_drops_every_question_is_refused(tmp_path, capsys):
    index = make_index(tmp_path, {"other": 3})
    src = write_jsonl(tmp_path / "qa.jsonl", [question("a"), question("b")])
    with pytest.raises(dataset.DatasetError, match=r"no questions left: all 2 dropped"):
        dataset.convert_dataset(src, tmp_path / "t.parquet", index_dir=index, drop_missing=True)
    assert not (tmp_path / "t.parquet").exists()


def test_numeric_answers_are_written_as_their_source_text(tmp_path):
    rows = [question("i", answer=12), question("f", answer=3.5), question("z", answer=3.50), question("e", answer=-7)]
    lines = [json.dumps(r) for r in rows]
    lines[2] = lines[2].replace("3.5", "3.50")  # json.dumps would write 3.5: keep the source's own text
    src = write_jsonl(tmp_path / "qa.jsonl", lines)
    dataset.convert_dataset(src, tmp_path / "t.parquet")
    answers = [json.loads(a)["answer"] for a in pq.read_table(tmp_path / "t.parquet").to_pydict()["answer"]]
    assert answers == ["12", "3.5", "3.50", "-7"]
    # the same in a JSON array
    (tmp_path / "qa.json").write_text("[" + ",\n".join(lines) + "]")
    dataset.convert_dataset(tmp_path / "qa.json", tmp_path / "t.parquet")
    assert [json.loads(a)["answer"] for a in pq.read_table(tmp_path / "t.parquet").to_pydict()["answer"]] == answers


@pytest.mark.parametrize("value, words", [(True, "true or false"), ([1, 2], "got a list"), ({"a": 1}, "got an object"),
                                          (None, "got null")])
def test_answers_that_are_not_text_or_numbers_name_line_and_field(tmp_path, value, words):
    src = write_jsonl(tmp_path / "qa.jsonl", [question("a"), question("b", answer=value)])
    with pytest.raises(dataset.DatasetError) as caught:
        dataset.convert_dataset(src, tmp_path / "t.parquet")
    assert (caught.value.where, caught.value.field) == ("line 2", "reference_answer")
    assert words in caught.value.message
    assert not (tmp_path / "t.parquet").exists()


def test_gold_pages_past_the_document_end_are_refused_or_dropped(tmp_path, capsys):
    index = make_index(tmp_path, {"report": 4})
    src = write_jsonl(tmp_path / "qa.jsonl", [question("c", pages=[2]), question("a", pages=[3, 5])])
    with pytest.raises(dataset.DatasetError) as caught:
        dataset.convert_dataset(src, tmp_path / "t.parquet", index_dir=index)
    assert (caught.value.where, caught.value.field) == ("line 2", "meta_info.reference_page.1")
    assert "page 5" in caught.value.message and "'report'" in caught.value.message and "4 pages" in caught.value.message
    assert not (tmp_path / "t.parquet").exists()
    # a 0-based source names its own page number and the 1-based one it stands for
    zero = write_jsonl(tmp_path / "zero.jsonl", [question("z", pages=[0, 4])])
    with pytest.raises(dataset.DatasetError, match=r"page 4 \(page 5 counted from 1\)"):
        dataset.convert_dataset(zero, tmp_path / "t.parquet", index_dir=index, page_base=0)
    # drop_missing leaves such a question out, and lists it
    report = dataset.convert_dataset(src, tmp_path / "t.parquet", index_dir=index, drop_missing=True)
    assert pq.read_table(tmp_path / "t.parquet").to_pydict()["question_id"] == ["c"]
    assert report.dropped == ["a"]
    assert report.pages_out_of_range == [{"question_id": "a", "doc_id": "report", "pages": [3, 5], "num_pages": 4,
                                          "where": "line 2"}]
    assert cli_main(["convert-dataset", str(src), "--out", str(tmp_path / "t.parquet"), "--index", str(index)]) == 2
    assert "line 2: field 'meta_info.reference_page.1'" in capsys.readouterr().err
    assert cli_main(["convert-dataset", str(src), "--out", str(tmp_path / "t.parquet"), "--index", str(index),
                     "--drop-missing"]) == 0
    assert "dropped: line 2: question a: gold page(s) [5] past the end of 'report' (4 pages)" in capsys.readouterr().out


def test_a_page_below_the_base_suggests_the_page_base(tmp_path):
    src = write_jsonl(tmp_path / "qa.jsonl", [question("q", pages=[0, 4])])
    with pytest.raises(dataset.DatasetError, match="--page-base 0"):
        dataset.convert_dataset(src, tmp_path / "t.parquet")


def test_a_bad_index_path_is_named_and_explained(tmp_path, capsys):
    src = write_jsonl(tmp_path / "qa.jsonl", [question("a")])
    out = tmp_path / "t.parquet"
    (tmp_path / "empty").mkdir()
    (tmp_path / "file").write_text("x")
    for index, words in ((tmp_path / "nowhere", "does not exist"), (tmp_path / "file", "not a directory"),
                         (tmp_path / "empty", "no manifest.json")):
        assert cli_main(["convert-dataset", str(src), "--out", str(out), "--index", str(index)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"convert-dataset: --index {index}: ") and words in err, err
        assert str(src) not in err  # the source file is fine: do not blame it
        with pytest.raises(dataset.IndexDirError, match=words):
            dataset.index_documents(index)
    assert "vrag-retriever index" in err
    assert not out.exists()


def test_a_byte_order_mark_is_read_and_other_numbers_stay_strict(tmp_path):
    src = tmp_path / "qa.json"
    src.write_bytes(b"\xef\xbb\xbf" + json.dumps([question("a")]).encode())  # as Windows tools save it
    dataset.convert_dataset(src, tmp_path / "t.parquet")
    assert pq.read_table(tmp_path / "t.parquet").num_rows == 1
    # numbers are kept as their source text for the answer only: pages and uids stay integers
    for row, field in (('{"uid": "a", "query": "q", "reference_answer": "r", '
                        '"meta_info": {"file_name": "f", "reference_page": [3.0]}}', "meta_info.reference_page.0"),
                       ('{"uid": 1.5, "query": "q", "reference_answer": "r", '
                        '"meta_info": {"file_name": "f", "reference_page": [3]}}', "uid")):
        with pytest.raises(dataset.DatasetError) as caught:
            dataset.convert_dataset(write_jsonl(tmp_path / "f.jsonl", [row]), tmp_path / "t.parquet")
        assert (caught.value.where, caught.value.field) == ("line 1", field)


def test_with_an_index_each_row_records_its_documents_page_count(tmp_path):
    index = make_index(tmp_path, {"report": 5, "deck": 12})
    src = write_jsonl(tmp_path / "qa.jsonl", [question("a"), question("b", "deck.pdf", [12]), question("c", "gone.pdf")])
    dataset.convert_dataset(src, tmp_path / "t.parquet", index_dir=index)
    table = pq.read_table(tmp_path / "t.parquet")
    assert table.to_pydict()["page_count"] == [5, 12, None]  # None: the index lacks that document
    assert str(table.schema.field("page_count").type) == "int64"
    dataset.convert_dataset(src, tmp_path / "plain.parquet")
    assert "page_count" not in pq.read_table(tmp_path / "plain.parquet").column_names


def test_a_validation_split_is_stable_disjoint_and_complete(tmp_path, capsys):
    rows = [question(f"q{k}", f"doc{k % 7}.pdf", [1]) for k in range(200)]
    src = write_jsonl(tmp_path / "qa.jsonl", rows)
    shuffled = write_jsonl(tmp_path / "shuffled.jsonl", rows[::-1])
    train, val = tmp_path / "train.parquet", tmp_path / "val.parquet"
    assert cli_main(["convert-dataset", str(src), "--out", str(train), "--val-out", str(val),
                     "--val-fraction", "0.2"]) == 0
    assert "to " + str(val) in capsys.readouterr().out
    ids = {name: pq.read_table(path).to_pydict()["question_id"] for name, path in (("train", train), ("val", val))}
    assert not set(ids["train"]) & set(ids["val"]) and sorted(ids["train"] + ids["val"]) == sorted(r["uid"] for r in rows)
    assert 20 <= len(ids["val"]) <= 60  # about a fifth of 200
    assert ids["train"] == [r["uid"] for r in rows if r["uid"] in set(ids["train"])]  # input order kept
    dataset.convert_dataset(shuffled, tmp_path / "t2.parquet", val_out=tmp_path / "v2.parquet", val_fraction=0.2)
    assert set(pq.read_table(tmp_path / "v2.parquet").to_pydict()["question_id"]) == set(ids["val"])  # order-free
    # by document: every document's questions on one side only
    dataset.convert_dataset(src, tmp_path / "t3.parquet", val_out=tmp_path / "v3.parquet", val_fraction=0.3,
                            split_of="document")
    train_docs = set(pq.read_table(tmp_path / "t3.parquet").to_pydict()["doc_id"])
    val_docs = set(pq.read_table(tmp_path / "v3.parquet").to_pydict()["doc_id"])
    assert train_docs and val_docs and not train_docs & val_docs and train_docs | val_docs == {f"doc{k}" for k in range(7)}


def test_a_split_that_leaves_one_side_empty_is_refused(tmp_path, capsys):
    src = write_jsonl(tmp_path / "qa.jsonl", [question("only")])
    assert cli_main(["convert-dataset", str(src), "--out", str(tmp_path / "t.parquet"), "--val-out",
                     str(tmp_path / "v.parquet"), "--val-fraction", "0.5"]) == 2
    assert "leaves no" in capsys.readouterr().err
    assert not (tmp_path / "t.parquet").exists() and not (tmp_path / "v.parquet").exists()
    assert cli_main(["convert-dataset", str(src), "--out", str(tmp_path / "t.parquet"), "--val-out",
                     str(tmp_path / "v.parquet"), "--val-fraction", "1.5"]) == 2
