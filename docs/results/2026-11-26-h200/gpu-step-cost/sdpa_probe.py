"""Is the bf16 first-meeting cost of each new cache length cuDNN attention's per-shape plans?

Run from the repository root (on the H200, 2026-11-26): python3 docs/results/2026-11-26-h200/gpu-step-cost/sdpa_probe.py cuda
Its output: sdpa-probe.txt beside this file. It ran at commit 9b91da1, before our decoding
and gpu_step_cost.timed_hf chose their attention kernels themselves (8153ab7): to reproduce
its "default" rows, check that commit out (later, ours always run without cuDNN attention).
"""
import statistics, sys, time
sys.path.insert(0, "benchmarks")
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
import gpu_step_cost as g
import lookahead

dev = torch.device(sys.argv[1] if len(sys.argv) > 1 else "cuda")
preset = sys.argv[2] if len(sys.argv) > 2 else "llama-7b"
model = g.build_model(preset, torch.bfloat16, dev, 0)
print("cudnn_sdp", torch.backends.cuda.cudnn_sdp_enabled(), "flash", torch.backends.cuda.flash_sdp_enabled(),
      "mem_eff", torch.backends.cuda.mem_efficient_sdp_enabled(), flush=True)
gen = torch.Generator().manual_seed(1)
no_cudnn = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
import contextlib
settings = [("default", contextlib.nullcontext), ("no cudnn", lambda: sdpa_kernel(no_cudnn))]
length = 100
for name, ctx in settings:
    for k in (1, 16):
        p = torch.randint(model.config.vocab_size, (1, length), generator=gen); length += 150
        with ctx():
            t = g.growing_cache_ms(model, p, k, 48)
        print(f"{name}: {k} tokens growing cache: median {statistics.median(t):.2f} first {t[0]:.2f} max {max(t):.2f}", flush=True)
for name, ctx in settings:
    for label, fn in [("hf", None), ("lookahead W7N5G7", dict(window=7, ngram=5, guess=7, token_cost=0.0)), ("autoregressive", {})]:
        p = torch.randint(model.config.vocab_size, (1, length), generator=gen); length += 150
        with ctx():
            if fn is None:
                new, s = g.timed_hf(model, p, 64)
                print(f"{name}: {label}: {1000*s/64:.1f} ms/token mean", flush=True)
            else:
                method = "lookahead" if fn else "autoregressive"
                new, stats, ms = g.timed_stream(model, p, 64, method, fn)
                print(f"{name}: {label}: median {statistics.median(ms):.1f} ms/step mean {statistics.mean(ms):.1f}", flush=True)
