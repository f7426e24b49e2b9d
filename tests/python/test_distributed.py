#!/usr/bin/python3
"""syncbn.torch over torch.distributed (gloo, CPU), 2 and 3 processes spawned
with torch.multiprocessing and a file:// rendezvous (no torchrun):

 - DDP training: a small CNN whose BatchNorms are converted to syncbn's
   SyncBatchNorm trains k steps with uneven (and, for 3 processes, one empty)
   per-rank batches; losses, parameters and running statistics must match one
   process training nn.BatchNorm2d on the concatenated batch; the same with
   two views of each batch through the network before each backward, and
   with broadcast_buffers=False. The negative
   control (the same DDP run with local nn.BatchNorm2d) must fail that check.
 - the layer alone: y, dx, the ranks' summed grad_weight/grad_bias, running
   statistics and num_batches_tracked against a float64 reference on the
   concatenated batch; uneven and empty ranks, 2-D..5-D, channels_last,
   bfloat16, float64 (a module made .double(), to 1e-12), momentum None,
   no tracking, eval (and that eval does not communicate), a sub-group
   given as process_group;
 - a rank whose layer has a different C: every process raises
   SBN_STATUS_MISMATCH (no hang); a rank's bad input: its own error there,
   SBN_STATUS_PEER_FAILED elsewhere (also a float64 input to a float32
   module on one rank, and inputs the package itself refuses: float32 to a
   float16 module, a meta tensor); the group works afterwards;
 - processes that end without dist.destroy_process_group exit with 0;
 - one module applied to two batches before the backward (contrastive
   learning's two views, uneven and empty ranks): x gradients, the summed
   weight/bias gradients and the running statistics against PyTorch's
   float64 BatchNorm2d applied to the two concatenated batches, with one
   backward of both losses and with the first view's backward first.

Usage: test_distributed.py [P ...]   (default: 2 3)"""
import gc
import os
import sys
import time
import weakref
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import syncbn
import syncbn.torch as sbn
from syncbn._group import torch_group
from sbn_testlib import Reference, check, expect, finish, rel_err, spawn_ranks, to_layout

STEPS = 5
SPLITS = {2: [7, 5], 3: [5, 0, 7]}    # per-rank batch of the DDP runs
MODULE_SPLITS = {2: [1, 4], 3: [3, 0, 4]}
MODULE_CASES = [  # name, spatial, channels_last, dtype, momentum, affine, track
    ("4-D channels_last", (5, 4), True, torch.float32, 0.1, True, True),
    ("2-D, momentum None", (), False, torch.float32, None, True, True),
    ("3-D, no running stats", (7,), False, torch.float32, 0.1, True, False),
    ("5-D channels_last, affine off, momentum None", (2, 3, 2), True, torch.float32, None, False, True),
    ("4-D bfloat16 channels_last", (5, 4), True, torch.bfloat16, 0.1, True, True),
    ("4-D float64 (module.double()) channels_last", (5, 4), True, torch.float64, 0.1, True, True),
    ("3-D float64, momentum None, affine off", (7,), False, torch.float64, None, False, True),
]
# Made with running statistics, then running_mean/var set to None (test-time
# adaptation does this): PyTorch then normalizes with the batch's statistics in
# training and in eval, like a layer without them, but still counts batches.
DROPPED_BUFFERS = "4-D, running buffers set to None after construction"
MODULE_CASES.append((DROPPED_BUFFERS, (5, 4), False, torch.float32, 0.1, True, False))
C_MODULE = 3
TIMEOUT_S = 240
TOL_TRAIN = 1e-5  # justified in compare_training


# ---------------------------------------------------------------- data
def make_model():
    torch.manual_seed(123)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Conv2d(8, 8, 3, stride=2, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4), nn.BatchNorm1d(4))


def ddp_batch(step, n):
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(n, 3, 8, 8, generator=g) * 2 + 0.5
    return x, torch.randint(0, 4, (n,), generator=g)


def module_data(case_idx, step, n, spatial):
    g = torch.Generator().manual_seed(5000 + 100 * case_idx + step)
    shape = (n, C_MODULE) + tuple(spatial)
    mean = (3 * torch.randn(C_MODULE, generator=g, dtype=torch.float64)).view(1, -1, *[1] * len(spatial))
    return mean + torch.randn(shape, generator=g, dtype=torch.float64), \
        torch.randn(shape, generator=g, dtype=torch.float64)


def module_params(case_idx):
    g = torch.Generator().manual_seed(77 + case_idx)
    return torch.rand(C_MODULE, generator=g) + 0.5, torch.randn(C_MODULE, generator=g)


def rank_slice(split, rank):
    lo = sum(split[:rank])
    return slice(lo, lo + split[rank])


# ---------------------------------------------------------------- workers
def train(model, P, rank, channels_last, distributed, two_views=False, broadcast_buffers=True):
    split = SPLITS[P] if distributed else [sum(SPLITS[P])]
    n_global = sum(split)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    net = nn.parallel.DistributedDataParallel(model, broadcast_buffers=broadcast_buffers) \
        if distributed else model
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for step in range(STEPS):
        x, t = ddp_batch(step, n_global)
        x = x.to(next(model.parameters()).dtype)
        sl = rank_slice(split, rank)
        x, t = x[sl], t[sl]
        if channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        loss_sum = F.cross_entropy(net(x), t, reduction="sum")
        if two_views:  # a second view through the same network before the backward
            loss_sum = loss_sum + F.cross_entropy(net(x.flip(-1) * 0.5 + 0.25), t, reduction="sum")
        # DDP averages gradients over the P ranks: scale so the average is the
        # gradient of the global mean loss.
        opt.zero_grad()
        (loss_sum * (len(split) / n_global)).backward()
        opt.step()
        total = loss_sum.detach().double().clone()
        if distributed:
            dist.all_reduce(total)
        losses.append(total.item() / n_global)
    return {"losses": losses, "state": {k: v.detach().clone() for k, v in model.state_dict().items()}}


def module_case(rank, P, idx, case):
    name, spatial, cl, dtype, momentum, affine, track = case
    split = MODULE_SPLITS[P]
    dropped = name == DROPPED_BUFFERS
    m = sbn.SyncBatchNorm(C_MODULE, momentum=momentum, affine=affine,
                          track_running_stats=track or dropped)
    if dropped:
        m.running_mean = m.running_var = None
    if dtype == torch.float64:
        m = m.double()
    if affine:
        w, b = module_params(idx)
        with torch.no_grad():
            m.weight.copy_(w), m.bias.copy_(b)
    out = {"y": [], "dx": [], "gw": [], "gb": []}
    tg = torch_group(None)
    for step in range(4):
        training = step < 3
        m.train(training)
        x, dy = module_data(idx, step, sum(split), spatial)
        sl = rank_slice(split, rank)
        x = to_layout(x[sl].to(dtype), cl).requires_grad_()
        calls = tg.calls
        y = m(x)
        if not training:
            out["eval_calls"] = tg.calls - calls
        else:
            out["train_calls"] = tg.calls - calls
        if affine:
            m.weight.grad = m.bias.grad = None
        y.backward(dy[sl].to(dtype))
        out["y"].append(y.detach().double())
        out["dx"].append(x.grad.double())
        out["cl_kept"] = out.get("cl_kept", True) and (
            not cl or len(spatial) != 2 or y.is_contiguous(memory_format=torch.channels_last))
        if affine:
            out["gw"].append(m.weight.grad.clone()), out["gb"].append(m.bias.grad.clone())
    if track:
        out["rm"], out["rv"] = m.running_mean.clone(), m.running_var.clone()
    if track or dropped:
        out["nbt"] = int(m.num_batches_tracked)
    return out


def strides_case(rank, P):
    """Inputs expanded along C and transposed, in a synchronized training
    forward and in eval: do y and dx get the strides nn.BatchNorm2d gives on
    this rank's input? (True per case.)"""
    n = MODULE_SPLITS[P][rank]
    g = torch.Generator().manual_seed(40 + rank)
    out = []
    for x in (torch.randn(n, 1, 4, 5, generator=g).expand(n, C_MODULE, 4, 5),
              torch.randn(n, C_MODULE, 5, 4, generator=g).transpose(2, 3)):
        for training in (True, False):
            ours, ref = sbn.SyncBatchNorm(C_MODULE).train(training), nn.BatchNorm2d(C_MODULE).train(training)
            a, b = x.detach().requires_grad_(), x.detach().requires_grad_()
            ya, yb = ours(a), ref(b)  # (a rank's batch may be empty: PyTorch's output then too)
            dy = torch.randn(ya.shape, generator=g)
            da, = torch.autograd.grad(ya, a, dy)
            db, = torch.autograd.grad(yb, b, dy)
            out.append(ya.stride() == yb.stride() and da.stride() == db.stride())
    return out


def subgroup_case(rank, P):
    """P = 3: a layer on new_group([0, 2]); rank 1 trains alone (plain BN)."""
    pg02 = dist.new_group([0, 2])  # (every rank creates every group)
    pg1 = dist.new_group([1])      # a group of one: plain BatchNorm
    x, _ = module_data(99, 0, 9, (4,))
    m = sbn.SyncBatchNorm(C_MODULE, process_group=pg1 if rank == 1 else pg02)
    m(x[3 * rank:3 * rank + 3].float())
    return {"rm": m.running_mean.clone(), "rv": m.running_var.clone()}


VIEW_SPLITS = {2: ([3, 2], [2, 4]), 3: ([3, 2, 4], [2, 0, 3])}


def two_views_data(P):
    """Both views' global batches (float64) and output gradients, and the
    module's weight and bias."""
    g = torch.Generator().manual_seed(4321)
    n1, n2 = (sum(s) for s in VIEW_SPLITS[P])
    x1 = torch.randn(n1, 4, 3, 3, generator=g, dtype=torch.float64) * 2 + 1
    x2 = torch.randn(n2, 4, 3, 3, generator=g, dtype=torch.float64) * 0.5 - 3
    dy1 = torch.randn(x1.shape, generator=g, dtype=torch.float64)
    dy2 = torch.randn(x2.shape, generator=g, dtype=torch.float64)
    w = torch.linspace(0.5, 1.5, 4, dtype=torch.float64)
    b = torch.linspace(-0.2, 0.3, 4, dtype=torch.float64)
    return x1, x2, dy1, dy2, w, b


def two_views(rank, P, first_view_first):
    """One module on two batches before its backward."""
    x1, x2, dy1, dy2, w, b = two_views_data(P)
    s1, s2 = (rank_slice(s, rank) for s in VIEW_SPLITS[P])
    m = sbn.SyncBatchNorm(4, momentum=0.2)
    with torch.no_grad():
        m.weight.copy_(w), m.bias.copy_(b)
    v1 = x1[s1].float().requires_grad_()
    v2 = x2[s2].float().requires_grad_()
    l1 = (m(v1) * dy1[s1].float()).sum()
    l2 = (m(v2) * dy2[s2].float()).sum()
    if first_view_first:
        l1.backward()
        l2.backward()
    else:
        (l1 + l2).backward()
    return {"dx1": v1.grad, "dx2": v2.grad, "gw": m.weight.grad, "gb": m.bias.grad,
            "rm": m.running_mean.clone(), "rv": m.running_var.clone(), "nbt": int(m.num_batches_tracked)}


def misuse(rank, P):
    res = {}
    m = sbn.SyncBatchNorm(5 if rank == P - 1 else 4)
    t0 = time.monotonic()
    try:
        m(torch.randn(3, m.num_features, 2))
        res["mismatch"] = ("no error", "")
    except syncbn.SyncBNError as e:
        res["mismatch"] = (e.status, str(e))
    res["mismatch_s"] = time.monotonic() - t0
    res["mismatch_nbt"] = int(m.num_batches_tracked)
    m = sbn.SyncBatchNorm(4)
    try:
        m(torch.randn(4) if rank == 0 else torch.randn(3, 4, 2))  # a 1-D input on rank 0
        res["local"] = ("no error", "")
    except syncbn.SyncBNError as e:
        res["local"] = (e.status, str(e))
    try:  # a float64 input to this float32 module on the last rank
        m(torch.randn(3, 4, 2, dtype=torch.float64 if rank == P - 1 else torch.float32))
        res["dtype"] = ("no error", "")
    except syncbn.SyncBNError as e:
        res["dtype"] = (e.status, str(e))
    # Inputs refused by the package's own checks, before the library: the
    # peers must fail too (sbn_bn_fail_call), not wait or pair with its next call.
    h = sbn.SyncBatchNorm(4).half()
    t0 = time.monotonic()
    try:  # a float32 input to this float16 module on rank 0
        h(torch.randn(3, 4, 2) if rank == 0 else torch.randn(3, 4, 2).half())
        res["half"] = ("no error", "", False)
    except syncbn.SyncBNError as e:
        res["half"] = (e.status, str(e), isinstance(e, ValueError))
    res["half_s"] = time.monotonic() - t0
    try:  # a meta input (no data) to a module with data on the last rank
        m(torch.empty(3, 4, 2, device="meta") if rank == P - 1 else torch.randn(3, 4, 2))
        res["meta"] = ("no error", "")
    except syncbn.SyncBNError as e:
        res["meta"] = (e.status, str(e))
    try:
        m(torch.randn(3, 4, 2))
        h(torch.randn(3, 4, 2).half())
        res["after"] = "ok"
    except syncbn.SyncBNError as e:
        res["after"] = str(e)
    try:  # every rank empty: success, running statistics kept; the batch counted, as
        # torch.nn.SyncBatchNorm.forward counts every training call (nbt 1 -> 2), so
        # that momentum None then averages the next batch with factor 1/3, as PyTorch's
        x = torch.randn(0, 4, 2, requires_grad=True)
        rm = m.running_mean.clone()
        m(x).sum().backward()
        kept, nbt = torch.equal(rm, m.running_mean), int(m.num_batches_tracked)
        m.momentum = None
        batches = [torch.randn(4, 4, 2, dtype=torch.float64,
                               generator=torch.Generator().manual_seed(900 + r)) * 2 + r for r in range(P)]
        ref = rm.double() * (2 / 3) + torch.cat(batches).mean((0, 2)) / 3
        m(batches[rank].float())
        err = (m.running_mean.double() - ref).abs().max().item()
        res["all_empty"] = "ok" if kept and nbt == 2 and err < 1e-6 else \
            "running stats kept %s, nbt %d after the empty step, then momentum None mean err %.2e" % (kept, nbt, err)
    except syncbn.SyncBNError as e:
        res["all_empty"] = str(e)
    return res


def worker(rank, P, init_file):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank, world_size=P,
                            timeout=timedelta(seconds=60))
    out = {"ddp_sync": train(sbn.convert_sync_batchnorm(make_model()), P, rank, P == 2, True)}
    out["ddp_two_views"] = train(sbn.convert_sync_batchnorm(make_model()), P, rank, False, True, True)
    # DDP without its buffer broadcast: the running statistics agree anyway,
    # each rank's layer computing them from the same global batch statistics.
    out["ddp_no_broadcast"] = train(sbn.convert_sync_batchnorm(make_model()), P, rank, P == 2, True,
                                    broadcast_buffers=False)
    out["strides"] = strides_case(rank, P)
    if 0 not in SPLITS[P]:  # local BatchNorm cannot train on an empty rank
        out["ddp_local"] = train(make_model(), P, rank, P == 2, True)
    out["module"] = [module_case(rank, P, i, c) for i, c in enumerate(MODULE_CASES)]
    if P == 3:
        out["subgroup"] = subgroup_case(rank, P)
    out["misuse"] = misuse(rank, P)
    out["two_views"] = [two_views(rank, P, first) for first in (False, True)]
    dist.barrier()
    # The layers used the world group; destroying it must free it (and join
    # its threads) now, not at interpreter shutdown.
    world = weakref.ref(dist.group.WORLD)
    dist.destroy_process_group()
    gc.collect()
    out["pg_freed"] = world() is None
    return out


def exit_child(rank, P, init_file):
    """A script that trains with the layer and ends without
    dist.destroy_process_group (PyTorch does not require it)."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank, world_size=P,
                            timeout=timedelta(seconds=60))
    m = sbn.SyncBatchNorm(3)
    for _ in range(5):
        m(torch.randn(4, 3, 2, requires_grad=True)).sum().backward()


def exit_without_destroy(P, trials):
    """Every process exits with status 0 (the library's collectives once left
    gloo holding tensors whose release needed the interpreter after it had
    finalized: std::terminate, SIGABRT, in most runs)."""
    import subprocess
    import tempfile
    codes = []
    for _ in range(trials):
        with tempfile.TemporaryDirectory() as d:
            ps = [subprocess.Popen([sys.executable, __file__, "--exit-child", str(r), str(P), d + "/rdv"],
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                  for r in range(P)]
            for p in ps:
                try:
                    out = p.communicate(timeout=TIMEOUT_S)[0]
                except subprocess.TimeoutExpired:
                    p.kill()
                    out = p.communicate()[0] + " (timed out)"
                codes.append((p.returncode, out.strip().splitlines()[-1:] if out.strip() else []))
    bad = [c for c in codes if c[0] != 0]
    expect("%d processes ending without dist.destroy_process_group, %d runs: every exit status 0" % (P, trials),
           not bad, str(bad[:2]))


# ---------------------------------------------------------------- checks
def compare_training(P, runs, ref32, ref64, forwards=STEPS):
    names = {"weights/biases": lambda k: not ("running" in k or "num_batches" in k),
             "running stats": lambda k: "running" in k}
    # Tolerances: ours and PyTorch's single-process float32 run both carry float32
    # rounding (conv sums split differently across ranks, DDP's float32 gradient
    # average, statistics in float64 vs float32) amplified by 5 SGD steps with
    # momentum. The float32 reference itself differs from the float64 one by
    # the amount printed below (~4e-7); 1e-5 is 25x that, while local
    # BatchNorm on 5-7 images per rank is off by 1e-1.
    tol = TOL_TRAIN
    print("  float32 single-process reference vs float64: params %.1e, running stats %.1e, losses %.1e"
          % (max(rel_err(ref32["state"][k], ref64["state"][k]) for k in ref32["state"] if names["weights/biases"](k)),
             max(rel_err(ref32["state"][k], ref64["state"][k]) for k in ref32["state"] if names["running stats"](k)),
             max(abs(a - b) for a, b in zip(ref32["losses"], ref64["losses"]))))
    ok = True
    for label, run in runs:
        for r, res in enumerate(run):
            for what, sel in names.items():
                err = max(rel_err(res["state"][k], ref32["state"][k]) for k in ref32["state"] if sel(k))
                ok &= check("%s rank %d: %s vs single process" % (label, r, what), err, tol) or label == "local BN"
            nbt = [int(res["state"][k]) for k in res["state"] if "num_batches" in k]
            if label != "local BN":
                expect("%s rank %d: num_batches_tracked == %d" % (label, r, forwards), all(n == forwards for n in nbt))
        lerr = max(abs(a - b) / max(1.0, abs(b)) for a, b in zip(run[0]["losses"], ref32["losses"]))
        print("    losses %s: %s (single process: %s)" % (label, " ".join("%.5f" % v for v in run[0]["losses"]),
                                                         " ".join("%.5f" % v for v in ref32["losses"])))
        check("%s: per-step losses vs single process" % label, lerr, tol) if label != "local BN" else None
    return ok


def run(P):
    print("=== %d processes (gloo, file:// rendezvous), per-rank DDP batches %s" % (P, SPLITS[P]), flush=True)
    res = spawn_ranks(worker, P, TIMEOUT_S)
    if res is None:
        return

    print("DDP training, %d steps (channels_last: %s):" % (STEPS, P == 2))
    ref32 = train(make_model(), P, 0, P == 2, False)
    ref64 = train(make_model().double(), P, 0, False, False)
    compare_training(P, [("SyncBN", [r["ddp_sync"] for r in res])], ref32, ref64)
    if "ddp_local" in res[0]:
        local = [r["ddp_local"] for r in res]
        err = max(rel_err(local[0]["state"][k], ref32["state"][k]) for k in ref32["state"] if "num_batches" not in k)
        expect("negative control: local BatchNorm under DDP fails the same check (err %.2e > tol %.0e)" % (err, TOL_TRAIN),
               err > TOL_TRAIN)
        print("    losses local BN: %s" % " ".join("%.5f" % v for v in local[0]["losses"]))
    print("DDP training with broadcast_buffers=False:")
    compare_training(P, [("SyncBN, no buffer broadcast", [r["ddp_no_broadcast"] for r in res])], ref32, ref64)
    expect("inputs expanded along C and transposed: y and dx strides as nn.BatchNorm2d's, every rank",
           all(all(r["strides"]) for r in res), str([r["strides"] for r in res]))
    print("DDP training, two views of each batch through the network before each backward:")
    compare_training(P, [("SyncBN two views", [r["ddp_two_views"] for r in res])],
                     train(make_model(), P, 0, False, False, True),
                     train(make_model().double(), P, 0, False, False, True), 2 * STEPS)

    print("the layer alone, per-rank N = %s, C = %d, 3 training steps + eval:" % (MODULE_SPLITS[P], C_MODULE))
    for idx, case in enumerate(MODULE_CASES):
        name, spatial, cl, dtype, momentum, affine, track = case
        w, b = module_params(idx)
        ref = Reference(C_MODULE, momentum=momentum, affine=affine, track=track, weight=w, bias=b)
        split = MODULE_SPLITS[P]
        e = {"y": 0.0, "dx": 0.0, "g": 0.0}
        for step in range(4):
            x, dy = module_data(idx, step, sum(split), spatial)
            xs = [x[rank_slice(split, r)].to(dtype) for r in range(P)]
            dys = [dy[rank_slice(split, r)].to(dtype) for r in range(P)]
            ys, dxs, gw, gb = ref.step(xs, dys, step < 3)
            for r in range(P):
                e["y"] = max(e["y"], rel_err(res[r]["module"][idx]["y"][step], ys[r]))
                e["dx"] = max(e["dx"], rel_err(res[r]["module"][idx]["dx"][step], dxs[r]))
            if affine and gw is not None:
                e["g"] = max(e["g"], rel_err(sum(res[r]["module"][idx]["gw"][step] for r in range(P)), gw),
                             rel_err(sum(res[r]["module"][idx]["gb"][step] for r in range(P)), gb))
        # float32: one rounding of unit-scale y/dx (~6e-8); bfloat16: 2^-9 relative,
        # tolerance 2^-8. Grad sums: float32 per rank, summed here.
        # float64: both sides compute in float64 (~1e-15 here); 1e-12.
        tol = 2.0 ** -8 if dtype == torch.bfloat16 else 1e-12 if dtype == torch.float64 else 1e-6
        print("  %s:" % name)
        check("    y (every rank)", e["y"], tol)
        check("    dx (every rank)", e["dx"], tol)
        tol_state = 1e-12 if dtype == torch.float64 else 1e-6
        check("    sum over ranks of grad_weight/grad_bias", e["g"], tol_state)
        if track:
            check("    running_mean/var (every rank)", max(max(rel_err(r["module"][idx]["rm"], ref.rm),
                                                             rel_err(r["module"][idx]["rv"], ref.rv)) for r in res),
                  tol_state)
            expect("    running stats in the module's dtype", all(r["module"][idx]["rm"].dtype == (
                torch.float64 if dtype == torch.float64 else torch.float32) for r in res))
        if track or name == DROPPED_BUFFERS:
            expect("    num_batches_tracked == 3", all(r["module"][idx]["nbt"] == 3 for r in res))
        expect("    training forward communicates, eval forward does not",
               all(r["module"][idx]["train_calls"] > 0 and r["module"][idx]["eval_calls"] == 0 for r in res),
               "collectives per forward: train %d, eval %d" % (res[0]["module"][idx]["train_calls"],
                                                              res[0]["module"][idx]["eval_calls"]))
        expect("    channels_last kept", all(r["module"][idx]["cl_kept"] for r in res))

    if P == 3:
        print("process_group = new_group([0, 2]):")
        x, _ = module_data(99, 0, 9, (4,))
        r02 = Reference(C_MODULE)
        r02.step([x[0:3].float(), x[6:9].float()], [x[0:3], x[6:9]], True)
        r1 = Reference(C_MODULE)
        r1.step([x[3:6].float()], [x[3:6]], True)
        err = max(rel_err(res[r]["subgroup"]["rm"], r02.rm) for r in (0, 2))
        err = max(err, max(rel_err(res[r]["subgroup"]["rv"], r02.rv) for r in (0, 2)))
        check("  ranks 0 and 2: running stats of their two batches", err, 1e-6)
        check("  rank 1 alone: running stats of its own batch",
              max(rel_err(res[1]["subgroup"]["rm"], r1.rm), rel_err(res[1]["subgroup"]["rv"], r1.rv)), 1e-6)

    expect("dist.destroy_process_group frees the group the layers used, on every rank",
           all(r["pg_freed"] for r in res))
    print("misuse:")
    mm = [r["misuse"] for r in res]
    print("    rank 0 sees: %s" % mm[0]["mismatch"][1])
    expect("  different C on rank %d: SBN_STATUS_MISMATCH on every process" % (P - 1),
           all(m["mismatch"][0] == "SBN_STATUS_MISMATCH" for m in mm),
           ", ".join("rank %d %s in %.2f s" % (r, m["mismatch"][0], m["mismatch_s"]) for r, m in enumerate(mm)))
    expect("  no state changed by the failed forward", all(m["mismatch_nbt"] == 0 for m in mm))
    print("    rank 1 sees: %s" % mm[1]["local"][1])
    expect("  1-D input on rank 0: its own error there, PEER_FAILED elsewhere",
           mm[0]["local"][0] == "SBN_STATUS_INVALID_ARGUMENT" and
           all(m["local"][0] == "SBN_STATUS_PEER_FAILED" for m in mm[1:]))
    print("    rank %d sees: %s" % (P - 1, mm[P - 1]["dtype"][1]))
    expect("  float64 input to a float32 module on rank %d: INVALID_ARGUMENT naming both there, PEER_FAILED elsewhere" % (P - 1),
           mm[P - 1]["dtype"][0] == "SBN_STATUS_INVALID_ARGUMENT" and "float64" in mm[P - 1]["dtype"][1] and
           "float32" in mm[P - 1]["dtype"][1] and all(m["dtype"][0] == "SBN_STATUS_PEER_FAILED" for m in mm[:-1]))
    print("    rank 1 sees: %s" % mm[1]["half"][1])
    expect("  float32 input to a float16 module on rank 0 (the package's check): a ValueError there, "
           "PEER_FAILED elsewhere, within 10 s",
           mm[0]["half"][0] == "SBN_STATUS_INVALID_ARGUMENT" and mm[0]["half"][2] and
           all(m["half"][0] == "SBN_STATUS_PEER_FAILED" and "rank 0 failed" in m["half"][1] for m in mm[1:]) and
           all(m["half_s"] < 10 for m in mm),
           ", ".join("rank %d %s in %.2f s" % (r, m["half"][0], m["half_s"]) for r, m in enumerate(mm)))
    expect("  meta input on rank %d (the package's check): its error there, PEER_FAILED elsewhere" % (P - 1),
           mm[P - 1]["meta"][0] == "SBN_STATUS_INVALID_ARGUMENT" and "meta" in mm[P - 1]["meta"][1] and
           all(m["meta"][0] == "SBN_STATUS_PEER_FAILED" for m in mm[:-1]),
           ", ".join("rank %d %s" % (r, m["meta"][0]) for r, m in enumerate(mm)))
    expect("  the group works afterwards", all(m["after"] == "ok" for m in mm), str([m["after"] for m in mm]))
    expect("  every rank empty: success, running stats kept, the batch counted (as PyTorch's)",
           all(m["all_empty"] == "ok" for m in mm), str([m["all_empty"] for m in mm]))

    print("one module on two batches before its backward (two views), per-rank N = %s and %s:"
          % VIEW_SPLITS[P])
    x1, x2, dy1, dy2, w, b = two_views_data(P)
    peer = nn.BatchNorm2d(4, momentum=0.2).double()
    with torch.no_grad():
        peer.weight.copy_(w), peer.bias.copy_(b)
    p1, p2 = x1.clone().requires_grad_(), x2.clone().requires_grad_()
    ((peer(p1) * dy1).sum() + (peer(p2) * dy2).sum()).backward()
    for i, label in enumerate(("one backward of both", "the first view's backward first")):
        runs = [r["two_views"][i] for r in res]
        e = max(rel_err(torch.cat([t["dx1"] for t in runs]), p1.grad),
                rel_err(torch.cat([t["dx2"] for t in runs]), p2.grad))
        check("  %s: dx vs float64 BatchNorm2d" % label, e, 1e-5)
        e = max(rel_err(sum(t["gw"] for t in runs), peer.weight.grad),
                rel_err(sum(t["gb"] for t in runs), peer.bias.grad))
        check("  %s: summed grad_weight, grad_bias" % label, e, 1e-5)
        e = max(max(rel_err(t["rm"], peer.running_mean), rel_err(t["rv"], peer.running_var)) for t in runs)
        check("  %s: running stats on every rank" % label, e, 1e-6)
        expect("  %s: num_batches_tracked == 2" % label, all(t["nbt"] == 2 for t in runs))


if __name__ == "__main__":
    torch.set_num_threads(1)
    os.environ.setdefault("SYNCBN_NUM_THREADS", "1")
    print("syncbn %s from %s, torch %s" % (syncbn.__version__, syncbn.library_path, torch.__version__))
    if sys.argv[1:2] == ["--exit-child"]:
        exit_child(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
        sys.exit(0)
    for P in [int(a) for a in sys.argv[1:]] or [2, 3]:
        run(P)
    exit_without_destroy(2, 6)
    finish("syncbn.torch distributed")
