"""The vrag-retriever command: index documents, serve an index, write the sample corpus.

Its help is plain text (argparse prints it as written, no markup): each subcommand has a
description and every option a help line saying its default.

Exit status, as `vrag-rollout`'s (README.md): 0 done; 2 a usage error (argparse's message with
the usage line) or an expected user error (a missing or unreadable path, a bad index, an option
value out of range, nothing that could be indexed), said in one line, `vrag-retriever COMMAND:
error: ...`, without a traceback or usage line. Anything else is a bug and keeps its traceback.
`index` leaving out files it cannot read is not an error: each is named on stderr after the
summary, and recorded in the index's manifest (`--unreadable fail` makes the first one an error).
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import sys
from pathlib import Path

from .api.admission import AdmissionLimits
from .serving.answer_size import LIMIT_OPTION, MIB
from .serving.cache import PRELOAD_FORMS
from .serving.limits import Limits
from .storage.imaging import DEFAULT_DPI, DEFAULT_JPEG_QUALITY, DEFAULT_MAX_PIXELS, DEFAULT_MIN_PIXELS, PATCH

DESCRIPTION = """\
vrag-retriever: a page-image retriever for visual document RAG. It indexes PDFs and
page images, searches the whole corpus, a set of documents or one document per query
(the request's id), and serves the pages over HTTP.

quick start (each command has its own --help):
  vrag-retriever sample-corpus corpus/
  vrag-retriever index corpus/ --out index/
  vrag-retriever serve --index index/

The HTTP API, the index format and the limits are described in docs/retriever.md.
"""


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions as written (line breaks kept); option help wrapped."""


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _services(text: str) -> float | None:
    return None if text.lower() == "none" else float(text)


def _require(ok: bool, option: str, rule: str, value) -> None:
    """An option value argparse accepted but the command cannot use: one line naming the option."""
    if not ok:
        raise ValueError(f"{option} must be {rule}, got {value}")


def _check_index_values(args) -> None:
    _require(18 <= args.dpi <= 600, "--dpi", "in 18..600", args.dpi)
    _require(1 <= args.jpeg_quality <= 95, "--jpeg-quality", "in 1..95", args.jpeg_quality)
    _require(PATCH * PATCH <= args.min_pixels, "--min-pixels", f"at least {PATCH * PATCH}", args.min_pixels)
    _require(args.min_pixels <= args.max_pixels, "--max-pixels", f"at least --min-pixels ({args.min_pixels})",
             args.max_pixels)
    _require(args.workers is None or args.workers >= 1, "--workers", "at least 1", args.workers)


def _cmd_index(args) -> int:
    from .indexing.indexer import build_index
    from .indexing.ingest import UnreadableDocument

    _check_index_values(args)
    try:
        out = build_index([Path(s) for s in args.sources], Path(args.out), min_pixels=args.min_pixels,
                          max_pixels=args.max_pixels, jpeg_quality=args.jpeg_quality, ocr=args.ocr,
                          dpi=args.dpi, workers=args.workers, encoder=args.encoder,
                          backend=args.backend, qdrant_url=args.qdrant_url, search=args.search,
                          unreadable=args.unreadable)
    except UnreadableDocument as exc:  # --unreadable fail
        raise ValueError(f"{exc}; nothing written (--unreadable skip leaves such a file out and goes on)") from exc
    from .storage.store import PageStore

    store = PageStore.open(out)
    docs, info, skipped = store.documents(), store.manifest.backend, store.manifest.skipped
    how = info["kind"] if info["kind"] == "bm25" else f"{info['kind']}, {info['search']}, " \
                                                      f"{info['encoder']['fingerprint']}"
    left_out = (f"; skipped {len(skipped)} file(s) that could not be read (named on stderr, and in "
                f"{out / 'manifest.json'} under \"skipped\")") if skipped else ""
    print(f"indexed {len(docs)} document(s), {sum(docs.values())} page(s) into {out} ({how}){left_out}",
          flush=True)
    for entry in skipped:  # at the end, where they are seen
        print(f"vrag-retriever index: skipped {entry['source']}: {entry['reason']}", file=sys.stderr)
    return 0


def _check_serve_values(args) -> None:
    _require(0 <= args.port <= 65535, "--port", "in 0..65535", args.port)
    for option, value in (("--workers", args.workers), ("--max-in-flight", args.max_in_flight),
                          ("--threads", args.threads)):
        _require(value >= 1, option, "at least 1", value)
    _require(args.max_queue >= 0, "--max-queue", "at least 0", args.max_queue)
    for option, value in (("--max-wait", args.max_wait), (LIMIT_OPTION, args.max_answer_mib)):
        _require(value > 0, option, "above 0", value)
    _require(args.queue_services is None or args.queue_services > 0, "--queue-services", "above 0 (or none)",
             args.queue_services)
    _require(args.follow_index >= 0, "--follow-index", "at least 0", args.follow_index)


def _cmd_serve(args) -> int:
    import uvicorn

    from .api import asgi

    _check_serve_values(args)
    api_key = args.api_key or os.environ.get(asgi.ENV_API_KEY) or None
    if not _is_loopback(args.host) and api_key is None and not args.allow_public:
        raise ValueError(f"refusing to bind {args.host} without an API key: pass --api-key (or set "
                         f"{asgi.ENV_API_KEY}), or --allow-public-without-key if you really mean it")
    from .storage.manifest import read_manifest
    from .indexing.suggest import no_index_at
    from .storage.swap import recover

    recover(Path(args.index))  # finish or undo a re-index swap that a crash interrupted
    problem = no_index_at(Path(args.index))  # what is there instead, and the command that builds one
    if problem is not None:
        raise FileNotFoundError(f"{args.index}: {problem}")
    manifest = read_manifest(Path(args.index))  # fail fast, in this process, on a bad index dir
    from .encoders import ENV_ENCODER, resolve_encoder

    # Refuse an index built for another encoder (or none) before any worker starts.
    resolve_encoder(manifest.backend, args.encoder)
    if args.workers > 1 and "path" in manifest.backend.get("qdrant", {}):
        raise ValueError("this index keeps its vectors in Qdrant local mode, which one process "
                         "can open; serve it with --workers 1 (or index with --qdrant-url)")
    if args.encoder:  # the worker processes check it again when they open the index
        os.environ[ENV_ENCODER] = args.encoder
    os.environ[asgi.ENV_INDEX] = str(Path(args.index).absolute())
    os.environ[asgi.ENV_PRELOAD] = args.preload or "0"
    os.environ[asgi.ENV_MAX_IN_FLIGHT] = str(args.max_in_flight)
    os.environ[asgi.ENV_MAX_QUEUE] = str(args.max_queue)
    os.environ[asgi.ENV_MAX_WAIT] = str(args.max_wait)
    os.environ[asgi.ENV_THREADS] = str(args.threads)
    os.environ[asgi.ENV_QUEUE_SERVICES] = str(args.queue_services)
    os.environ[asgi.ENV_FOLLOW] = str(args.follow_index)
    os.environ[asgi.ENV_MAX_ANSWER_BYTES] = str(int(args.max_answer_mib * MIB))
    asgi.admission_from_env()  # fail fast on bad limits
    asgi.limits_from_env()
    if api_key:
        os.environ[asgi.ENV_API_KEY] = api_key
    # The factory form lets --workers start several processes, each with its own index copy.
    uvicorn.run("retriever_server.api.asgi:app_from_env", factory=True, host=args.host, port=args.port,
                workers=args.workers, log_level=args.log_level, access_log=args.access_log)
    return 0


def _cmd_sample_corpus(args) -> int:
    from .sample_corpus import write_sample_corpus

    for path in write_sample_corpus(Path(args.out_dir)):
        print(path)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vrag-retriever", description=DESCRIPTION,
                                     formatter_class=_HelpFormatter)
    sub = parser.add_subparsers(title="commands", dest="command", required=True,
                                metavar="COMMAND")

    def command(name: str, summary: str, description: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=summary, description=description,
                              formatter_class=_HelpFormatter)

    p = command("index", "index PDFs, folders of PDFs, folders of page images", """\
Index documents into INDEX_DIR: page text (PDF text layer, else OCR), BM25 over it,
and every page rendered once to a JPEG that serving sends as is. The index is
built beside INDEX_DIR and swapped in when complete; re-running replaces it.
A file that cannot be read is left out and named at the end (see --unreadable).

examples:
  vrag-retriever index report.pdf manuals/ scans/contract_17/ --out index/
  vrag-retriever index manuals/ --out index/ --encoder colqwen2:/models/colqwen2""")
    p.add_argument("sources", nargs="+", metavar="SRC",
                   help="a PDF, a folder of page images (one document), or a folder of PDFs "
                        "and image folders; doc ids are file stems and folder names")
    p.add_argument("--out", required=True, metavar="INDEX_DIR",
                   help="the index directory to write (replaced atomically if it exists)")
    p.add_argument("--min-pixels", type=int, default=DEFAULT_MIN_PIXELS,
                   help="smallest page image, in pixels (default %(default)s = 512*28*28)")
    p.add_argument("--max-pixels", type=int, default=DEFAULT_MAX_PIXELS,
                   help="largest page image, in pixels (default %(default)s = 1280*28*28)")
    p.add_argument("--jpeg-quality", type=int, default=DEFAULT_JPEG_QUALITY,
                   help="JPEG quality of the stored pages (default %(default)s)")
    p.add_argument("--dpi", type=float, default=DEFAULT_DPI,
                   help="PDF render resolution before fitting into the pixel band "
                        "(default %(default)s)")
    p.add_argument("--ocr", choices=("auto", "on", "off"), default="auto",
                   help="OCR pages without a text layer with tesseract (auto: when installed)")
    p.add_argument("--workers", type=int, default=None,
                   help="ingest processes (default: one per CPU for 64+ pages)")
    p.add_argument("--encoder", default=None, metavar="NAME:PATH",
                   help="dense page encoder from a local checkpoint, e.g. colqwen2:/models/colqwen2")
    p.add_argument("--backend", choices=("bm25", "qdrant"), default=None,
                   help="search engine (default: qdrant with --encoder, else bm25)")
    p.add_argument("--qdrant-url", default=None, metavar="URL",
                   help="Qdrant server (default: Qdrant local mode inside the index directory)")
    p.add_argument("--search", choices=("hybrid", "dense"), default=None,
                   help="with qdrant: fuse BM25 and dense ranks (hybrid, default) or dense only")
    p.add_argument("--unreadable", choices=("skip", "fail"), default="skip",
                   help="a file that cannot be read (a corrupt, encrypted or empty PDF, a broken page "
                        "image): skip leaves it out, goes on, names it at the end and records it in "
                        "the manifest; fail stops there and writes nothing (default %(default)s; "
                        "with none readable, nothing is written either way and the exit status is 2)")
    p.set_defaults(func=_cmd_index)

    p = command("serve", "serve an index over HTTP", """\
Serve INDEX_DIR over HTTP (POST /batch_search, /batch_fetch, /batch_crop, /search, /fetch;
GET /health, /ready, /metrics, /documents; the schema at GET /docs).

example:
  vrag-retriever serve --index index/
  curl -s localhost:8002/batch_search -H 'content-type: application/json' \\
    -d '{"query": ["lockout tagout padlock"], "id": ["safety_manual"], "top_n": 1}'""")
    p.add_argument("--index", required=True, metavar="INDEX_DIR",
                   help="the index directory (made by 'vrag-retriever index')")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default %(default)s; another needs --api-key)")
    p.add_argument("--port", type=int, default=8002, help="port (default %(default)s)")
    p.add_argument("--api-key", default=None,
                   help="require this X-API-Key header (default: $VRAG_RETRIEVER_API_KEY, "
                        "else none)")
    p.add_argument("--allow-public-without-key", dest="allow_public", action="store_true",
                   help="bind a non-loopback host without an API key")
    p.add_argument("--workers", type=int, default=1,
                   help="server processes, each with its own index copy (default %(default)s)")
    p.add_argument("--preload", nargs="?", const="msgpack", default=None,
                   choices=sorted(PRELOAD_FORMS),
                   help="load every page image at start-up, in the form its clients ask for: "
                        "msgpack (the default: this project's rollout client) or json (base64, "
                        "e.g. ALDEN's clients); a page asked for in the other form gains it")
    p.add_argument("--encoder", default=None, metavar="NAME:PATH",
                   help="the dense encoder's checkpoint, when not where the index recorded it; "
                        "must be the checkpoint the index was built with")
    p.add_argument("--max-in-flight", type=int, default=AdmissionLimits.max_in_flight,
                   help="requests worked on at once, per process (default %(default)s)")
    p.add_argument("--max-queue", type=int, default=AdmissionLimits.max_queue,
                   help="requests waiting beyond those, per process; more are refused (503) "
                        "(default %(default)s)")
    p.add_argument("--max-wait", type=float, default=AdmissionLimits.max_wait_s,
                   help="seconds a request may wait for a slot before it is refused (503) "
                        "(default %(default)s)")
    p.add_argument("--queue-services", type=_services, default=AdmissionLimits.queue_services,
                   metavar="N",
                   help="queue a request only if it should start within N mean service times "
                        "(default %(default)s; 'none': --max-wait alone bounds the queue)")
    p.add_argument("--threads", type=int, default=AdmissionLimits.threads,
                   help="threads computing answers at once, per process (default %(default)s)")
    p.add_argument(LIMIT_OPTION, type=float, default=Limits.max_answer_bytes / MIB, metavar="MIB",
                   help="largest answer, in MiB; a request that could get more is refused (413) "
                        "before any search, saying how many queries fit (default %(default)g)")
    p.add_argument("--follow-index", type=float, default=0.0, metavar="SECONDS",
                   help="reload by itself within about SECONDS when INDEX_DIR is re-indexed "
                        "(every worker process; default 0: only POST /admin/reload)")
    p.add_argument("--log-level", default="info",
                   help="uvicorn's log level: critical, error, warning, info, debug, trace "
                        "(default %(default)s)")
    p.add_argument("--access-log", action="store_true",
                   help="log one line per request on stdout (client, method, path, status), at "
                        "the info level (default: off; GET /metrics counts requests either way)")
    p.set_defaults(func=_cmd_serve)

    p = command("sample-corpus", "write the built-in sample PDFs", """\
Write 3 small generated PDFs (annual_report, safety_manual, product_guide; 13 pages)
into OUT_DIR, offline, to try indexing and serving.

example:
  vrag-retriever sample-corpus corpus/ && vrag-retriever index corpus/ --out index/""")
    p.add_argument("out_dir", metavar="OUT_DIR", help="where to write the PDFs (created)")
    p.set_defaults(func=_cmd_sample_corpus)

    return parser


def _one_line(exc: BaseException) -> str:
    """The error said in one line; an OSError from the system as `PATH: what` (no errno)."""
    if isinstance(exc, OSError) and exc.strerror and exc.filename is not None:
        text = f"{exc.filename}: {exc.strerror}"
    else:
        text = str(exc) or type(exc).__name__
    return " ".join(line.strip() for line in text.splitlines() if line.strip())


# Expected user errors (a path, an index, a value, an environment the command cannot use):
# said in one line with exit 2. Anything else is a bug and keeps its traceback.
USER_ERRORS = (ValueError, OSError, RuntimeError)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except USER_ERRORS as exc:
        print(f"vrag-retriever {args.command}: error: {_one_line(exc)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
