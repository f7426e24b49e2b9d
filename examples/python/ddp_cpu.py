#!/usr/bin/env python3
"""Train a small CNN with syncbn's CPU SyncBatchNorm under
DistributedDataParallel (gloo), 4 images per process.

    python examples/python/ddp_cpu.py                 # spawns 2 processes itself
    python examples/python/ddp_cpu.py --procs 4 --steps 50

Under a launcher that sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT
(one process per rank), it joins that job instead (env:// rendezvous).
"""
import argparse
import os
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

import syncbn.torch as sbn


def model():
    torch.manual_seed(0)  # the same initial weights everywhere (DDP also broadcasts them)
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 4))


def batch(step, rank, n):
    """Synthetic: the class is which colour channel is brightest."""
    g = torch.Generator().manual_seed(step * 1000 + rank)
    t = torch.randint(0, 4, (n,), generator=g)
    x = torch.randn(n, 3, 16, 16, generator=g)
    x[t < 3, t[t < 3]] += 1.0
    return x, t


def train(rank, world, steps, per_rank, init):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    net = sbn.convert_sync_batchnorm(model())           # BatchNorm2d -> SyncBatchNorm
    ddp = nn.parallel.DistributedDataParallel(net)       # CPU: no device_ids
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    for step in range(steps):
        x, t = batch(step, rank, per_rank)
        loss = F.cross_entropy(ddp(x), t)
        opt.zero_grad()
        loss.backward()
        opt.step()
        loss = loss.detach()
        dist.all_reduce(loss)
        if rank == 0 and (step % 5 == 0 or step == steps - 1):
            print("step %3d  loss %.4f" % (step, loss.item() / world), flush=True)
    rm = net[1].running_mean.clone()
    all_rm = [torch.empty_like(rm) for _ in range(world)]
    dist.all_gather(all_rm, rm)
    if rank == 0:
        same = all(torch.equal(all_rm[0], r) for r in all_rm)
        print("%d processes, %s; running_mean identical on every rank: %s"
              % (world, type(net[1]).__module__ + "." + type(net[1]).__name__, same))
    # Release DDP (it holds the process group) and let every rank finish its
    # last collective before the group goes: a gloo group torn down at
    # interpreter exit while a peer still talks to it can end the process
    # with std::terminate.
    del ddp, opt
    dist.barrier()
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--per-rank", type=int, default=4)
    a = ap.parse_args()
    if "WORLD_SIZE" in os.environ:  # started by a launcher
        train(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), a.steps, a.per_rank, "env://")
        return
    with tempfile.TemporaryDirectory() as d:
        mp.spawn(train, args=(a.procs, a.steps, a.per_rank, "file://" + os.path.join(d, "rendezvous")),
                 nprocs=a.procs)


if __name__ == "__main__":
    main()
