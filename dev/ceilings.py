#!/usr/bin/env python3
"""Measured ceilings of GPU 0 for make gpu-acceptance: device-to-device copy bandwidth (bytes read
plus bytes written) and bf16 matrix-product throughput through PyTorch (cuBLAS), on random data,
each the median of timed repeats after warm-ups, timed with CUDA events. Prints one JSON object.

usage: python3 dev/ceilings.py [--copy-mib N] [--gemm N] [--repeat N]   (needs a CUDA PyTorch)
"""

import argparse
import json
import statistics
import sys

try:
    import torch
except ImportError:
    sys.exit("ceilings.py needs PyTorch with CUDA (the python3 of a GPU machine)")


def median_ms(fn, repeat, warmup=3):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--copy-mib", type=int, default=2048, help="bytes per copy, far above L2 (default 2048)")
    ap.add_argument("--gemm", type=int, default=8192, help="M = N = K of the bf16 product (default 8192)")
    ap.add_argument("--repeat", type=int, default=20)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("ceilings.py: PyTorch sees no CUDA device")

    n = args.copy_mib * 1024 * 1024 // 4
    src = torch.rand(n, device="cuda")
    dst = torch.empty_like(src)
    copy_ms = median_ms(lambda: dst.copy_(src), args.repeat)
    if not torch.equal(src, dst):
        sys.exit("ceilings.py: the copy is wrong")
    del src, dst

    size = args.gemm
    a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(size, size, device="cuda", dtype=torch.bfloat16)
    gemm_ms = median_ms(lambda: torch.matmul(a, b, out=c), args.repeat)

    properties = torch.cuda.get_device_properties(0)
    print(json.dumps({
        "device": properties.name,
        "copy_bytes": 2 * n * 4, "copy_ms": round(copy_ms, 3),
        "copy_gb_per_s": round(2 * n * 4 / (copy_ms / 1000) / 1e9, 1),
        "gemm_mnk": size, "gemm_ms": round(gemm_ms, 3),
        "gemm_bf16_tflops": round(2 * size ** 3 / (gemm_ms / 1000) / 1e12, 1),
        "repeats": args.repeat, "torch": torch.__version__,
    }))


if __name__ == "__main__":
    main()
