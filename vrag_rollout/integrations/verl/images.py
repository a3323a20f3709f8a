"""A row's prompt images as verl's dataset hands them to an agent loop, read as RGB PIL images.

verl's `RLHFDataset._build_messages` turns each entry of a row's image column into a message part
`{"type": "image", ...}` of one of these shapes: `image` a PIL image (a PIL entry, converted to
RGB); the entry's own dict with `image` added as the PIL image opened from its `bytes` (a parquet
image column: {"bytes", "path"}); `image` a path string (a path or `os.PathLike` entry); or any
other dict entry as it is (`image` a path, `file://`, `data:` or http(s) URL; `image_url`, as
qwen_vl_utils reads it). Each is read here as the RGB image the model is shown.
"""

from __future__ import annotations

import base64
import io
import os
import urllib.request
from pathlib import Path
from typing import Any

IMAGE_KEYS = ("image", "image_url", "url", "bytes", "path")  # where an image part holds its image, first found


def prompt_image(part: dict) -> Any:
    """A prompt image part as verl's `RLHFDataset._build_messages` writes it, as an RGB PIL image:
    `image` holding a PIL image, a path, a `file://`, `data:image/...;base64,` or http(s) URL, or
    a dict of these; else `image_url` (as qwen_vl_utils reads it, or {"url": ...}); else `bytes` or
    `path` (a parquet image column's {"bytes", "path"})."""
    from PIL import Image

    source = next((part[key] for key in IMAGE_KEYS if part.get(key) is not None), None)
    if isinstance(source, dict):
        return prompt_image(source)
    if isinstance(source, Image.Image):
        return source.convert("RGB")
    if isinstance(source, (bytes, bytearray, memoryview)):
        return Image.open(io.BytesIO(bytes(source))).convert("RGB")
    if hasattr(source, "__array_interface__"):  # a numpy array of pixels
        return Image.fromarray(source).convert("RGB")
    if isinstance(source, (str, os.PathLike)):
        return Image.open(io.BytesIO(_image_bytes(os.fspath(source)))).convert("RGB")
    raise TypeError(f"vrag_agent: a prompt image part holds {type(source).__name__}, not an image, bytes, a path "
                    f"or a URL (keys: {sorted(part)})")


def _image_bytes(location: str) -> bytes:
    if location.startswith("data:"):  # either base64 alphabet (b64decode would drop "-" and "_")
        return base64.urlsafe_b64decode(location.split(",", 1)[1])
    if location.startswith(("http://", "https://")):
        with urllib.request.urlopen(location, timeout=60) as answer:
            return answer.read()
    return Path(location.removeprefix("file://")).read_bytes()


def prompt_images(messages: list) -> list:
    """The images of a row's chat messages, in order (`prompt_image` of each image part)."""
    return [prompt_image(part) for message in messages if isinstance(message.get("content"), list)
            for part in message["content"] if isinstance(part, dict) and part.get("type") == "image"]
