#!/usr/bin/python3
"""The Python layer's own cost per call: syncbn.torch.SyncBatchNorm against
torch.nn.BatchNorm2d on a tiny tensor (2, 16, 4, 4), where the kernels take
about a microsecond and what is timed is the module, autograd and ctypes.
Best of 7 batches of 3000 calls, 1 thread, microseconds per call.

    PYTHONPATH=python /usr/bin/python3 bench/python_overhead.py
"""
import time

import torch

import syncbn.torch as sbn


def best_us(fn, n=3000, batches=7):
    for _ in range(300):
        fn()
    best = float("inf")
    for _ in range(batches):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t0) / n)
    return best * 1e6


def main():
    torch.set_num_threads(1)
    x = torch.randn(2, 16, 4, 4, requires_grad=True)
    g = torch.randn(2, 16, 4, 4)
    print("(2, 16, 4, 4) float32, 1 thread, us per call (best of 7 x 3000)")
    print("%-22s %10s %14s %10s" % ("module", "forward", "fwd+backward", "backward"))
    for name, mod in (("syncbn SyncBatchNorm", sbn.SyncBatchNorm(16)), ("torch BatchNorm2d", torch.nn.BatchNorm2d(16))):
        f = best_us(lambda: mod(x))
        fb = best_us(lambda: mod(x).backward(g))
        print("%-22s %10.1f %14.1f %10.1f" % (name, f, fb, fb - f))


if __name__ == "__main__":
    main()
