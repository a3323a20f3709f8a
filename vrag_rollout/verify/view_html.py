"""Small HTML pieces the view's modules share: counted nouns, image data URIs, the vision token names."""

from __future__ import annotations

import base64
from gettext import ngettext

IMAGE_PAD, VISION_START, VISION_END = "<|image_pad|>", "<|vision_start|>", "<|vision_end|>"


def _count(number: int, noun: str) -> str:
    """'1 image', '2 images'."""
    return f"{number} {ngettext(noun, noun + 's', number)}"


def _mime(data: bytes) -> str:
    if data.startswith(b"\x89PNG"):
        return "image/png"
    if data.startswith(b"\xff\xd8"):
        return "image/jpeg"
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return "image/gif"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return "application/octet-stream"


def data_uri(data: bytes) -> str:
    return f"data:{_mime(data)};base64,{base64.b64encode(data).decode('ascii')}"
