#!/usr/bin/python3
"""Cost of synchronization through torch.distributed (gloo, loopback): per
training step (forward + backward) of syncbn.torch.SyncBatchNorm on a small
input (8, C, 4, 4), P processes, against the same layer unsynchronized (a
process group of one) and against raw gloo all-reduces: the two a minimal
SyncBN needs (2C+1 and 2C float64 values) and the four the custom group
issues (a 64-byte signature header before each payload; payloads of
P x (2C+1) and P x 2C values for the exact merge).
Usage: python_dist.py [P] (spawns P processes; default 2)."""
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import syncbn.torch as sbn

CS = [64, 256, 2048]
REPS = 200


def median_us(fn, reps=REPS):
    for _ in range(10):
        fn()
    dist.barrier()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e6


def worker(rank, P, init):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=P)
    alone = [dist.new_group([r]) for r in range(P)][rank]
    rows = []
    for C in CS:
        x = torch.randn(8, C, 4, 4, requires_grad=True)
        dy = torch.randn_like(x)
        synced, local = sbn.SyncBatchNorm(C), sbn.SyncBatchNorm(C, process_group=alone)

        def step(m):
            x.grad = None
            m.weight.grad = m.bias.grad = None
            m(x).backward(dy)

        t_sync = median_us(lambda: step(synced))
        t_local = median_us(lambda: step(local))
        a, b, h = torch.zeros(2 * C + 1, dtype=torch.float64), torch.zeros(2 * C, dtype=torch.float64), \
            torch.zeros(8, dtype=torch.float64)
        pa, pb = torch.zeros(P * (2 * C + 1), dtype=torch.float64), torch.zeros(P * 2 * C, dtype=torch.float64)
        t_raw2 = median_us(lambda: (dist.all_reduce(a), dist.all_reduce(b)))
        t_raw4 = median_us(lambda: (dist.all_reduce(h), dist.all_reduce(pa), dist.all_reduce(h),
                                    dist.all_reduce(pb)))
        rows.append((C, t_sync, t_local, t_raw2, t_raw4))
    if rank == 0:
        print("P = %d processes (gloo, loopback), input (8, C, 4, 4) float32, 1 thread each, median of %d"
              % (P, REPS))
        print("%6s %12s %12s %10s %16s %16s" % ("C", "synced us", "local us", "sync cost",
                                               "gloo 2 raw us", "gloo 4 as ours us"))
        for C, s, l, r2, r4 in rows:
            print("%6d %12.0f %12.0f %10.0f %16.0f %16.0f" % (C, s, l, s - l, r2, r4))
    dist.destroy_process_group()


if __name__ == "__main__":
    P = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    with tempfile.TemporaryDirectory() as d:
        mp.spawn(worker, args=(P, "file://" + os.path.join(d, "rv")), nprocs=P)
