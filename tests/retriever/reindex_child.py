"""Re-index in a child process that SIGKILLs itself at a chosen point (fault injection).

Usage: python reindex_child.py POINT OUT_DIR SRC...

POINT is ``none`` (run to the end), ``rename-before-N`` / ``rename-after-N`` (around the N-th
``os.rename`` of the swap, 1-based), ``manifest-half`` (half of manifest.json written) or ``rmtree-half``
(half of the old index deleted).
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    point, out, sources = sys.argv[1], Path(sys.argv[2]), [Path(p) for p in sys.argv[3:]]
    from retriever_server.indexing import indexer
    from retriever_server.storage import swap

    if point.startswith("rename-"):
        _, when, nth = point.split("-")
        count = [0]

        def rename(src, dst, *args, **kwargs):
            count[0] += 1
            if count[0] == int(nth) and when == "before":
                die()
            os.rename(src, dst, *args, **kwargs)
            if count[0] == int(nth) and when == "after":
                die()

        class SwapOs:  # only the swap module's renames are counted
            def __getattr__(self, name):
                return getattr(os, name)

        SwapOs.rename = staticmethod(rename)
        swap.os = SwapOs()
    elif point == "manifest-half":
        def write_half(index_dir, manifest):
            text = manifest.to_json()
            (Path(index_dir) / "manifest.json").write_text(text[: len(text) // 2])
            die()

        indexer.write_manifest = write_half
    elif point == "rmtree-half":
        def rmtree_half(path, ignore_errors=False):
            files = sorted(Path(path).rglob("*.jpg"))
            for f in files[: len(files) // 2]:
                f.unlink()
            die()

        class SwapShutil:
            rmtree = staticmethod(rmtree_half)

        swap.shutil = SwapShutil()
    indexer.build_index(sources, out, progress=False, jpeg_quality=40)


if __name__ == "__main__":
    main()
