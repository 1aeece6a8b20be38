"""Where a model runs: checking a ``device`` argument before anything is loaded onto it."""

from __future__ import annotations

import torch


def resolve_device(device: str | torch.device | None, name: str = "device") -> torch.device | None:
    """``device`` ("cpu", "cuda", "cuda:1", "mps", a ``torch.device``) as a ``torch.device``
    that this machine has; None stays None (the model stays where it was loaded: the CPU).

    Raises ValueError naming ``name`` (the argument or flag) for a malformed device or one this
    machine lacks, e.g. ``--device cuda`` where PyTorch sees no CUDA device.
    """
    if device is None:
        return None
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise ValueError(f"{name} must be a device such as 'cpu', 'cuda' or 'cuda:1', "
                         f"got {device!r} ({error})") from None
    if resolved.type == "cpu":
        return resolved
    backend = getattr(torch, resolved.type, None)
    if resolved.type == "mps":
        backend = getattr(torch.backends, "mps", None)
    available = backend is not None and getattr(backend, "is_available", lambda: False)()
    if not available:
        raise ValueError(f"{name} {device!r}: this machine has no {resolved.type} device "
                         f"(torch.{resolved.type}.is_available() is False)")
    count = getattr(backend, "device_count", None)
    if resolved.index is not None and count is not None and resolved.index >= count():
        raise ValueError(f"{name} {device!r}: there are {count()} {resolved.type} device(s)")
    return resolved
