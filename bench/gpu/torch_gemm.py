#!/usr/bin/env python3
"""bench/gpu/torch_gemm.py [OURS.txt] - torch.matmul (cuBLAS) on the Llama-3.1-8B layer shapes
at the row counts of gpu_matmul_bench, timed like it (median of 20 launches after 3 warm-ups,
weights rotated over 4 copies, random inputs), as y = x W^T with bf16 x and W (fp32
accumulation, cuBLAS's default). With OURS.txt (gpu_matmul_bench's output) it prints kiln's
TFLOP/s beside cuBLAS's and the ratio. kiln's kernels take f32 activations (x) with bf16
weights: the same weight bytes, twice the activation bytes, and CUDA-core FMAs, not tensor cores.
The gate+up row is two products (cuBLAS has no fused GLU epilogue): their summed time.
"""
import sys

import torch

SHAPES = [  # name as gpu_matmul_bench prints it, [(n_out, n_in) per product]
    ("qkv 6144x4096", [(6144, 4096)]),
    ("o 4096x4096", [(4096, 4096)]),
    ("gate+up (glu) 2x14336x4096", [(14336, 4096), (14336, 4096)]),
    ("down 4096x14336", [(4096, 14336)]),
    ("head 128256x4096", [(128256, 4096)]),
]
MS = [1, 2, 4, 8, 16, 64, 256, 2048]
COPIES, WARM, REPS = 4, 3, 20


def ours(path):
    t = {}
    if not path:
        return t
    for line in open(path):
        parts = line.rsplit(None, 4)
        if len(parts) == 5 and parts[1].isdigit():
            try:
                t[(parts[0].strip(), int(parts[1]))] = float(parts[4])
            except ValueError:
                pass
    return t


def main():
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device("cuda")
    mine = ours(sys.argv[1] if len(sys.argv) > 1 else None)
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}")
    print(f"{'shape':28s} {'M':>6s} {'cuBLAS us':>10s} {'TFLOP/s':>9s} {'kiln TFLOP/s':>13s} {'kiln/cuBLAS':>12s}")
    g = torch.Generator(device=dev)
    g.manual_seed(1)
    for name, prods in SHAPES:
        ws = [[(torch.rand(n_out, n_in, device=dev, generator=g, dtype=torch.float32) - 0.5)
               .mul_(0.1).to(torch.bfloat16) for (n_out, n_in) in prods] for _ in range(COPIES)]
        for M in MS:
            x = (torch.rand(M, prods[0][1], device=dev, generator=g) * 2 - 1).to(torch.bfloat16)
            times = []
            for r in range(WARM + REPS):
                wc = ws[r % COPIES]
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                for w in wc:
                    torch.matmul(x, w.t())
                b.record()
                b.synchronize()
                if r >= WARM:
                    times.append(a.elapsed_time(b))
            times.sort()
            ms = times[REPS // 2]
            flop = sum(2.0 * M * n_out * n_in for (n_out, n_in) in prods)
            tf = flop / (ms * 1e-3) / 1e12
            k = mine.get((name, M))
            ks = f"{k:13.2f} {k / tf:12.3f}" if k is not None else f"{'-':>13s} {'-':>12s}"
            print(f"{name:28s} {M:6d} {ms * 1e3:10.2f} {tf:9.2f} {ks}")
        del ws
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
