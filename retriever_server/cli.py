"""``vrag-retriever``: index documents, serve an index, write the sample corpus."""

from __future__ import annotations

import argparse
import ipaddress
import os
import sys
from pathlib import Path

from .imaging import DEFAULT_DPI, DEFAULT_JPEG_QUALITY, DEFAULT_MAX_PIXELS, DEFAULT_MIN_PIXELS


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _cmd_index(args) -> int:
    from .indexer import build_index

    out = build_index([Path(s) for s in args.sources], Path(args.out), min_pixels=args.min_pixels,
                      max_pixels=args.max_pixels, jpeg_quality=args.jpeg_quality, ocr=args.ocr,
                      dpi=args.dpi, workers=args.workers)
    from .store import PageStore

    docs = PageStore.open(out).documents()
    print(f"indexed {len(docs)} document(s), {sum(docs.values())} page(s) into {out}")
    return 0


def _cmd_serve(args) -> int:
    import uvicorn

    from . import asgi

    api_key = args.api_key or os.environ.get(asgi.ENV_API_KEY) or None
    if not _is_loopback(args.host) and api_key is None and not args.allow_public:
        print(f"refusing to bind {args.host} without an API key: pass --api-key (or set "
              f"{asgi.ENV_API_KEY}), or --allow-public-without-key if you really mean it",
              file=sys.stderr)
        return 2
    from .manifest import read_manifest

    read_manifest(Path(args.index))  # fail fast, in this process, on a bad index dir
    os.environ[asgi.ENV_INDEX] = str(Path(args.index).absolute())
    os.environ[asgi.ENV_PRELOAD] = "1" if args.preload else "0"
    if api_key:
        os.environ[asgi.ENV_API_KEY] = api_key
    # The factory form lets --workers start several processes, each with its own index copy.
    uvicorn.run("retriever_server.asgi:app_from_env", factory=True, host=args.host, port=args.port,
                workers=args.workers, log_level=args.log_level, access_log=False)
    return 0


def _cmd_sample_corpus(args) -> int:
    from .sample_corpus import write_sample_corpus

    for path in write_sample_corpus(Path(args.out_dir)):
        print(path)
    return 0


def _cmd_record_fixtures(args) -> int:
    # Recording belongs to the rollout package (it knows which calls the demo makes); this
    # subcommand forwards to it so both CLIs can drive it.
    try:
        from vrag_rollout.demo import record_demo_fixtures
    except ImportError as exc:
        print(f"record-fixtures needs the vrag_rollout package: {exc}", file=sys.stderr)
        return 2
    record_demo_fixtures(Path(args.out), args.url)
    print(f"wrote {args.out}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vrag-retriever", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("index", help="index PDFs, folders of PDFs, folders of page images")
    p.add_argument("sources", nargs="+", metavar="SRC")
    p.add_argument("--out", required=True, metavar="INDEX_DIR")
    p.add_argument("--min-pixels", type=int, default=DEFAULT_MIN_PIXELS)
    p.add_argument("--max-pixels", type=int, default=DEFAULT_MAX_PIXELS)
    p.add_argument("--jpeg-quality", type=int, default=DEFAULT_JPEG_QUALITY)
    p.add_argument("--dpi", type=float, default=DEFAULT_DPI,
                   help="PDF render resolution before fitting into the pixel band")
    p.add_argument("--ocr", choices=("auto", "on", "off"), default="auto",
                   help="OCR pages without a text layer with tesseract (auto: when installed)")
    p.add_argument("--workers", type=int, default=None,
                   help="ingest processes (default: one per CPU for 64+ pages)")
    p.set_defaults(func=_cmd_index)

    p = sub.add_parser("serve", help="serve an index over HTTP")
    p.add_argument("--index", required=True, metavar="INDEX_DIR")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8002)
    p.add_argument("--api-key", default=None, help="require this X-API-Key header")
    p.add_argument("--allow-public-without-key", dest="allow_public", action="store_true",
                   help="bind a non-loopback host without an API key")
    p.add_argument("--workers", type=int, default=1, help="server processes")
    p.add_argument("--preload", action="store_true", help="load every page image at start-up")
    p.add_argument("--log-level", default="info")
    p.set_defaults(func=_cmd_serve)

    p = sub.add_parser("sample-corpus", help="write the built-in sample PDFs")
    p.add_argument("out_dir", metavar="OUT_DIR")
    p.set_defaults(func=_cmd_sample_corpus)

    p = sub.add_parser("record-fixtures", help="record the demo's retriever traffic from a live "
                                               "server, for replay (vrag_rollout.demo)")
    p.add_argument("--out", required=True, help="fixture file to write")
    p.add_argument("--url", default=None,
                   help="base URL of a running retriever (default: the sample corpus, served here)")
    p.set_defaults(func=_cmd_record_fixtures)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError, FileExistsError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
