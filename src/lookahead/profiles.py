"""Tuned lookahead shapes: where ``lookahead tune`` saves them and how a decoding reads them.

A profile ``<cache>/profiles/<model>-<dtype>[-<kernel>]-<device>[-<workload>].json`` holds
the shape (window, ngram, guess, and optionally lookup_tokens, token_cost, max_step_tokens) that
was fastest on this machine. ``find_shape`` gives the saved best for a model, dtype and device
together with the file it came from, or the untuned default (``DEFAULT_SHAPE``, on CUDA
``GPU_DEFAULT_SHAPE``) and the word "default": the profile is state outside the call, so
``GenerationStats.shape_source`` names it. ``lookahead.bench.tune`` writes the profiles.

Each kernel of the linear layers (``lookahead.kernels.choice.Kernel``: plain, packed, stream)
has its own profile, its file named by the kernel (none for plain): the curves differ. A
profile records its kernel under "packed_weights", as the kernel's name; older profiles wrote
true, false or null there, and are read the same (:func:`recorded_kernel`).
"""

from __future__ import annotations

import bisect
import json
import logging
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

from lookahead import cache_files
from lookahead.config import LookaheadConfig, check_step_tokens, check_workload
from lookahead.kernels.choice import Kernel, as_kernel
from lookahead.models.registry import default_cache_dir, dtype_name

logger = logging.getLogger(__name__)

# What ``find_shape`` names as the source of the untuned shape.
DEFAULT_SOURCE = "default"

_DEFAULTS = LookaheadConfig()
DEFAULT_SHAPE: Mapping[str, int] = MappingProxyType(
    dict(window=_DEFAULTS.window, ngram=_DEFAULTS.ngram, guess=_DEFAULTS.guess)
)
# On a GPU the tokens of a step come nearly free: on an H200, with a 7B Llama in bf16, a pass
# of 256 new tokens cost at most 1.06x a pass of one, and a whole W15 N5 G15 step 1.07x a
# plain step (docs/results/2026-11-26-h200/gpu-step-cost). Untuned, a CUDA model gets the paper's shape for 7B
# models on an A100, its window at every step (token_cost 0), as the paper runs it.
GPU_DEFAULT_SHAPE: Mapping[str, float] = MappingProxyType(
    dict(window=15, ngram=5, guess=15, token_cost=0.0)
)
DEFAULT_LOOKUP_TOKENS = _DEFAULTS.lookup_tokens
DEFAULT_TOKEN_COST = _DEFAULTS.token_cost  # the shipped price: what an untuned run cuts at
# What a profile's best shape holds: (W, N, G), and the length of the copied continuation
# that lookahead verifies beside its pool's n-grams (a 4th number in a shape tuple).
SHAPE_KEYS = ("window", "ngram", "guess", "lookup_tokens")
# A profile's best may also cap the tokens a step feeds (``lookahead.generate``'s
# ``max_step_tokens``): a decoding option, not a ``LookaheadConfig`` field.
STEP_KEY = "max_step_tokens"

PROFILE_VERSION = 1


def shape_of(row: Mapping) -> dict[str, float]:
    """The ``lookahead.generate`` keywords of a profile's ``best`` or a tuning row: (W, N, G),
    which must be there (else KeyError), and the lookup length, token cost and step cap
    (``max_step_tokens``) where given."""
    shape = {key: row[key] for key in SHAPE_KEYS[:3]}
    optional = (*SHAPE_KEYS[3:], "token_cost", STEP_KEY)
    return shape | {key: row[key] for key in optional if row.get(key) is not None}


def split_cap(shape: Mapping) -> tuple[dict, int | None]:
    """``shape`` (``shape_of``'s keywords) as its ``LookaheadConfig`` fields and its step cap
    (``max_step_tokens``, None where it has none)."""
    fields = dict(shape)
    return fields, check_step_tokens(fields.pop(STEP_KEY, None))


def shape_dict(shape) -> dict[str, int]:
    """``(W, N, G)`` or ``(W, N, G, lookup_tokens)`` as ``lookahead.generate`` keywords; the
    lookup length is the default's when left out."""
    return dict(zip(SHAPE_KEYS, (*shape, DEFAULT_LOOKUP_TOKENS)[:4], strict=True))


def shape_label(shape, cap: int | None = None) -> str:
    """The label "W=2 N=5 G=4", with " L=16" where the lookup length is not the default's and
    " T=6" where a step feeds at most 6 tokens (``cap``, or the shape's ``max_step_tokens``)."""
    options = shape_dict(shape) if not isinstance(shape, Mapping) else shape
    label = "W={window} N={ngram} G={guess}".format(**options)
    lookup = options.get("lookup_tokens", DEFAULT_LOOKUP_TOKENS)
    label += f" L={lookup}" if lookup != DEFAULT_LOOKUP_TOKENS else ""
    cap = cap if cap is not None else options.get(STEP_KEY)
    return label + (f" T={cap}" if cap is not None else "")


def recorded_kernel(profile: Mapping) -> Kernel | None:
    """The kernel a profile (or a benchmark's config) records under "packed_weights": the
    kernel's name, or an older profile's true/false; None where it records none (or
    something no kernel is called)."""
    try:
        return as_kernel(profile.get("packed_weights"))
    except ValueError:
        return None


def _measured_alike(profile: dict | None, kernel: Kernel | None) -> dict | None:
    """``profile``, or None where its curve was measured on another kernel than ``kernel``
    (None: not known, any will do). Packed float32 makes a pass of 8 tokens cost
    1.75-1.9x one on an AVX2 CPU, plain float32 about 2x at 2 tokens and no more up to 16,
    the stream kernel about 1.25x: each has its own best shape."""
    recorded = None if profile is None else recorded_kernel(profile)
    if kernel is None or recorded is None or recorded is kernel:
        return profile
    logger.info("passing over the tuning profile of %s: measured on %s weights, these are %s",
                profile.get("model"), recorded, kernel)
    return None


def profile_path(model_name: str, dtype, device: str = "cpu", cache_dir=None,
                 workload: str | None = None, packed: Kernel | None = Kernel.PLAIN) -> Path:
    """``<cache_dir>/profiles/<model>-<dtype>[-<kernel>]-<device>[-<workload>].json``;
    the model name made file-safe. Each kernel (``packed``, a ``Kernel`` or a spelling
    ``as_kernel`` reads) has a profile, "-packed", "-stream"; plain weights (or None) none:
    their curves differ."""
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    safe = cache_files.safe_name(str(model_name), "model")
    kernel = as_kernel(packed, "packed") or Kernel.PLAIN
    packing = f"-{kernel.value}" if kernel is not Kernel.PLAIN else ""
    suffix = f"-{check_workload(workload)}" if workload is not None else ""
    return root / "profiles" / f"{safe}-{dtype_name(dtype)}{packing}-{device}{suffix}.json"


def saved_profile_path(profile: dict, cache_dir=None) -> Path:
    """Where ``lookahead.bench.tune.save_profile`` writes ``profile``: named by its model, dtype, packing,
    device and workload."""
    return profile_path(profile["model"], profile["dtype"], profile["device"], cache_dir,
                        profile.get("workload"), recorded_kernel(profile))


def load_profile(model_name: str, dtype, cache_dir=None, device: str = "cpu",
                 workload: str | None = None, packed: Kernel | None = None) -> dict | None:
    """The saved profile of ``model_name`` in ``dtype`` on ``device`` (for ``workload``, if
    named: that one only) measured on the kernel ``packed`` (a ``Kernel``, or a spelling
    ``as_kernel`` reads: True, False, "stream"), or None.

    ``packed=None`` (not known) takes the plain weights' profile, else the packed one. A profile
    saved before packed weights had a file of their own is read for the packing it records. A
    profile that cannot be read, or whose best shape is invalid, is ignored with a warning.
    """
    found = _find_profile(model_name, dtype, cache_dir, device, workload, packed)
    return None if found is None else found[0]


def _find_profile(model_name: str, dtype, cache_dir=None, device: str = "cpu",
                  workload: str | None = None, packed: Kernel | None = None
                  ) -> tuple[dict, Path] | None:
    """``load_profile``'s profile and the file it was read from, or None."""
    kernel = as_kernel(packed, "packed")
    # Packed weights may find theirs in the plain file: saved before they had one of their own.
    candidates = {None: (Kernel.PLAIN, Kernel.PACKED),
                  Kernel.PACKED: (Kernel.PACKED, Kernel.PLAIN)}.get(kernel, (kernel,))
    for candidate in candidates:
        path = profile_path(model_name, dtype, device, cache_dir, workload, candidate)
        profile = _measured_alike(_read_profile(path), kernel)
        if profile is not None:
            return profile, path
    return None


def _read_profile(path: Path) -> dict | None:
    """The profile JSON at ``path`` if it exists and names a valid best shape, else None."""
    if not path.is_file():
        return None
    try:
        profile = json.loads(path.read_text(encoding="utf-8"))
        fields, _ = split_cap(shape_of(profile["best"]))
        LookaheadConfig(**fields)
    except (OSError, ValueError, TypeError, KeyError) as error:
        logger.warning("ignoring the unreadable tuning profile %s (%s)", path, error)
        return None
    return profile


def resolve_shape(model_name: str, dtype, cache_dir=None, device: str = "cpu",
                  workload: str | None = None, packed: Kernel | None = None
                  ) -> dict[str, float]:
    """``find_shape``'s shape alone."""
    return find_shape(model_name, dtype, cache_dir, device, workload, packed)[0]


def find_shape(model_name: str, dtype, cache_dir=None, device: str = "cpu",
               workload: str | None = None, packed: Kernel | None = None
               ) -> tuple[dict[str, float], str]:
    """``(shape, source)``. ``shape``: ``dict(window=, ngram=, guess=[, lookup_tokens=,
    token_cost=, max_step_tokens=, step_costs=])``, the tuned best for this model, dtype and
    device (from the ``workload`` profile if one is named and saved, else the general one;
    ``step_costs`` read off its curve where its best has a tuned token cost), else
    ``default_shape(device)``; ``source``: the profile file it was read from, or
    ``DEFAULT_SOURCE``. Run ``lookahead tune --model NAME --dtype DTYPE [--workload W]`` to
    create a profile. ``packed``: the kernel of the linear layers (None: not known; see
    ``load_profile``); only a profile measured on the same kernel is taken."""
    found = None
    if workload is not None:
        found = _find_profile(model_name, dtype, cache_dir, device, workload, packed)
        if found is None:
            logger.info("no %r tuning profile for %s; trying the general one", workload,
                        model_name)
    if found is None:
        found = _find_profile(model_name, dtype, cache_dir, device, packed=packed)
    if found is None:
        logger.info("no tuning profile for %s (%s); using the default shape", model_name, dtype)
        return default_shape(device), DEFAULT_SOURCE
    profile, path = found
    return tuned_shape(profile), str(path)


def tuned_shape(profile: Mapping) -> dict[str, float]:
    """A profile's best shape as ``lookahead.generate`` keywords (``shape_of``), with the
    ``step_costs`` of its curve where the shape has a tuned token cost."""
    shape = shape_of(profile["best"])
    costs = step_costs_of(profile.get("curve"))
    if costs is not None and shape.get("token_cost") is not None:  # priced as tuned
        shape["step_costs"] = costs
    return shape


def step_costs_of(curve: Mapping | None, up_to: int = 16) -> tuple[float, ...] | None:
    """What steps of 1, 2, ... tokens cost relative to one (``LookaheadConfig.step_costs``),
    read off a measured forward-cost curve (``{"tokens": [1, 2, 4, ...], "seconds": [...]}``,
    ``cost_at``) up to its largest size (at most ``up_to``), never decreasing; None where the
    curve does not start at one token or has fewer than two sizes."""
    if not curve or len(curve.get("tokens", ())) < 2 or curve["tokens"][0] != 1:
        return None
    one = curve["seconds"][0]
    if one <= 0:
        return None
    costs = [1.0]
    for k in range(2, min(curve["tokens"][-1], up_to) + 1):
        costs.append(round(max(cost_at(curve, k) / one, costs[-1]), 4))
    return tuple(costs)


def cost_at(curve: Mapping, k: float) -> float:
    """Seconds of a forward with ``k`` new tokens: linear between measured sizes, extended
    along the first or last segment outside them."""
    ks, seconds = curve["tokens"], curve["seconds"]
    if len(ks) == 1:
        return seconds[0] * max(k, 1) / ks[0] if k > ks[0] else seconds[0]
    i = min(max(bisect.bisect_left(ks, k), 1), len(ks) - 1)
    k0, k1, s0, s1 = ks[i - 1], ks[i], seconds[i - 1], seconds[i]
    return max(s0 + (s1 - s0) * (k - k0) / (k1 - k0), 0.0)


def default_shape(device: str) -> dict[str, float]:
    """The untuned shape on a device type: ``GPU_DEFAULT_SHAPE`` on CUDA, else
    ``DEFAULT_SHAPE`` (whose window runs while it pays at the shipped token cost)."""
    return dict(GPU_DEFAULT_SHAPE if device == "cuda" else DEFAULT_SHAPE)
