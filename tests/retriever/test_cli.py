from retriever_server.cli import _is_loopback, main
from retriever_server.store import PageStore


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
    assert main(["index", str(tmp_path / "nothing.pdf"), "--out", str(tmp_path / "idx")]) == 1
    assert "no such file" in capsys.readouterr().err


def test_serve_refuses_public_bind_without_key(tmp_path, capsys):
    assert main(["serve", "--index", str(tmp_path), "--host", "0.0.0.0"]) == 2
    assert "refusing to bind 0.0.0.0" in capsys.readouterr().err


def test_serve_reports_a_missing_index(tmp_path, capsys):
    assert main(["serve", "--index", str(tmp_path / "none")]) == 1
    assert "not an index directory" in capsys.readouterr().err


def test_loopback_detection():
    assert _is_loopback("127.0.0.1") and _is_loopback("::1") and _is_loopback("localhost")
    assert not _is_loopback("0.0.0.0") and not _is_loopback("10.1.2.3")
    assert not _is_loopback("example.com")


def test_queue_services_reaches_the_worker_processes(monkeypatch):
    from retriever_server import asgi
    from retriever_server.admission import AdmissionLimits
    from retriever_server.cli import build_parser

    serve = ["serve", "--index", "x"]
    assert build_parser().parse_args(serve).queue_services == AdmissionLimits.queue_services
    assert build_parser().parse_args([*serve, "--queue-services", "none"]).queue_services is None
    # serve passes limits to its workers through the environment
    monkeypatch.setenv(asgi.ENV_QUEUE_SERVICES, "None")
    assert asgi.admission_from_env().queue_services is None
    monkeypatch.setenv(asgi.ENV_QUEUE_SERVICES, "2.5")
    assert asgi.admission_from_env().queue_services == 2.5
