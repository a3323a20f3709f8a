"""A new user's first hour with the retriever (issue 24, item 7): what docs/retriever.md tells
them to type works as written, and what goes wrong says how to put it right.

- requests whose body is not sent as JSON, and malformed JSON, get errors that say what to do;
- ``vrag-retriever ... --help`` is plain text;
- answers are capped in size, with an error naming the limit and how to stay under it;
- the documented ``/ready`` answer is what a default server answers.

Running every command block of the doc is in ``test_doc_commands.py``.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import msgpack
import pytest
from fastapi.testclient import TestClient

from retriever_server import contract
from retriever_server.api.app import create_app
from retriever_server.api.testing import serve_in_thread
from retriever_server.cli import build_parser, main
from retriever_server.serving.limits import Limits

from .test_units import MemoryBackend

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "retriever.md"
SEARCH = {"query": ["assembly point"], "id": ["safety_manual"], "top_n": 1}


# ----------------------------------------------------------------- how the body is sent


@pytest.mark.parametrize("content_type", ["application/x-www-form-urlencoded",  # curl -d
                                          "text/plain", "application/msgpack"])
def test_a_body_not_sent_as_json_is_415_naming_the_header(client, content_type):
    r = client.post("/batch_search", content=json.dumps(SEARCH).encode(),
                    headers={"content-type": content_type})
    assert r.status_code == 415, r.text
    detail = r.json()["detail"]
    assert content_type in detail and "content-type: application/json" in detail
    assert "accept: application/msgpack" in detail  # where MessagePack does belong
    assert "valid dictionary" not in detail


def test_the_same_body_as_json_is_answered(client):
    r = client.post("/batch_search", content=json.dumps(SEARCH).encode(),
                    headers={"content-type": "application/json; charset=utf-8"})
    assert r.status_code == 200 and r.json()[0][0]["id"] == "safety_manual_4"


def test_reload_body_not_sent_as_json_is_415_too(client):
    r = client.post("/admin/reload", content=b'{"index": "x"}',
                    headers={"content-type": "text/plain"})
    assert r.status_code == 415 and "content-type: application/json" in r.json()["detail"]


@pytest.mark.parametrize("body, where", [
    (b'{"query": ["a"], "id": ["safety_manual"] "top_n": 1}', "line 1, column 42 (character 41)"),
    (b'{"query": ["a"],\n "id": ["safety_manual"],\n "top_n": }',
     "line 3, column 11 (character 53)"),
    (b'{"query": ["a"', "line 1, column 15 (character 14)"),
])
def test_malformed_json_names_line_and_column(client, body, where):
    r = client.post("/batch_search", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 422
    detail = r.json()["detail"]
    assert detail.startswith("malformed JSON in the request body") and where in detail, detail
    assert "body." not in detail  # no character offset posing as a field path


def test_field_errors_still_name_the_field(client):
    r = client.post("/batch_search", json={"query": "padlock", "id": ["safety_manual"]})
    assert r.status_code == 422 and "body.query: Input should be a valid list" in r.json()["detail"]


# ----------------------------------------------------------------- --help


COMMANDS = [[], ["index"], ["serve"], ["sample-corpus"]]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "top")
def test_help_is_plain_text(command, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([*command, "--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    # no reST markup: ``literals``, `roles`, "::" blocks, ".. directives"
    assert "`" not in text and "::" not in text and not re.search(r"^\s*\.\. ", text, re.M), text
    assert "usage: vrag-retriever" in text


@pytest.mark.parametrize("command", COMMANDS[1:], ids=lambda c: c[0])
def test_every_option_is_explained(command):
    sub = next(a for a in build_parser()._actions if a.dest == "command").choices[command[0]]
    assert sub.description, command
    unexplained = [a.option_strings or a.dest for a in sub._actions if not a.help]
    assert not unexplained


@pytest.mark.process
def test_the_installed_command_prints_the_same_plain_help():
    out = subprocess.run([str(Path(sys.executable).parent / "vrag-retriever"), "serve", "--help"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    assert "`" not in out and "--max-answer-mib" in out


# ----------------------------------------------------------------- answer size


def test_the_issue_batch_is_refused_before_any_work(sample_index):
    # 1,024 queries x top_n 50 answered 158 MB; now: 413 naming the limit and the way under it.
    app = create_app(sample_index)
    backend, searched = app.state.index.current.service.backend, []
    search = backend.search
    backend.search = lambda *args: searched.append(args) or search(*args)
    c = TestClient(app)
    r = c.post("/batch_search", json={"query": ["padlock"] * 1024, "id": "safety_manual",
                                      "top_n": 50})
    assert r.status_code == 413 and not searched
    detail = r.json()["detail"]
    assert "the limit is 64 MiB per answer" in detail and "--max-answer-mib" in detail
    assert "fewer queries per request" in detail and "smaller top_n" in detail
    assert "5,120 page images" in detail  # safety_manual has 5 pages: all 5 per query
    at_most = int(detail.split("at most about ")[1].split(" ")[0].replace(",", ""))
    ok = c.post("/batch_search", json={"query": ["padlock"] * at_most, "id": "safety_manual",
                                       "top_n": 50})
    assert ok.status_code == 200 and len(ok.content) <= 64 * 2**20  # the advice works


def _sizes(c, body, route="/batch_search"):
    plain = c.post(route, json=body)
    packed = c.post(route, json=body, headers={"accept": contract.MSGPACK})
    assert plain.status_code == packed.status_code == 200
    return len(plain.content), len(packed.content)


def test_the_limit_is_per_answer_format(sample_index):
    body = {"query": ["padlock"], "id": ["safety_manual"], "top_n": 50}
    as_json, as_msgpack = _sizes(TestClient(create_app(sample_index)), body)
    limit = (as_json + as_msgpack) // 2  # JSON's base64 is a third larger than the JPEG bytes
    c = TestClient(create_app(sample_index, limits=Limits(max_answer_bytes=limit)))
    refused = c.post("/batch_search", json=body)
    assert refused.status_code == 413 and "MessagePack" in refused.json()["detail"]
    assert c.post("/batch_search", json=body,
                  headers={"accept": contract.MSGPACK}).status_code == 200
    single = {**body, "query": "padlock", "id": "safety_manual"}
    assert c.post("/search", json=single).status_code == 413


def test_item_errors_are_not_counted_and_still_reported(sample_index):
    body = {"query": ["padlock"], "id": ["safety_manual"], "top_n": 50}
    as_json, _ = _sizes(TestClient(create_app(sample_index)), body)
    c = TestClient(create_app(sample_index, limits=Limits(max_answer_bytes=as_json + 4096)))
    r = c.post("/batch_search", json={
        "query": ["padlock", "", "padlock", "x" * 3000],
        "id": ["safety_manual", "safety_manual", "nope", "annual_report"], "top_n": 50})
    assert r.status_code == 200
    first, *errors = r.json()
    assert len(first) == 5
    assert [e[0]["code"] for e in errors] == ["malformed_query", "unknown_document",
                                              "malformed_query"]
    assert c.post("/batch_search", json={**body, "query": ["padlock"] * 2,
                                         "id": "safety_manual"}).status_code == 413


def test_fetches_are_bounded_too(sample_index):
    one = {"query": ["image, 1"], "id": "safety_manual"}
    as_json, _ = _sizes(TestClient(create_app(sample_index)), one, "/batch_fetch")
    c = TestClient(create_app(sample_index, limits=Limits(max_answer_bytes=3 * as_json)))
    r = c.post("/batch_fetch", json={"query": ["image, 1"] * 10, "id": "safety_manual"})
    assert r.status_code == 413 and "Fetch fewer pages per request" in r.json()["detail"]
    # text fetches and bad specs are not page images
    texts = c.post("/batch_fetch", json={"query": ["text, 1"] * 10 + ["image, 99", "5-th"],
                                         "id": "safety_manual"})
    assert texts.status_code == 200
    assert [i["id"] for i in texts.json()[-2:]] == ["error", "image, 5"]
    assert c.post("/fetch", json={"query": "image, 1", "id": "safety_manual"}).status_code == 200


def test_a_backend_that_cannot_bound_its_pages_is_measured():
    # MemoryBackend does not know its image sizes: the rendered answer is measured instead,
    # and refused whole, never cut short.
    backend = MemoryBackend({"d": ["alpha beta"] * 20})
    full = TestClient(create_app(backend)).post("/batch_search", json={"query": ["alpha"],
                                                                       "id": ["d"], "top_n": 20})
    assert full.status_code == 200 and len(full.json()[0]) == 20
    c = TestClient(create_app(backend, limits=Limits(max_answer_bytes=len(full.content) - 1)))
    r = c.post("/batch_search", json={"query": ["alpha"], "id": ["d"], "top_n": 20})
    assert r.status_code == 413 and f"is {len(full.content):,} bytes" in r.json()["detail"]
    packed = c.post("/batch_search", json={"query": ["alpha"], "id": ["d"], "top_n": 20},
                    headers={"accept": contract.MSGPACK})
    assert packed.status_code == 200 and len(msgpack.unpackb(packed.content)[0]) == 20


def test_serve_passes_the_answer_limit_to_its_workers(monkeypatch):
    from retriever_server.api import asgi

    args = build_parser().parse_args(["serve", "--index", "x"])
    assert args.max_answer_mib == Limits.max_answer_bytes / 2**20 == 64
    monkeypatch.setenv(asgi.ENV_MAX_ANSWER_BYTES, str(3 * 2**20))
    assert asgi.limits_from_env().max_answer_bytes == 3 * 2**20


# ----------------------------------------------------------------- /ready, as documented


def _documented(marker: str) -> dict:
    """The JSON on the doc's ``# -> `` line after the line containing ``marker``."""
    lines = DOC.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if marker in line)
    answer = next(line for line in lines[start:] if line.startswith("# -> "))
    return json.loads(answer.removeprefix("# -> "))


@pytest.mark.process
def test_the_documented_ready_answer_is_a_default_servers(sample_index):
    documented = _documented("curl -s localhost:8002/ready")
    with serve_in_thread(sample_index) as url:
        import requests

        live = requests.get(f"{url}/ready", timeout=10).json()
    assert documented.keys() == live.keys()
    assert documented["index_version"] == "<16 hex digits>" and len(live["index_version"]) == 16
    assert {k: v for k, v in documented.items() if k != "index_version"} == \
           {k: v for k, v in live.items() if k != "index_version"}
