#!/usr/bin/python3
"""PyTorch peer for syncbn-bench: times F.batch_norm training forward and
autograd backward on the CPU for the shapes listed in a CSV written by the
bench (label,n,c,hw,layout,dtype), with the same thread count and the same
kind of input rotation (several copies whose total exceeds the caches).
Prints one line per shape: label,layout,dtype,fwd_ms,bwd_ms (medians).
Usage: torch_bn.py SHAPES.csv THREADS ROTATE_MIB MIN_REPS MAX_S"""
import statistics
import sys
import time

try:
    import torch
    import torch.nn.functional as F
except Exception as e:  # the bench reports the peer as unavailable
    print("#torch unavailable:", e)
    sys.exit(3)

path, threads, rotate_mib, min_reps, max_s = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
torch.set_num_threads(threads)
print("#torch", torch.__version__, "threads", torch.get_num_threads(), flush=True)
dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

for line in open(path):
    label, n, c, hw, layout, dt = line.strip().split(",")
    n, c, hw = int(n), int(c), int(hw)
    side = int(round(hw ** 0.5))
    shape = (n, c) if hw == 1 else (n, c, side, side)
    dtype = dtypes[dt]
    elem = 2 if dtype != torch.float32 else 4
    tensor_bytes = n * c * hw * elem
    k = max(2, min(64, int(rotate_mib * 2**20 / (2 * tensor_bytes)) + 1))
    xs, dys = [], []
    x0 = torch.randn(shape, dtype=dtype)  # random once, copied k times (randn is slow)
    if layout == "cl" and len(shape) == 4:
        x0 = x0.contiguous(memory_format=torch.channels_last)
    dy0 = torch.randn_like(x0)
    for _ in range(k):
        xs.append(x0.clone().requires_grad_())
        dys.append(dy0.clone())
    w = torch.ones(c, requires_grad=True)
    b = torch.zeros(c, requires_grad=True)
    rm, rv = torch.zeros(c), torch.ones(c)
    fwd, bwd = [], []
    t_start = time.perf_counter()
    i = 0
    while i < min_reps + 1 or (time.perf_counter() - t_start < max_s and i < 50):
        x, dy = xs[i % k], dys[i % k]
        x.grad = None
        t0 = time.perf_counter()
        y = F.batch_norm(x, rm, rv, w, b, True, 0.1, 1e-5)
        t1 = time.perf_counter()
        y.backward(dy)
        t2 = time.perf_counter()
        if i > 0:  # the first is a warm-up
            fwd.append(t1 - t0)
            bwd.append(t2 - t1)
        i += 1
    print(f"{label},{layout},{dt},{statistics.median(fwd)*1e3:.4f},{statistics.median(bwd)*1e3:.4f}", flush=True)
    del xs, dys
