#!/usr/bin/python3
"""syncbn.torch on CUDA tensors (the library's CUDA kernels), against a
float64 reference on the CPU (F.batch_norm + autograd on the concatenated
batch):

 - one process: float32, bfloat16 and float16; channels-first and
   channels_last; 2-D, 4-D and 5-D; affine off, momentum None, no running
   statistics; 3 training steps and an eval step: y, dx, grad_weight,
   grad_bias, running statistics and num_batches_tracked; the same layer on
   a side stream (torch.cuda.stream) gives the same bits; load_state_dict
   between steps is seen on the GPU; one module on two batches before its
   backward (records of forwards on the GPU);
 - misuse: a CPU input to a CUDA module and the reverse (PyTorch's "same
   device" error), a float64 module on CUDA (refused: SBN_STATUS_UNSUPPORTED);
 - two and three processes sharing the GPU over gloo (host-staged
   statistics), uneven batches and an empty rank: every rank's y and dx, the summed parameter
   gradients and the running statistics against one process on the
   concatenated batch.

Prints a SKIP line and exits 0 when PyTorch has no CUDA device. With a GPU,
a library without CUDA support is a failure (this is the GPU check).

Usage: test_cuda.py"""
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

import syncbn
import syncbn.torch as sbn
from syncbn import _lib
from sbn_testlib import Reference, check, expect, finish, rel_err, spawn_ranks, to_layout

C = 6
# float32: y and dx rounded once at unit scale (~6e-8) after float64 sums;
# 16-bit storage: one rounding of y/dx (2^-9 relative for bfloat16, 2^-12
# for float16) on top of inputs already rounded to it (the reference sees
# the rounded inputs), so 2^-8 and 2^-10. State (float32 on the GPU): 1e-6.
TOL = {torch.float32: 1e-6, torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -10}
TOL_STATE = 1e-6
CASES = [  # name, spatial, channels_last, momentum, affine, track
    ("4-D", (5, 4), False, 0.1, True, True),
    ("4-D channels_last", (5, 4), True, 0.1, True, True),
    ("2-D, momentum None", (), False, None, True, True),
    ("5-D channels_last, affine off", (2, 3, 2), True, 0.1, False, True),
    ("3-D, no running stats", (7,), False, 0.1, True, False),
]
SPLITS = {2: [3, 4], 3: [3, 0, 4]}  # per-rank batches
TIMEOUT_S = 240


def data(seed, n, spatial):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn((n, C) + spatial, generator=g) * 3 + torch.arange(C).view((1, C) + (1,) * len(spatial))
    dy = torch.randn((n, C) + spatial, generator=g)
    return x, dy


def params(seed):
    g = torch.Generator().manual_seed(1000 + seed)
    return torch.rand(C, generator=g) + 0.5, torch.randn(C, generator=g)


def run_module(m, x, dy, channels_last, stream=None):
    """One forward + backward on the GPU (on `stream` if given); returns y,
    dx, grad_weight, grad_bias (on the CPU) and whether y kept the layout."""
    xg = to_layout(x.cuda(), channels_last).requires_grad_()
    if m.affine:
        m.weight.grad = m.bias.grad = None
    if stream is not None:
        stream.wait_stream(torch.cuda.current_stream())  # x and the module are ready
    with torch.cuda.stream(stream if stream is not None else torch.cuda.current_stream()):
        y = m(xg)
        y.backward(to_layout(dy.cuda().to(x.dtype), channels_last))
    torch.cuda.synchronize()
    gw = m.weight.grad.cpu() if m.affine else None
    gb = m.bias.grad.cpu() if m.affine else None
    kept = y.is_contiguous(memory_format=torch.channels_last) if channels_last and y.dim() == 4 else True
    return y.detach().cpu(), xg.grad.cpu(), gw, gb, kept


def one_process():
    print("one process, GPU %s:" % torch.cuda.get_device_name(0), flush=True)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for idx, (name, spatial, cl, momentum, affine, track) in enumerate(CASES):
            w, b = params(idx)
            m = sbn.SyncBatchNorm(C, momentum=momentum, affine=affine, track_running_stats=track).cuda()
            if affine:
                with torch.no_grad():
                    m.weight.copy_(w), m.bias.copy_(b)
            ref = Reference(C, momentum=momentum, affine=affine, track=track, weight=w, bias=b)
            e = {"y": 0.0, "dx": 0.0, "g": 0.0}
            kept = True
            for step in range(4):
                training = step < 3
                m.train(training)
                x, dy = data(idx * 10 + step, 8, spatial)
                x, dy = x.to(dtype), dy.to(dtype)
                y, dx, gw, gb, k = run_module(m, x, dy, cl)
                kept &= k
                ys, dxs, rgw, rgb = ref.step([x], [dy], training)
                e["y"] = max(e["y"], rel_err(y, ys[0]))
                e["dx"] = max(e["dx"], rel_err(dx, dxs[0]))
                if affine and rgw is not None:
                    e["g"] = max(e["g"], rel_err(gw, rgw), rel_err(gb, rgb))
            print("  %s %s:" % (name, str(dtype).replace("torch.", "")))
            check("    y", e["y"], TOL[dtype])
            check("    dx", e["dx"], TOL[dtype])
            if affine:
                check("    grad_weight/grad_bias", e["g"], TOL_STATE)
            if track:
                check("    running_mean/var", max(rel_err(m.running_mean.cpu(), ref.rm),
                                                  rel_err(m.running_var.cpu(), ref.rv)), TOL_STATE)
                expect("    num_batches_tracked == 3", int(m.num_batches_tracked) == 3,
                       str(int(m.num_batches_tracked)))
            expect("    channels_last kept", kept)

    # A side stream gives the same bits; load_state_dict between steps is seen.
    x, dy = data(77, 8, (5, 4))
    m1, m2 = sbn.SyncBatchNorm(C).cuda(), sbn.SyncBatchNorm(C).cuda()
    a = run_module(m1, x, dy, False)
    b = run_module(m2, x, dy, False, stream=torch.cuda.Stream())
    expect("a side stream: y, dx, grads and running stats bitwise equal",
           all(torch.equal(p, q) for p, q in zip(a[:4], b[:4])) and
           torch.equal(m1.running_mean, m2.running_mean) and torch.equal(m1.running_var, m2.running_var))
    state = {k: v.clone() for k, v in m1.state_dict().items()}
    run_module(m1, x * 2, dy, False)
    m1.load_state_dict(state)
    m2.load_state_dict(state)
    a, b = run_module(m1, x, dy, False), run_module(m2, x, dy, False)
    expect("load_state_dict between steps: the layer starts from the loaded state",
           torch.equal(m1.running_mean, m2.running_mean) and int(m1.num_batches_tracked) == 2 and
           int(m2.num_batches_tracked) == 2, "nbt %d / %d" % (int(m1.num_batches_tracked),
                                                           int(m2.num_batches_tracked)))
    # An ill-conditioned channel: mean 1e4 times its standard deviation.
    xi = torch.randn(16, C, 4, 4, dtype=torch.float64) + 1e4
    mi = sbn.SyncBatchNorm(C).cuda()
    refi = Reference(C)
    yi = mi(xi.float().cuda()).detach().cpu()
    ys, _, _, _ = refi.step([xi.float()], [torch.zeros_like(xi).float()], True)
    # (x - mean) is formed first, exactly near the mean: float32 accuracy.
    check("mean 1e4 x std: y vs float64 reference (float32 input)", rel_err(yi, ys[0]), 2e-6)
    # One module on two batches before its backward (records on the GPU), in
    # both orders, against PyTorch's float64 BatchNorm2d on the CPU.
    x1, dy1 = data(91, 6, (3, 3))
    x2, dy2 = data(92, 4, (3, 3))
    w, b = params(91)
    peer = torch.nn.BatchNorm2d(C).double()
    with torch.no_grad():
        peer.weight.copy_(w), peer.bias.copy_(b)
    p1, p2 = x1.double().requires_grad_(), (x2 * 0.5 - 3).double().requires_grad_()
    ((peer(p1) * dy1.double()).sum() + (peer(p2) * dy2.double()).sum()).backward()
    for first in (False, True):
        m = sbn.SyncBatchNorm(C).cuda()
        with torch.no_grad():
            m.weight.copy_(w), m.bias.copy_(b)
        v1 = x1.cuda().requires_grad_()
        v2 = (x2 * 0.5 - 3).cuda().requires_grad_()
        l1, l2 = (m(v1) * dy1.cuda()).sum(), (m(v2) * dy2.cuda()).sum()
        if first:
            l1.backward()
            l2.backward()
        else:
            (l1 + l2).backward()
        label = "the first batch's backward first" if first else "one backward of both"
        check("two batches through one module, %s: dx" % label,
              max(rel_err(v1.grad.cpu(), p1.grad), rel_err(v2.grad.cpu(), p2.grad)), TOL[torch.float32])
        check("two batches through one module, %s: grads, running stats" % label,
              max(rel_err(m.weight.grad.cpu(), peer.weight.grad), rel_err(m.bias.grad.cpu(), peer.bias.grad),
                  rel_err(m.running_mean.cpu(), peer.running_mean),
                  rel_err(m.running_var.cpu(), peer.running_var)), TOL_STATE)


def misuse():
    print("misuse:")
    m = sbn.SyncBatchNorm(C).cuda()
    for name, fn in (("CPU input to a CUDA module", lambda: m(torch.randn(4, C))),
                     ("CUDA input to a CPU module", lambda: sbn.SyncBatchNorm(C)(torch.randn(4, C).cuda()))):
        try:
            fn()
            expect(name + ": an error", False, "no exception")
        except RuntimeError as e:
            expect(name + ": an error naming both devices", "same device" in str(e), str(e))
    try:
        sbn.SyncBatchNorm(C).double().cuda()(torch.randn(4, C, dtype=torch.float64).cuda())
        expect("float64 module on CUDA: refused", False, "no exception")
    except syncbn.SyncBNError as e:
        expect("float64 module on CUDA: refused with a clear status",
               e.status in ("SBN_STATUS_UNSUPPORTED", "SBN_STATUS_INVALID_ARGUMENT"), str(e))
    expect("the module works after the errors", m(torch.randn(4, C).cuda()).shape == (4, C))


def rank_slice(split, r):
    return slice(sum(split[:r]), sum(split[:r + 1]))


def worker(rank, P, init_file):
    torch.cuda.set_device(0)
    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank, world_size=P,
                            timeout=timedelta(seconds=60))
    out = []
    for idx, (name, spatial, cl, momentum, affine, track) in enumerate(CASES[:4]):
        w, b = params(idx)
        m = sbn.SyncBatchNorm(C, momentum=momentum, affine=affine).cuda()
        if affine:
            with torch.no_grad():
                m.weight.copy_(w), m.bias.copy_(b)
        res = {"y": [], "dx": [], "gw": [], "gb": []}
        for step in range(3):
            x, dy = data(idx * 10 + step, sum(SPLITS[P]), spatial)
            rs = rank_slice(SPLITS[P], rank)
            y, dx, gw, gb, _ = run_module(m, x[rs], dy[rs], cl)
            res["y"].append(y), res["dx"].append(dx), res["gw"].append(gw), res["gb"].append(gb)
        res["rm"], res["rv"] = m.running_mean.cpu(), m.running_var.cpu()
        res["nbt"] = int(m.num_batches_tracked)
        out.append(res)
    dist.destroy_process_group()
    return out


def processes(P):
    print("%d processes on one GPU (gloo, host-staged statistics), per-rank N = %s:" % (P, SPLITS[P]),
          flush=True)
    res = spawn_ranks(worker, P, TIMEOUT_S)
    if res is None:
        return
    for idx, (name, spatial, cl, momentum, affine, track) in enumerate(CASES[:4]):
        w, b = params(idx)
        ref = Reference(C, momentum=momentum, affine=affine, weight=w, bias=b)
        e = {"y": 0.0, "dx": 0.0, "g": 0.0}
        for step in range(3):
            x, dy = data(idx * 10 + step, sum(SPLITS[P]), spatial)
            xs = [x[rank_slice(SPLITS[P], r)] for r in range(P)]
            dys = [dy[rank_slice(SPLITS[P], r)] for r in range(P)]
            ys, dxs, gw, gb = ref.step(xs, dys, True)
            for r in range(P):
                e["y"] = max(e["y"], rel_err(res[r][idx]["y"][step], ys[r]))
                e["dx"] = max(e["dx"], rel_err(res[r][idx]["dx"][step], dxs[r]))
            if affine:
                e["g"] = max(e["g"], rel_err(sum(res[r][idx]["gw"][step] for r in range(P)), gw),
                             rel_err(sum(res[r][idx]["gb"][step] for r in range(P)), gb))
        print("  %s:" % name)
        check("    y (every rank)", e["y"], TOL[torch.float32])
        check("    dx (every rank)", e["dx"], TOL[torch.float32])
        if affine:
            check("    sum over ranks of grad_weight/grad_bias", e["g"], TOL_STATE)
        check("    running_mean/var (every rank)", max(max(rel_err(r[idx]["rm"], ref.rm),
                                                         rel_err(r[idx]["rv"], ref.rv)) for r in res), TOL_STATE)
        expect("    num_batches_tracked == 3", all(r[idx]["nbt"] == 3 for r in res))


def main():
    if not torch.cuda.is_available():
        print("SKIP: PyTorch sees no CUDA device (torch %s)" % torch.__version__)
        return 0
    n = _lib.cuda_device_count()
    print("libsyncbn %s at %s: %d CUDA device(s)" % (syncbn.version(), _lib.library_path, n))
    if not expect("the library has CUDA support and sees the GPU", n > 0,
                  "build with nvcc so that libsyncbn_cuda.so.1 sits next to libsyncbn"):
        return finish("syncbn.torch CUDA checks")
    one_process()
    misuse()
    processes(2)
    processes(3)
    return finish("syncbn.torch CUDA checks")


if __name__ == "__main__":
    sys.exit(main())
