"""Which kernel runs a model's linear layers: one value, :class:`Kernel`.

It is what ``load_model(..., packed_weights=)``, ``apply_packing``, the commands' flags
(``--packed-weights``, ``--no-packed-weights``, ``--stream-kernel``), the benchmark's settings,
the tuning profiles and ``/health`` name. Its string is what files and messages show:
``Kernel("stream")`` is ``Kernel.STREAM``, and JSON writes it as ``"stream"``.

Wherever an argument takes ``Kernel | None``, None is the automatic choice: the commands pack
where that keeps every sum (bfloat16, on a CPU that can pack it), and a GGUF model loaded
with ``dtype="auto"`` stays quantized (see ``load_model``).

No torch here, so that the command line's parsers can name the choices before torch loads.

Example::

    as_kernel(True)        # Kernel.PACKED  (the spelling ``packed_weights=True`` had)
    as_kernel("stream")    # Kernel.STREAM
    as_kernel(None)        # None: the automatic choice
"""

from __future__ import annotations

import enum
from collections.abc import Iterable


class Kernel(str, enum.Enum):
    """The kernel of a model's linear layers.

    ``PLAIN``: the layers as loaded, ``torch.nn.Linear`` (torch's own products; a GGUF model
    on the quantized path has no such layer to swap, and keeps its quantized ones).
    ``PACKED``: swapped by ``lookahead.kernels.packing.pack_weights``: bfloat16 weights laid
    out once for oneDNN (the same sums), float32 products taken weight first (sums that differ
    in the last bits).
    ``STREAM``: bfloat16 layers on the stream kernel (``lookahead.kernels.stream_linear``),
    summed in float32 (the last bits differ).
    ``QUANTIZED``: a GGUF model's layers kept as GGUF blocks on the integer kernel
    (``lookahead.kernels.quant_linear``); chosen when the model loads.
    """

    PLAIN = "plain"
    PACKED = "packed"
    STREAM = "stream"
    QUANTIZED = "quantized"

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    @property
    def packs(self) -> bool:
        """Whether this kernel swaps the ``torch.nn.Linear`` layers of de-quantised weights
        (``pack_weights`` does it): PACKED and STREAM."""
        return self in (Kernel.PACKED, Kernel.STREAM)


# The word for None (the automatic choice) where a choice is written out.
AUTO = "auto"

# Older spellings of the choice, read as today's: ``packed_weights=True``/``False`` and
# ``pack_weights``' kernel name "onednn".
_OLD_SPELLINGS = {"onednn": Kernel.PACKED}


def as_kernel(value: object, argument: str = "packed_weights",
              allowed: Iterable[Kernel] = tuple(Kernel)) -> Kernel | None:
    """``value`` as a :class:`Kernel`, or None for the automatic choice.

    Takes a ``Kernel``, its string ("plain", "packed", "stream", "quantized", any case),
    None or "auto" (the automatic choice), and the older spellings: True (``PACKED``), False
    (``PLAIN``), "onednn" (``PACKED``).

    Raises:
        ValueError: naming ``argument`` and the accepted values, for anything else or for a
            kernel not in ``allowed``.
    """
    allowed = tuple(allowed)
    kernel = _parse(value)
    if kernel is _UNKNOWN or (kernel is not None and kernel not in allowed):
        names = [repr(k.value) for k in allowed]
        names += [f"{flag} ({k.value})" for flag, k in ((True, Kernel.PACKED),
                                                        (False, Kernel.PLAIN)) if k in allowed]
        shown = value.value if isinstance(value, Kernel) else value
        raise ValueError(f"{argument} must be None ({AUTO}) or one of {', '.join(names)}; "
                         f"got {shown!r}")
    return kernel


_UNKNOWN = object()


def _parse(value: object) -> Kernel | None | object:
    """``as_kernel``'s reading of ``value``, before ``allowed``; ``_UNKNOWN`` if none."""
    if value is None or isinstance(value, Kernel):
        return value
    if isinstance(value, bool):
        return Kernel.PACKED if value else Kernel.PLAIN
    if not isinstance(value, str):
        return _UNKNOWN
    text = value.strip().lower()
    if text == AUTO:
        return None
    if text in _OLD_SPELLINGS:
        return _OLD_SPELLINGS[text]
    try:
        return Kernel(text)
    except ValueError:
        return _UNKNOWN
