"""The named protocols end to end on the tiny model, over a merged corpus of two converted sets
(ViDoSeek's and MMLongBench-Doc's layouts, questions about the sample corpus, merged with
`convert-dataset --merge` against one index of every document): each protocol's report names every
setting and every override; the coverage, first-hit turn and efficiency numbers of every record
equal counts taken here from the saved batches alone (loss mask, turn ids, page ids, the saved
images' sizes, the sampled text, the batch's wall time), not through the evaluation's code; two
runs under two protocols compare with their differences named and no difference column."""

from __future__ import annotations

import json
import math

import pytest

from tests.evaluation.test_evaluate_job import converted, records_of
from vrag_rollout.cli import main
from vrag_rollout.devkit.evaluate_job import compare_runs, run_evaluation
from vrag_rollout.evaluation.protocols import named
from vrag_rollout.verify.saved_batch import load_rollout

SETS = ("vidoseek", "mmlongbench-doc")


@pytest.fixture(scope="module")
def sample_index():
    from vrag_rollout.devkit.demo import cache_dir, prepare_index

    return prepare_index(cache_dir())


@pytest.fixture(scope="module")
def merged(tmp_path_factory, sample_index):
    tmp = tmp_path_factory.mktemp("merged")
    sources = []
    for layout in SETS:
        folder = tmp / layout
        folder.mkdir()
        sources.append(converted(layout, folder, sample_index)[0])
    out = tmp / "merged.parquet"
    assert main(["convert-dataset", str(sources[0]), "--merge", str(sources[1]), "--out", str(out),
                 "--index", str(sample_index)]) == 0
    return out


@pytest.fixture(scope="module")
def runs(merged, sample_index, tiny_model_dir, tiny_llm, tmp_path_factory):
    """Each protocol's run over the merged file (vrag-rl with one override), judged by the tiny model."""
    base = tmp_path_factory.mktemp("runs")
    done = {}
    for name, overrides in (("vrag-rl", {"max_turns": 2, "response_length": 512}),
                            ("document", {"max_turns": 2, "response_length": 512}),
                            ("own", {"max_turns": 2, "response_length": 512})):
        out = base / name
        judge = dict(judge_model=str(tiny_model_dir), judge_llm=tiny_llm) if name == "vrag-rl" else {}
        report = run_evaluation(out, data=merged, model=str(tiny_model_dir), index=sample_index, grammar=True,
                                protocol=named(name, overrides), batch_size=4, llm=tiny_llm, progress=False,
                                **judge)
        done[name] = (out, report)
    return done


def test_the_merged_file_keeps_each_rows_set_document_and_origin(merged):
    import pyarrow.parquet as pq

    table = pq.read_table(merged)
    rows = table.to_pylist()
    assert len(rows) == 4 and all(row["doc_id"] is None for row in rows)
    infos = [json.loads(row["eval"]) for row in rows]
    assert sorted({info["set"] for info in infos}) == sorted(SETS)
    assert {info["origin"]["file"] for info in infos} == {"vidoseek.parquet", "mmlongbench-doc.parquet"}
    for row, info in zip(rows, infos):  # each gold page a (document, page) pair of the row's own document
        assert all(doc == info["document"] for doc, _ in json.loads(row["gold_pages"]))
        assert row["question_id"].split("/")[0] == info["origin"]["file"].removesuffix(".parquet")
    meta = json.loads(table.schema.metadata[b"vrag_merge"])
    assert set(meta["documents_by_origin"]) == {"vidoseek.parquet", "mmlongbench-doc.parquet"}


def test_each_protocol_runs_and_its_report_names_every_setting(runs):
    for name, (out, report) in runs.items():
        protocol = report["header"]["protocol"]
        assert protocol["name"] == name and protocol["max_turns"] == 2
        assert protocol["overrides"] == {"max_turns": 4, "response_length": 1024}
        text = (out / "report.md").read_text()
        for key, value in protocol.items():
            assert f"`{key}`" in text, (name, key)
        assert f"`name`: {name}:" in text and "2 (overrides " + name + "'s 4)" in text
        assert "`overrides`: max_turns, response_length" in text
        records = records_of(out)
        assert len(records) == 4 and {r["set"] for r in records} == set(SETS)
        expected_scope = {"vrag-rl": "corpus", "document": "document", "own": "corpus"}[name]
        assert {r["scope"] for r in records} == {expected_scope}
        for column in ("gold shown", "first hit turn", "| mean |", "| p90 |", "sampled tokens", "retriever calls"):
            assert column in text, (name, column)
    vrag = runs["vrag-rl"][1]["header"]["protocol"]
    assert vrag["search_required"] is True and vrag["judge"]["prompt_version"] == "vrag-rl-criteria-1"
    assert runs["document"][1]["header"]["protocol"]["search_required"] is False


def observation_blocks(loss, attention, turn_ids):
    """(turn id) of each maximal run of attended, loss-masked-out response tokens."""
    blocks, inside = [], False
    for mask, used, turn in zip(loss, attention, turn_ids):
        if used and not mask:
            if not inside:
                blocks.append(int(turn))
            inside = True
        else:
            inside = False
    return blocks


def counted_from_batch(saved, row: int, gold: set) -> dict:
    """Coverage and costs of one saved episode, from the saved batch alone."""
    width = saved.tensors["responses"].shape[1]
    loss = saved.tensors["loss_mask"][row].tolist()
    attention = saved.tensors["attention_mask"][row, -width:].tolist()
    turn_ids = saved.tensors["turn_ids"][row].tolist()
    blocks = observation_blocks(loss, attention, turn_ids)
    pages = saved.columns["page_ids"][row]
    assert len(pages) == len(blocks)  # one page list per observation
    hits = [turn for turn, shown in zip(blocks, pages) if set(shown) & gold]
    factor = saved.pixel_band["patch_size"] * saved.pixel_band["merge_size"]
    visual = sum((image.width // factor) * (image.height // factor) for image in saved.decoded_images(row))
    # the actions the retriever answered: those of turns an observation followed (an action of the last
    # turn, written when the turns ran out, was never sent)
    sampled = "".join(saved.token_text[t] for t, m, turn in zip(saved.tensors["responses"][row].tolist(), loss, turn_ids)
                      if m and turn in blocks)
    return {"gold_shown": bool(hits), "first_turn": min(hits) if hits else None,
            "turns": max(turn for turn, used in zip(turn_ids, attention) if used),
            "sampled_tokens": sum(loss), "visual_tokens": visual,
            "retriever_calls": sampled.count("</search>") + sampled.count("</fetch>"),
            "seconds": saved.columns["episode_seconds"][row]}


def test_coverage_first_hit_and_costs_equal_counts_from_the_saved_batches(runs):
    checked = shown = 0
    for out, report in runs.values():
        records = records_of(out)
        for record in records:
            saved = load_rollout((out / record["episode"]["batch"]).with_suffix(".pt"))
            row = record["episode"]["row"]
            truth = json.loads(saved.columns["ground_truth"][row])
            gold = {f"{g[0]}_{g[1]}" if isinstance(g, list) else f"{truth['doc_id']}_{g}"
                    for g in truth["gold_pages"]}
            found = counted_from_batch(saved, row, gold)
            assert record["coverage"] == {"gold_shown": found["gold_shown"], "first_turn": found["first_turn"]}
            cost = record["efficiency"]
            for name in ("turns", "sampled_tokens", "visual_tokens", "retriever_calls"):
                assert cost[name] == found[name], (name, record["question_id"])
            assert cost["seconds"] == pytest.approx(found["seconds"])
            # its own latency: within its batch's rollout time, which the slowest episode sets
            assert 0 < cost["seconds"] <= saved.metrics["rollout/seconds"]
            checked += 1
            shown += found["gold_shown"]
        for name, bench in report["benchmarks"].items():  # the report's split and means from the records
            mine = [r for r in records if r["set"] == name]
            parts = bench["by_coverage"]
            assert parts["gold shown"]["counted"] == sum(r["coverage"]["gold_shown"] for r in mine)
            assert parts["never shown"]["counted"] == sum(not r["coverage"]["gold_shown"] for r in mine)
            sampled = sorted(r["efficiency"]["sampled_tokens"] for r in mine)
            assert bench["efficiency"]["sampled_tokens"]["mean"] == pytest.approx(sum(sampled) / len(sampled))
            assert bench["efficiency"]["sampled_tokens"]["p90"] == sampled[math.ceil(0.9 * len(sampled)) - 1]
    assert checked == 12 and shown > 0  # document scope shows its own document's pages: some gold page


def test_two_protocols_compare_with_their_differences_named_and_no_difference_column(runs):
    vrag, document = runs["vrag-rl"][0], runs["document"][0]
    text = compare_runs(vrag, document)
    assert "Different protocols: protocol.name, protocol.scope, protocol.search_required" in text.replace(
        "protocol.judge, ", "")
    assert "`protocol.scope`: 'corpus' in vrag-rl, 'document' in document" in text
    assert "B - A" not in text and "## vidoseek" in text and "## mmlongbench-doc" in text
    same = compare_runs(document, document)
    assert "Same protocol" in same and "accuracy B - A" in same and "| all | 2 | 2 |" in same
