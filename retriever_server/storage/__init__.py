"""The index on disk: what an index directory holds, how it is read, replaced and recovered.

The lowest layer of the server beside the wire contract: it imports nothing else of the package.
Building an index (`indexing/`), the backends, serving and the HTTP surface all stand on it.

- `manifest`: the manifest (one JSON file): documents, pages in corpus order, build settings.
- `store`: the read side: pages looked up by (doc id, page) in one directory held open for life.
- `swap`: crash-safe replacement of an index directory, shared locks, recovery after a crash.
- `imaging`: the stored page image's size rule (Qwen2-VL's `smart_resize`) and JPEG encoding,
  shared by the build (pages) and by serving (crops drawn to the same rule).
"""
