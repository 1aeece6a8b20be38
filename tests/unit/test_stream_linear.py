"""The stream kernel (``lookahead.kernels.stream_linear``, ``packed_weights=Kernel.STREAM``):
bfloat16 linears summed in float32, close to the exact product, with each row's result
independent of the rows beside it; and the way the packing, the profiles and the command line
choose it.

The kernel is compiled on first use: without a C++ compiler or AVX-512 these tests skip, and
say why.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import lookahead
from lookahead.kernels import Kernel, packing
from lookahead.profiles import load_profile, profile_path
from lookahead.cli.main import main
from lookahead.kernels.packing import PackedLinear, StreamLinear, pack_weights, packing_of
from lookahead.kernels.stream_linear import stream_kernel_problem
from tiny import save_tiny_chat_model

PROBLEM = stream_kernel_problem() or packing.cpu_packing_problem()
needs_kernel = pytest.mark.skipif(PROBLEM is not None, reason=str(PROBLEM))

# Tiny models as test_packing.py builds them: every layer's width a multiple of 32.
WIDE = dict(vocab_size=256, hidden_size=128, intermediate_size=384, num_attention_heads=4,
            num_key_value_heads=2)


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    return save_tiny_chat_model(tmp_path_factory.mktemp("tiny-chat-llama"))


def run_cli(argv: list[str], capsys) -> tuple[int, str, str]:
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def stream_layer(out_features: int, in_features: int, bias: bool, seed: int) -> tuple:
    """(the plain bfloat16 layer, its StreamLinear), random weights of a model's scale."""
    torch.manual_seed(seed)
    linear = torch.nn.Linear(in_features, out_features, bias=bias).to(torch.bfloat16)
    return linear, StreamLinear(linear, packing.load_stream_kernel())


@needs_kernel
@settings(max_examples=25, deadline=None)
@given(out_blocks=st.integers(1, 6), half_in=st.integers(1, 400), rows=st.integers(1, 20),
       bias=st.booleans(), seed=st.integers(0, 2**16))
def test_the_kernel_gives_the_exact_product_to_bfloat16_rounding(out_blocks, half_in, rows,
                                                                   bias, seed) -> None:
    # Up to 800 inputs: several of the kernel's blocks of 256, and a part block.
    linear, stream = stream_layer(32 * out_blocks, 2 * half_in, bias, seed)
    x = torch.randn(rows, 2 * half_in, generator=torch.Generator().manual_seed(seed))
    x = x.to(torch.bfloat16)
    exact = torch.nn.functional.linear(x.double(), linear.weight.double(),
                                       None if linear.bias is None else linear.bias.double())
    got = stream(x)
    assert got.dtype == torch.bfloat16 and got.shape == (rows, 32 * out_blocks)
    # One bfloat16 rounding (2**-8 relative) plus float32's summing error.
    torch.testing.assert_close(got.double(), exact, rtol=2**-8, atol=1e-5)


@needs_kernel
@pytest.mark.parametrize("rows", [2, 8, 9, 12, 13, 27])
def test_a_rows_result_does_not_depend_on_the_rows_beside_it(rows) -> None:
    _, stream = stream_layer(96, 384, True, rows)
    x = torch.randn(2, rows, 384).to(torch.bfloat16)
    together = stream(x)
    one_by_one = torch.cat([stream(x[:, i:i + 1]) for i in range(rows)], dim=1)
    assert together.shape == (2, rows, 96)
    assert torch.equal(together, one_by_one)
    assert torch.equal(copy.deepcopy(stream)(x), together)  # a copied model runs the same
    # The float32 sums themselves: bfloat16's rounding would hide most changes of order.
    kernel, flat = packing.load_stream_kernel(), x.reshape(-1, 384)
    sums = kernel.linear(flat, stream.packed_weight, stream.bias, True)
    assert sums.dtype == torch.float32
    for i in range(flat.shape[0]):
        assert torch.equal(sums[i], kernel.linear(flat[i:i + 1], stream.packed_weight,
                                                  stream.bias, True)[0])


@needs_kernel
def test_stream_packing_takes_the_layers_that_fit_and_leaves_the_rest_to_onednn(fresh_lm
                                                                                 ) -> None:
    # gate and up have 400 outputs, not a multiple of 32: oneDNN keeps them.
    model = fresh_lm("llama", **{**WIDE, "intermediate_size": 400}).to(torch.bfloat16)
    prompt = torch.randint(0, 256, (1, 12), generator=torch.Generator().manual_seed(3))
    before = model(prompt).logits
    assert pack_weights(model, Kernel.STREAM) == 2 * 7 + 1
    kinds = [type(m) for m in model.modules() if isinstance(m, (StreamLinear, PackedLinear))]
    assert kinds.count(PackedLinear) == 2 * 2 and kinds.count(StreamLinear) == 2 * 5 + 1
    assert packing_of(model) is Kernel.STREAM
    after = model(prompt).logits
    torch.testing.assert_close(after.float(), before.float(), rtol=0.05, atol=0.05)


@needs_kernel
def test_prompt_lookup_on_the_stream_kernel_writes_what_its_own_generate_writes(fresh_lm
                                                                                ) -> None:
    # Passes of several rows, verified against one-row passes' text. In bfloat16 a near tie
    # can still part the two (attention sums a pass's rows in its own order); this prompt
    # has none, so the texts must agree token for token.
    model = fresh_lm("llama", **WIDE).to(torch.bfloat16)
    pack_weights(model, Kernel.STREAM)
    prompt = torch.randint(0, 256, (1, 12), generator=torch.Generator().manual_seed(2))
    prompt = torch.cat([prompt, prompt], dim=1)  # something for the copy to find
    reference = model.generate(prompt, max_new_tokens=40, do_sample=False)
    result = lookahead.generate(model, prompt, 40, "prompt_lookup", num_draft_tokens=4)
    assert max(result.stats.forward_tokens_per_step) > 1  # passes of several rows
    assert torch.equal(result.sequences, reference)


def test_a_bad_kernel_or_dtype_for_the_stream_kernel_is_refused_by_name(fresh_lm) -> None:
    model = fresh_lm("llama", **WIDE).float()
    with pytest.raises(ValueError, match="kernel must be .*'packed', 'stream'.*got 'fast'"):
        pack_weights(model, "fast")
    with pytest.raises(ValueError, match="model: .*stream kernel is for bfloat16"):
        pack_weights(model, Kernel.STREAM)
    with pytest.raises(ValueError, match="packed_weights='stream' applies to dtype bfloat16"):
        packing.check_packable_dtype(Kernel.STREAM, torch.float32)
    with pytest.raises(ValueError, match="packed_weights must be None .*'stream'.*got 'yes'"):
        packing.check_packable_dtype("yes", torch.bfloat16)


def test_stream_weights_keep_a_profile_of_their_own(tmp_path) -> None:
    path = profile_path("m", "bfloat16", cache_dir=tmp_path, packed=Kernel.STREAM)
    assert path.name == "m-bfloat16-stream-cpu.json"
    path.parent.mkdir(parents=True)
    best = {"window": 2, "ngram": 4, "guess": 2}
    path.write_text(json.dumps({"best": best, "packed_weights": "stream"}), encoding="utf-8")
    assert load_profile("m", "bfloat16", tmp_path, packed=Kernel.STREAM)["best"] == best
    assert load_profile("m", "bfloat16", tmp_path, packed="stream")["best"] == best
    assert load_profile("m", "bfloat16", tmp_path, packed=Kernel.PACKED) is None  # another curve
    assert load_profile("m", "bfloat16", tmp_path, packed=Kernel.PLAIN) is None


@needs_kernel
def test_the_stream_kernel_flag_packs_for_it_and_generate_prints_text(tiny_folder, capsys,
                                                                      monkeypatch) -> None:
    kernels = []
    pack = packing.pack_weights
    monkeypatch.setattr(packing, "pack_weights",
                        lambda model, *kernel: kernels.append(kernel) or pack(model, *kernel))
    argv = ["generate", "--model", str(tiny_folder), "--dtype", "bfloat16", "--max-new-tokens",
            "12", "hello"]
    code, out, _ = run_cli([*argv, "--stream-kernel"], capsys)
    assert code == 0 and out.strip() and kernels == [(Kernel.STREAM,)]
    with pytest.raises(SystemExit) as info:
        main([*argv[:3], "--dtype", "float32", *argv[5:], "--stream-kernel"])
    err = capsys.readouterr().err
    assert info.value.code == 2
    assert "argument --stream-kernel: the stream kernel is for bfloat16" in err


@pytest.mark.parametrize("command", ["bench", "tune"])
def test_bench_and_tune_name_the_stream_kernel_flag_for_another_dtype(command, tiny_folder,
                                                                       capsys) -> None:
    # Checked before any model loads: the error names the flag the user typed.
    code, out, err = run_cli([command, "--model", str(tiny_folder), "--dtype", "float32",
                              "--limit", "1", "--stream-kernel"], capsys)
    assert code == 2 and not out
    assert "argument --stream-kernel: packed_weights='stream' applies to dtype bfloat16" in err
    assert "Traceback" not in err
