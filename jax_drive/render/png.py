"""PNG files and contact sheets of uint8 images (numpy + zlib; no imaging library)."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path
from typing import Sequence

import numpy as np


def _chunk(kind: bytes, data: bytes) -> bytes:
    return (struct.pack(">I", len(data)) + kind + data
            + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))


def encode_png(image) -> bytes:
    """PNG bytes of a uint8 (H, W, 3) RGB or (H, W) grey image (8-bit, no filtering)."""
    img = np.asarray(image)
    if img.dtype != np.uint8 or img.ndim not in (2, 3) or (img.ndim == 3 and img.shape[2] != 3):
        raise ValueError(f"expected uint8 (H, W, 3) or (H, W), got {img.dtype} {img.shape}")
    h, w = img.shape[:2]
    if h == 0 or w == 0:
        raise ValueError("empty image")
    colour_type = 2 if img.ndim == 3 else 0
    rows = np.ascontiguousarray(img).reshape(h, -1)
    raw = np.concatenate([np.zeros((h, 1), np.uint8), rows], axis=1).tobytes()  # filter 0
    header = struct.pack(">IIBBBBB", w, h, 8, colour_type, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", header)
            + _chunk(b"IDAT", zlib.compress(raw, 6)) + _chunk(b"IEND", b""))


def write_png(path: str | Path, image) -> Path:
    """Writes ``image`` (see :func:`encode_png`) to ``path``; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(encode_png(image))
    return path


def contact_sheet(images: Sequence[np.ndarray], columns: int = 4, pad: int = 4,
                  background: tuple[int, int, int] = (255, 255, 255)) -> np.ndarray:
    """Tiles uint8 (H_i, W_i, 3) images row by row into one (H, W, 3) uint8 image, each cell
    as large as the largest image, ``pad`` pixels apart."""
    images = [np.asarray(im) for im in images]
    if not images:
        raise ValueError("no images")
    if any(im.dtype != np.uint8 or im.ndim != 3 or im.shape[2] != 3 for im in images):
        raise ValueError("contact_sheet takes uint8 (H, W, 3) images")
    if columns < 1 or pad < 0:
        raise ValueError("columns must be >= 1 and pad >= 0")
    cell_h = max(im.shape[0] for im in images)
    cell_w = max(im.shape[1] for im in images)
    cols = min(columns, len(images))
    rows = -(-len(images) // cols)
    sheet = np.empty((pad + rows * (cell_h + pad), pad + cols * (cell_w + pad), 3), np.uint8)
    sheet[:] = np.asarray(background, np.uint8)
    for i, im in enumerate(images):
        r, c = divmod(i, cols)
        y, x = pad + r * (cell_h + pad), pad + c * (cell_w + pad)
        sheet[y:y + im.shape[0], x:x + im.shape[1]] = im
    return sheet
