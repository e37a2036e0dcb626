#!/usr/bin/env python3
"""PyTorch's side of dev/bench_attention.cu: causal scaled_dot_product_attention on the GPU.

usage: bench_attention_sdpa.py IN OUT

IN (written by bench_attention): int32 B, NH, T, HD, iterations, warm-up; then qkv
(B, T, 3C) and dout (B, T, C) as raw bf16, C = NH*HD, q/k/v and heads laid out as in
kernels/attention.cuh. OUT: float32 median milliseconds of forward, backward and both;
then out (B, T, C) and dqkv (B, T, 3C) as raw bf16.

Forward is sdpa on views of qkv plus the transpose of its output to (B, T, C); backward is
autograd from that output into the gradient of qkv (B, T, 3C): what a model with a fused
qkv projection pays, and what the CUDA kernels compute.

Exit status 3 (with one line on stderr) when torch or its CUDA support is missing, so the
benchmark can say so and go on without this column.
"""

import statistics
import sys

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
except ImportError as error:
    print(f"torch not importable ({error})", file=sys.stderr)
    sys.exit(3)


def median_ms(step, iterations, warmup):
    """Median of `iterations` timings of step(start, end), which records the two CUDA events."""
    for _ in range(warmup):
        step(None, None)
    times = []
    for _ in range(iterations):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        step(start, end)
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    if not torch.cuda.is_available():
        print(f"torch {torch.__version__} has no CUDA device", file=sys.stderr)
        sys.exit(3)
    with open(sys.argv[1], "rb") as f:
        B, NH, T, HD, iterations, warmup = np.frombuffer(f.read(24), dtype="<i4").tolist()
        C = NH * HD
        raw = np.frombuffer(f.read(), dtype="<u2")
    device = torch.device("cuda")
    bf16 = lambda a: torch.from_numpy(a.view("<i2").copy()).view(torch.bfloat16).to(device)  # noqa: E731
    qkv = bf16(raw[: B * T * 3 * C]).view(B, T, 3 * C).requires_grad_(True)
    dout = bf16(raw[B * T * 3 * C :]).view(B, T, C)

    def forward():
        q, k, v = (x.view(B, T, NH, HD).transpose(1, 2) for x in qkv.split(C, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return y.transpose(1, 2).reshape(B, T, C)

    def forward_step(start, end):
        with torch.no_grad():
            if start:
                start.record()
            forward()
            if end:
                end.record()

    def backward_step(start, end):
        qkv.grad = None
        out = forward()
        if start:
            start.record()
        out.backward(dout)
        if end:
            end.record()

    def both_step(start, end):
        qkv.grad = None
        if start:
            start.record()
        forward().backward(dout)
        if end:
            end.record()

    times = [median_ms(step, iterations, warmup) for step in (forward_step, backward_step, both_step)]
    qkv.grad = None
    out = forward()
    out.backward(dout)
    torch.cuda.synchronize()
    as_bits = lambda t: t.detach().contiguous().view(torch.int16).cpu().numpy()  # noqa: E731
    with open(sys.argv[2], "wb") as f:
        f.write(np.asarray(times, dtype="<f4").tobytes())
        f.write(as_bits(out).tobytes())
        f.write(as_bits(qkv.grad).tobytes())


if __name__ == "__main__":
    main()
