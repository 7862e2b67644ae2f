#!/usr/bin/env python3
"""PyTorch's figures for the shapes parley's GPU benchmarks measure, on the same machine.

Prints one JSON object (and writes it to --out): scaled dot-product attention (causal, B4 H32
S4096 D128, BF16 and F16) in TFLOP/s counting 2*B*H*S^2*D, F32 matrix product 4096^3 with TF32
allowed in TFLOP/s, a beam step (log-softmax, running scores, top 10 over 5 x vocabulary, results
copied to the host) in microseconds, and the device's copy bandwidth in GB/s (bytes read plus
bytes written), the memory roofline for decoding. CUDA events time every figure after a warm-up;
each is the median of --reps runs.

--smoke runs the same code on tiny shapes, on the CPU when there is no GPU: it checks the script,
not the machine.
"""
import argparse
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F


def timer(dev):
    if dev.type == "cuda":
        def run(fn, reps):
            fn()
            torch.cuda.synchronize()
            out = []
            for _ in range(reps):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                fn()
                b.record()
                b.synchronize()
                out.append(a.elapsed_time(b) / 1e3)
            return statistics.median(out)
    else:
        def run(fn, reps):
            fn()
            out = []
            for _ in range(reps):
                t0 = time.perf_counter()
                fn()
                out.append(time.perf_counter() - t0)
            return statistics.median(out)
    return run


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", help="write the JSON here too")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--smoke", action="store_true", help="tiny shapes; CPU when there is no GPU")
    a = ap.parse_args()
    cuda = torch.cuda.is_available()
    if not cuda and not a.smoke:
        sys.exit("gpu_reference: no CUDA device (use --smoke to check the script on a CPU)")
    dev = torch.device("cuda" if cuda else "cpu")
    run = timer(dev)
    res = {"torch": torch.__version__, "device": torch.cuda.get_device_name(0) if cuda else "cpu"}

    B, H, S, D = (4, 32, 4096, 128) if not a.smoke else (1, 2, 64, 32)
    flops = 2.0 * B * H * S * S * D
    for name, dt in (("bf16", torch.bfloat16), ("f16", torch.float16)):
        if not cuda and dt == torch.float16:
            continue
        q, k, v = (torch.randn(B, H, S, D, device=dev, dtype=dt) for _ in range(3))
        t = run(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), a.reps)
        res[f"sdpa_causal_{name}_tflops"] = flops / t / 1e12
        del q, k, v

    n = 4096 if not a.smoke else 128
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    x, w = torch.randn(n, n, device=dev), torch.randn(n, n, device=dev)
    t = run(lambda: torch.matmul(x, w.t()), a.reps)
    res["gemm_tf32_4096_tflops" if not a.smoke else "gemm_tf32_smoke_tflops"] = 2.0 * n * n * n / t / 1e12
    del x, w

    beams, k = 5, 10
    for vocab in (51865, 32000):
        logits = torch.randn(beams, vocab, device=dev) * 3
        scores = torch.tensor([-0.5, -1, -1.5, -2, -2.5], device=dev)

        def step():
            s = (scores[:, None] + torch.log_softmax(logits, dim=-1)).reshape(-1)
            top = torch.topk(s, k)
            return top.values.cpu(), (top.indices // vocab).cpu(), (top.indices % vocab).cpu()

        res[f"beam_step_{vocab}_us"] = run(step, max(a.reps, 50)) * 1e6

    nbytes = (1 << 30) if not a.smoke else (1 << 20)
    src = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    t = run(lambda: dst.copy_(src), a.reps)
    res["copy_gbps"] = 2.0 * nbytes / t / 1e9

    out = json.dumps(res, indent=2, sort_keys=True)
    print(out)
    if a.out:
        with open(a.out, "w") as f:
            f.write(out + "\n")


if __name__ == "__main__":
    main()
