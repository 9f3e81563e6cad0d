"""Which torch device and dtype a run uses: ``auto`` resolved, a device this machine lacks refused at once."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    import torch

__all__ = ["resolve_device", "resolve_dtype"]


def resolve_device(device: str | torch.device | None = "auto") -> torch.device:
    """``auto`` -> cuda if available, else mps, else cpu. Returns a ``torch.device``.

    Any other device must exist on this machine: ``cuda`` on a torch built without CUDA,
    ``cuda:3`` with two GPUs or an unknown name raise a ``ValueError`` here, before
    anything is loaded (every entry point that takes a device calls this first).
    """

    mps = getattr(torch.backends, "mps", None)
    if device is None or device == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if mps is not None and mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"unknown device {device!r}; use auto, cpu, cuda, cuda:N or mps") from exc
    if resolved.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            why = "this torch is built without CUDA" if torch.version.cuda is None else "torch sees no CUDA GPU"
            raise ValueError(
                f"device {device!r} is not available: {why} (torch {torch.__version__}); use --device cpu or auto"
            )
        if resolved.index is not None and resolved.index >= count:
            raise ValueError(
                f"device {device!r} does not exist: this machine has {count} CUDA device(s), cuda:0 to cuda:{count - 1}"
            )
    elif resolved.type == "mps" and not getattr(mps, "is_available", lambda: False)():
        raise ValueError(f"device {device!r} is not available on this machine; use --device cpu or auto")
    elif resolved.type not in ("cpu", "cuda", "mps"):
        available = getattr(getattr(torch, resolved.type, None), "is_available", None)
        if not (callable(available) and available()):
            raise ValueError(f"device {device!r} is not available on this machine; use auto, cpu, cuda, cuda:N or mps")
    return resolved


_DTYPES = {
    "float32": "float32",
    "fp32": "float32",
    "float16": "float16",
    "fp16": "float16",
    "half": "float16",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
}


def resolve_dtype(dtype: str | torch.dtype | None = "auto", device: str | torch.device = "cpu") -> torch.dtype:
    """``auto`` -> bfloat16 on CUDA, float32 elsewhere. Accepts names or torch dtypes."""

    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype is None or dtype == "auto":
        return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    if dtype not in _DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; use auto, {', '.join(sorted(set(_DTYPES.values())))}")
    return getattr(torch, _DTYPES[dtype])
