"""A cache entry's file: one safetensors file, its header laid out before the data is streamed in and read back
whole (:func:`parse_safetensors`) or header only (:func:`tensor_spans`, for a memory map); the storage dtypes
and the checksum."""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = [
    "STORAGE_DTYPES",
    "CacheCorruptError",
    "EntryRecord",
    "file_sha256",
    "parse_safetensors",
    "safetensors_header",
    "storable",
    "tensor_spans",
]

# storage dtype -> (safetensors dtype, numpy dtype the memmap is written with, torch dtype)
STORAGE_DTYPES: dict[str, tuple[str, type[np.generic], torch.dtype]] = {
    "float16": ("F16", np.float16, torch.float16),
    "bfloat16": ("BF16", np.uint16, torch.bfloat16),  # numpy has no bfloat16: write the raw bits
    "float32": ("F32", np.float32, torch.float32),
}
# safetensors dtype -> (numpy dtype, torch dtype its raw bits are viewed as, or None)
_NP_FROM_SAFETENSORS: dict[str, tuple[type[np.generic], torch.dtype | None]] = {
    "F16": (np.float16, None),
    "F32": (np.float32, None),
    "I64": (np.int64, None),
    "BF16": (np.uint16, torch.bfloat16),
}
# the safetensors dtype of the arrays written after the features (labels, offsets)
ARRAY_DTYPES = {np.dtype(np.int64): "I64", np.dtype(np.float32): "F32"}
_HEADER_ERRORS = (ValueError, KeyError, TypeError, struct.error)
# an entry's JSON record: what it holds, which versions made it, its file's size and checksum
EntryRecord = dict[str, Any]


class CacheCorruptError(RuntimeError):
    """A cache entry failed its size, header or checksum check."""


def file_sha256(path: Path) -> str:
    """sha256 of a file, read in blocks (memory stays flat in its size)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def safetensors_header(tensors: list[tuple[str, str, tuple, int]], metadata: dict[str, str]) -> bytes:
    """The safetensors header for ``(name, dtype, shape, nbytes)`` laid out in order (data
    starts right after it, 8-byte aligned)."""
    header: dict[str, object] = {"__metadata__": metadata}
    offset = 0
    for name, dtype, shape, nbytes in tensors:
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * ((-(8 + len(raw))) % 8)
    return struct.pack("<Q", len(raw)) + raw


def storable(pooled: torch.Tensor, storage_dtype: str) -> np.ndarray:
    """Pooled float32 vectors as the array a cache file of ``storage_dtype`` holds (bfloat16 as raw bits);
    values that overflow the storage dtype are refused with what to do."""
    torch_dtype = STORAGE_DTYPES[storage_dtype][2]
    stored = pooled.to(torch_dtype)
    if not bool(torch.isfinite(stored).all()):
        raise ValueError(
            f"the pooled embeddings are not finite after conversion to {storage_dtype} (values "
            f"up to {pooled.abs().max().item():.3g}); use storage_dtype='float32' or 'bfloat16'"
        )
    if torch_dtype == torch.bfloat16:
        stored = stored.view(torch.uint16)
    return stored.numpy()


def _tensor_entries(header: dict[str, dict]) -> dict[str, tuple[str, tuple[int, ...], list[int]]]:
    """``name -> (dtype, shape, data offsets relative to the data's start)``."""
    return {
        name: (str(info["dtype"]), tuple(int(d) for d in info["shape"]), [int(o) for o in info["data_offsets"]])
        for name, info in header.items()
        if name != "__metadata__"
    }


def parse_safetensors(buffer: bytearray, name: str) -> dict[str, torch.Tensor]:
    """Tensors of a safetensors file held in ``buffer``; raises CacheCorruptError on a bad header."""
    try:
        (header_size,) = struct.unpack("<Q", bytes(buffer[:8]))
        if header_size > len(buffer) - 8:
            raise ValueError(f"header size {header_size} exceeds the file")
        start = 8 + header_size
        tensors: dict[str, torch.Tensor] = {}
        end = start
        for tensor_name, (code, shape, offsets) in _tensor_entries(json.loads(bytes(buffer[8:start]))).items():
            np_dtype, view_as = _NP_FROM_SAFETENSORS[code]
            begin, stop = (start + offset for offset in offsets)
            if stop - begin != int(np.prod(shape)) * np.dtype(np_dtype).itemsize or stop > len(buffer):
                raise ValueError(f"tensor {tensor_name!r} does not fit its offsets")
            array = np.frombuffer(buffer, dtype=np_dtype, count=int(np.prod(shape)), offset=begin).reshape(shape)
            if begin % np.dtype(np_dtype).itemsize:
                array = array.copy()  # unaligned (only the small labels tensor can be)
            tensor = torch.from_numpy(array)
            tensors[tensor_name] = tensor.view(view_as) if view_as is not None else tensor
            end = max(end, stop)
        if end != len(buffer):
            raise ValueError(f"{len(buffer) - end} unexpected trailing bytes")
    except _HEADER_ERRORS as exc:
        raise CacheCorruptError(f"{name} has a bad safetensors header or body ({exc})") from exc
    return tensors


def tensor_spans(path: Path) -> dict[str, tuple[str, tuple[int, ...], int]]:
    """``name -> (dtype, shape, absolute byte offset)`` from a safetensors header, reading the header only."""
    try:
        with open(path, "rb") as handle:
            (header_size,) = struct.unpack("<Q", handle.read(8))
            header = json.loads(handle.read(header_size))
        entries = _tensor_entries(header)
    except (OSError, *_HEADER_ERRORS) as exc:
        raise CacheCorruptError(f"{path.name} has a bad safetensors header ({exc})") from exc
    return {name: (code, shape, 8 + header_size + offsets[0]) for name, (code, shape, offsets) in entries.items()}
