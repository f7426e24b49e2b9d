#!/usr/bin/python3
"""syncbn.torch.SyncBatchNorm (one process: no group, plain BatchNorm) against
PyTorch's CPU nn.BatchNorm2d, forward + backward through autograd, on the
ResNet-50 BatchNorm shapes at N = 8, float32, same thread count for both;
and the same layer called through the C library directly (ctypes: forward,
zero_grad, backward on preallocated buffers), so that "module - direct" is
the Python layer's overhead (autograd, descriptors, O(C) parameter and
running-statistics copies, output allocation).

Inputs rotate over copies whose total exceeds ROTATE_MIB (caches), medians
of repeats. Usage: python_bn.py [--threads T] [--layout cf|cl] [--reps R] [--quick]
(run from the source tree: PYTHONPATH=python, or with syncbn installed)."""
import argparse
import ctypes
import statistics
import time

import torch
import torch.nn as nn

import syncbn
import syncbn.torch as sbn
from syncbn import _lib

SHAPES = [(8, 64, 112), (8, 256, 56), (8, 512, 28), (8, 1024, 14), (8, 2048, 7)]
SMALL = (8, 64, 4)  # where per-call overhead dominates


def inputs(shape, cl, rotate_mib):
    x0 = torch.randn(shape)
    if cl:
        x0 = x0.contiguous(memory_format=torch.channels_last)
    k = max(2, min(32, int(rotate_mib * 2**20 / (2 * x0.numel() * 4)) + 1))
    return [(x0.clone().requires_grad_(), torch.randn_like(x0)) for _ in range(k)]


def time_module(m, data, reps):
    times = []
    for i in range(reps + 2):
        x, dy = data[i % len(data)]
        x.grad = None
        m.weight.grad = m.bias.grad = None
        t0 = time.perf_counter()
        m(x).backward(dy)
        times.append(time.perf_counter() - t0)
    return statistics.median(times[2:]) * 1e3


def time_direct(C, data, cl, reps):
    """The C library through ctypes, no autograd and no copies."""
    layer = sbn._Layer(C, 1e-5, 0.1, True, True, None, (_lib.DEVICE_CPU, 0))
    lay = _lib.LAYOUT_CHANNELS_LAST if cl else _lib.LAYOUT_CHANNELS_FIRST
    def desc(t):  # one description per buffer (the module's are reused per shape)
        return _lib.Tensor(t.data_ptr(), t.dim(), (ctypes.c_int64 * _lib.MAX_DIMS)(*t.shape), _lib.DTYPE_FLOAT32, lay,
                           _lib.Device(_lib.DEVICE_CPU, 0))
    bufs = []
    for x, dy in data:
        y, dx = torch.empty_like(x), torch.empty_like(x)  # kept alive in bufs
        bufs.append((desc(x.detach()), desc(y), desc(dy), desc(dx), x, dy, y, dx))
    times = []
    for i in range(reps + 2):
        tx, ty, tdy, tdx = bufs[i % len(bufs)][:4]
        t0 = time.perf_counter()
        _lib.check(_lib.lib.sbn_bn_forward(layer.handle, ctypes.byref(ty), ctypes.byref(tx)))
        _lib.check(_lib.lib.sbn_bn_zero_grad(layer.handle))
        _lib.check(_lib.lib.sbn_bn_backward(layer.handle, ctypes.byref(tdx), ctypes.byref(tdy),
                                            ctypes.byref(tx)))
        times.append(time.perf_counter() - t0)
    return statistics.median(times[2:]) * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--layout", choices=["cf", "cl"], default="cf")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--rotate-mib", type=float, default=96)
    ap.add_argument("--quick", action="store_true",
                    help="the small shape only, 3 repeats (make test runs this: the bench keeps working)")
    a = ap.parse_args()
    if a.quick:
        a.reps, a.rotate_mib = 3, 1
    torch.set_num_threads(a.threads)  # syncbn.torch follows torch.get_num_threads()
    cl = a.layout == "cl"
    print("syncbn %s (%s), torch %s, %d threads, float32 %s, median of %d"
          % (syncbn.__version__, syncbn.library_path, torch.__version__, torch.get_num_threads(),
             "channels_last" if cl else "contiguous", a.reps))
    print("%-22s %10s %10s %8s %10s %10s" % ("shape (N, C, H=W)", "torch ms", "syncbn ms", "ratio",
                                            "direct ms", "overhead"))
    for n, c, hw in ([] if a.quick else SHAPES) + [SMALL]:
        data = inputs((n, c, hw, hw), cl, a.rotate_mib)
        ours, peer = sbn.SyncBatchNorm(c), nn.BatchNorm2d(c)
        t_peer = time_module(peer, data, a.reps)
        t_ours = time_module(ours, data, a.reps)
        t_direct = time_direct(c, data, cl, a.reps)
        print("%-22s %10.3f %10.3f %7.2fx %10.3f %8.0f us" % (
            "(%d, %d, %d)" % (n, c, hw), t_peer, t_ours, t_peer / t_ours, t_direct,
            (t_ours - t_direct) * 1e3), flush=True)


if __name__ == "__main__":
    main()
