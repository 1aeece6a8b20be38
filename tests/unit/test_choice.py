"""``lookahead.kernels.choice``: the one value that names a linear layer's kernel, read from
the spellings older code, profiles and results files used, and refused by name otherwise."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from lookahead.kernels import Kernel, as_kernel


@pytest.mark.parametrize(("spelling", "kernel"), [
    (True, Kernel.PACKED),  # packed_weights=True
    (False, Kernel.PLAIN),  # packed_weights=False
    ("stream", Kernel.STREAM),  # packed_weights="stream", --stream-kernel
    ("onednn", Kernel.PACKED),  # pack_weights(model, "onednn")
    ("quantized", Kernel.QUANTIZED),  # the bench setting of a quantized GGUF model
    (" Packed ", Kernel.PACKED),
    ("plain", Kernel.PLAIN),
    (Kernel.STREAM, Kernel.STREAM),
    (None, None),  # the automatic choice
    ("auto", None),
])
def test_the_older_spellings_read_as_kernels(spelling, kernel) -> None:
    assert as_kernel(spelling) is kernel


@pytest.mark.parametrize("bad", ["fast", "", 1, 0, 2.0, ["stream"]])
def test_anything_else_is_refused_naming_the_argument_and_the_choices(bad) -> None:
    with pytest.raises(ValueError) as info:
        as_kernel(bad, "--kernel")
    message = str(info.value)
    assert message.startswith("--kernel must be None (auto) or one of 'plain', 'packed', ")
    assert "True (packed), False (plain)" in message and message.endswith(f"got {bad!r}")


def test_a_kernel_outside_those_allowed_is_refused_and_the_message_lists_only_them() -> None:
    allowed = (Kernel.PACKED, Kernel.STREAM)
    assert as_kernel("onednn", "kernel", allowed) is Kernel.PACKED
    with pytest.raises(ValueError, match=r"^kernel must be None \(auto\) or one of 'packed', "
                                         r"'stream', True \(packed\); got False$"):
        as_kernel(False, "kernel", allowed)
    with pytest.raises(ValueError, match="got 'quantized'"):
        as_kernel(Kernel.QUANTIZED, "kernel", allowed)


def test_a_kernel_shows_and_saves_as_its_name() -> None:
    assert [str(k) for k in Kernel] == ["plain", "packed", "stream", "quantized"]
    assert f"{Kernel.STREAM}" == "stream" and Kernel("packed") is Kernel.PACKED
    assert json.loads(json.dumps({"packed_weights": Kernel.PACKED})) == {"packed_weights": "packed"}
    assert [k.packs for k in Kernel] == [False, True, True, False]


def test_naming_the_choices_loads_no_torch() -> None:
    # The command line's parsers import it before any model loads.
    code = "import sys, lookahead.kernels; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
