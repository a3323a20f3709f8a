import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from retriever_server.cli import _is_loopback, main
from retriever_server.storage.store import PageStore


def test_sample_corpus_then_index(tmp_path, capsys):
    assert main(["sample-corpus", str(tmp_path / "corpus")]) == 0
    assert main(["index", str(tmp_path / "corpus"), "--out", str(tmp_path / "idx"),
                 "--max-pixels", str(256 * 28 * 28), "--min-pixels", str(128 * 28 * 28),
                 "--jpeg-quality", "70"]) == 0
    assert "indexed 3 document(s), 13 page(s)" in capsys.readouterr().out
    store = PageStore.open(tmp_path / "idx")
    entry = store.entry("product_guide", 1)
    assert entry.width * entry.height <= 256 * 28 * 28
    assert store.manifest.settings["jpeg_quality"] == 70


def test_index_errors_are_reported_not_raised(tmp_path, capsys):
    assert main(["index", str(tmp_path / "nothing.pdf"), "--out", str(tmp_path / "idx")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_serve_refuses_public_bind_without_key(tmp_path, capsys):
    assert main(["serve", "--index", str(tmp_path), "--host", "0.0.0.0"]) == 2
    assert "refusing to bind 0.0.0.0" in capsys.readouterr().err


def test_serve_reports_a_missing_index(tmp_path, capsys):
    # issue 33, item 10: a path that is not there is said to be not there, not to lack a manifest
    assert main(["serve", "--index", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'none'}: does not exist; build one with `vrag-retriever index DOCS --out" in err, err
    assert "manifest" not in err
    (tmp_path / "empty").mkdir()
    assert main(["serve", "--index", str(tmp_path / "empty")]) == 2
    assert "no manifest.json, so not a retriever index" in capsys.readouterr().err


def test_an_out_that_is_not_an_index_is_refused_naming_one_that_works(tmp_path, capsys):
    """Issue 33, item 5: `index DOCS --out DOCS` (what convert-dataset used to suggest for a folder
    of PDFs) is refused, and the --out the refusal names works as printed."""
    assert main(["sample-corpus", str(tmp_path / "mydocs")]) == 0
    capsys.readouterr()
    assert main(["index", str(tmp_path / "mydocs"), "--out", str(tmp_path / "mydocs")]) == 2
    err = capsys.readouterr().err
    assert "exists and is not an index" in err, err
    suggested = re.search(r"e\.g\. --out (\S+)", err)
    assert suggested, err
    out = shlex.split(suggested.group(1))[0]
    assert main(["index", str(tmp_path / "mydocs"), "--out", out]) == 0
    assert PageStore.open(Path(out)).documents()


def _serve_and_get(index, *extra) -> str:
    """What `vrag-retriever serve` writes on stdout while it answers GET /health and one search."""
    import httpx

    from .serving_helpers import free_port, wait_until

    port = free_port()
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen([sys.executable, "-m", "retriever_server.cli", "serve", "--index", str(index),
                                 "--port", str(port), *extra], stdout=log, stderr=subprocess.STDOUT)
        try:
            url = f"http://127.0.0.1:{port}"

            def up() -> bool:
                try:
                    return httpx.get(f"{url}/health", timeout=1).status_code == 200
                except httpx.TransportError:
                    return proc.poll() is not None  # stop waiting: the assertion below says why
            wait_until(up, timeout=60, what="the server")
            if proc.poll() is None:  # else it refused to start: its output says why
                httpx.post(f"{url}/batch_search", json={"query": ["padlock"], "id": ["safety_manual"],
                                                        "top_n": 1})
        finally:
            proc.terminate()
            proc.wait(timeout=30)
        log.seek(0)
        return log.read().decode(errors="replace")


@pytest.mark.process
def test_the_access_log_is_an_option(sample_index):
    """Issue 33, item 10: `serve --access-log` logs a line per request; off by default."""
    logged = _serve_and_get(sample_index, "--access-log")
    assert '"GET /health HTTP/1.1" 200' in logged and '"POST /batch_search HTTP/1.1" 200' in logged, logged
    quiet = _serve_and_get(sample_index)
    assert "Uvicorn running" in quiet and "HTTP/1.1" not in quiet, quiet


def test_loopback_detection():
    assert _is_loopback("127.0.0.1") and _is_loopback("::1") and _is_loopback("localhost")
    assert not _is_loopback("0.0.0.0") and not _is_loopback("10.1.2.3")
    assert not _is_loopback("example.com")


def test_queue_services_reaches_the_worker_processes(monkeypatch):
    from retriever_server.api import asgi
    from retriever_server.api.admission import AdmissionLimits
    from retriever_server.cli import build_parser

    serve = ["serve", "--index", "x"]
    assert build_parser().parse_args(serve).queue_services == AdmissionLimits.queue_services
    assert build_parser().parse_args([*serve, "--queue-services", "none"]).queue_services is None
    # serve passes limits to its workers through the environment
    monkeypatch.setenv(asgi.ENV_QUEUE_SERVICES, "None")
    assert asgi.admission_from_env().queue_services is None
    monkeypatch.setenv(asgi.ENV_QUEUE_SERVICES, "2.5")
    assert asgi.admission_from_env().queue_services == 2.5
