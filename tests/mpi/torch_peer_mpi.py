#!/usr/bin/python3
"""PyTorch as the peer, through MPI ranks.

For several configurations this writes every rank's inputs to a temporary
directory, runs `mpirun -np P torch_peer_mpi DIR` (our SyncBatchNorm over the
MPI backend, one process per rank), and compares each rank's outputs with
torch.nn.functional.batch_norm + autograd on the CONCATENATED batch, in
float64, over several training steps and one eval step:
  y      |y - ref| / max(1, |ref|)          <= 2e-6 (float32 output of float64 math: ~4 ulps)
  dx     max|dx - ref| / max|ref|           <= 1e-5
  grads  |sum_r g_r - ref| / (1 + sum|g_r|) <= 1e-6 (per-rank float32 grads sum to the single-rank ones)
  stats  |s - ref| / (1 + |ref|)            <= 1e-6 (float32 running statistics)
float64 layers (the configurations with 64 last): everything in float64 on both sides,
  tolerance 1e-12 (unit-scale data; the ill-conditioned one, mean 1e3 x std: the
  synchronized variance's u (mean/std)^2 = 1e-10, tolerance 1e-9)
Usage: torch_peer_mpi.py BINARY
"""
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
import torch.nn.functional as F

TOL = {"y": 2e-6, "dx": 1e-5, "gw": 1e-6, "gb": 1e-6, "rm": 1e-6, "rv": 1e-6}

# (ranks, ndim, channels_last, C, affine, track, momentum or None, steps, per-rank N, spatial, mean scale)
CONFIGS = [
    (2, 4, False, 5, True, True, 0.1, 3, [3, 2], [3, 4], 1.0),
    (3, 3, True, 3, True, True, None, 3, [2, 0, 4], [5], 1.0),  # channels-last, an empty rank
    (4, 2, False, 6, False, False, 0.1, 2, [2, 3, 2, 4], [], 1.0),  # no affine, no tracking
    (4, 5, False, 2, True, True, 0.3, 2, [1, 2, 0, 3], [2, 3, 2], 1e3),  # 5-D, ill-conditioned
    (3, 4, True, 4, True, True, 0.1, 2, [2, 1, 3], [2, 3], 1.0),  # channels-last 4-D
    (3, 4, False, 3, True, True, 0.1, 2, [0, 0, 0], [2, 2], 1.0),  # every rank empty: global count 0
    # float64 layers (bits 64)
    (3, 4, True, 4, True, True, 0.1, 3, [2, 0, 3], [2, 3], 1.0, 64),
    (2, 2, False, 5, False, True, None, 2, [4, 1], [], 1.0, 64),
    (4, 5, False, 2, True, True, 0.3, 2, [1, 2, 0, 3], [2, 3, 2], 1e3, 64),
]
TOL_F64 = 1e-12


def mpirun(np_, binary, d):
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    cmd = ["mpirun", "--oversubscribe", "-np", str(np_), binary, d]
    return subprocess.run(cmd, env=env, timeout=120, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def to_mem(t, cl):  # logical (N, C, *) -> memory order of the layout
    return t.movedim(1, -1).contiguous() if cl else t.contiguous()


def from_mem(a, shape, cl):  # memory-order array -> logical (N, C, *)
    if cl:
        mshape = [shape[0]] + list(shape[2:]) + [shape[1]]
        return torch.from_numpy(a.reshape(mshape)).movedim(-1, 1)
    return torch.from_numpy(a.reshape(shape))


def run_config(binary, cfg, seed):
    P, ndim, cl, C, affine, track, mom, steps, Ns, sp, scale = cfg[:11]
    bits = cfg[11] if len(cfg) > 11 else 32
    ext, npd = ("f64", np.float64) if bits == 64 else ("f32", np.float32)
    store = (lambda t: t) if bits == 64 else (lambda t: t.float())  # storage dtype
    g = torch.Generator().manual_seed(seed)
    shapes = [[n, C] + sp for n in Ns]
    w = store(0.5 + torch.rand(C, generator=g, dtype=torch.float64))
    b = store(torch.rand(C, generator=g, dtype=torch.float64) - 0.5)
    std = 0.2 + 2 * torch.rand(C, generator=g, dtype=torch.float64)
    mean = scale * std * (torch.rand(C, generator=g, dtype=torch.float64) - 0.3)
    bshape = [1, C] + [1] * (ndim - 2)
    xs = [[store(mean.view(bshape) + std.view(bshape) * torch.randn(s, generator=g, dtype=torch.float64)) for s in shapes]
          for _ in range(steps + 1)]
    dys = [[store(torch.randn(s, generator=g, dtype=torch.float64)) for s in shapes] for _ in range(steps + 1)]
    worst = dict.fromkeys(TOL, 0.0)
    with tempfile.TemporaryDirectory(prefix="sbn_torch_mpi_") as d:
        with open(os.path.join(d, "config.txt"), "w") as f:
            f.write(f"{ndim} {int(cl)} {C} {int(affine)} {int(track)} {mom if mom is not None else -1} 1e-5 {steps}"
                    f"{' 64' if bits == 64 else ''}\n")
            for s in shapes:
                f.write(" ".join(map(str, s)) + "\n")
        w.numpy().tofile(os.path.join(d, "w." + ext))
        b.numpy().tofile(os.path.join(d, "b." + ext))
        for s in range(steps + 1):
            for r in range(P):
                to_mem(xs[s][r], cl).numpy().tofile(os.path.join(d, f"x_{s}_{r}.{ext}"))
                to_mem(dys[s][r], cl).numpy().tofile(os.path.join(d, f"dy_{s}_{r}.{ext}"))
        t0 = time.time()
        res = mpirun(P, binary, d)
        if res.returncode != 0:
            print(res.stdout)
            print(f"  mpirun failed with exit {res.returncode}")
            return None
        wall = time.time() - t0

        def vec(name, s, r):
            return torch.from_numpy(np.fromfile(os.path.join(d, f"{name}_{s}_{r}.{ext}"), dtype=npd)).double()

        def out(name, s, r, shape):
            return from_mem(np.fromfile(os.path.join(d, f"{name}_{s}_{r}.{ext}"), dtype=npd), shape, cl).double()

        rm = torch.zeros(C, dtype=torch.float64) if track else None
        rv = torch.ones(C, dtype=torch.float64) if track else None
        nbt = 0
        for s in range(steps + 1):
            training = s < steps
            wt = w.double().clone().requires_grad_(affine)
            bt = b.double().clone().requires_grad_(affine)
            xr = [x.double().clone().requires_grad_(True) for x in xs[s]]
            if training or track:
                if training and track and sum(Ns) > 0:  # an empty global batch observes nothing
                    nbt += 1
                factor = (1.0 / nbt if mom is None else mom) if training and track else 0.0
                y = F.batch_norm(torch.cat(xr), rm, rv, wt if affine else None, bt if affine else None,
                                 training=training or not track, momentum=factor, eps=1e-5)
                ys = list(torch.split(y, Ns))
            else:  # eval without running statistics: each rank's own batch (PyTorch's behaviour)
                ys = [F.batch_norm(x, None, None, wt if affine else None, bt if affine else None, training=True, eps=1e-5)
                      for x in xr]
            torch.autograd.backward(ys, [dy.double() for dy in dys[s]])
            dxmax = max(float(x.grad.abs().max()) if x.numel() else 0.0 for x in xr)
            sgw, sgb, agw, agb = 0, 0, 1, 1
            for r in range(P):
                yo, dxo = out("y", s, r, shapes[r]), out("dx", s, r, shapes[r])
                if yo.numel():
                    ref = ys[r].detach()
                    worst["y"] = max(worst["y"], float(((yo - ref).abs() / ref.abs().clamp(min=1)).max()))
                    worst["dx"] = max(worst["dx"], float((dxo - xr[r].grad).abs().max()) / (dxmax + 1e-30))
                if affine:
                    gw, gb = vec("gw", s, r), vec("gb", s, r)
                    sgw, sgb, agw, agb = sgw + gw, sgb + gb, agw + gw.abs(), agb + gb.abs()
                if track:
                    for name, refv in (("rm", rm), ("rv", rv)):
                        o = vec(name, s, r)
                        worst[name] = max(worst[name], float(((o - refv).abs() / (1 + refv.abs())).max()))
            if affine:
                worst["gw"] = max(worst["gw"], float(((sgw - wt.grad).abs() / agw).max()))
                worst["gb"] = max(worst["gb"], float(((sgb - bt.grad).abs() / agb).max()))
    return worst, wall


def main():
    binary = sys.argv[1] if len(sys.argv) > 1 else "build/tests/mpi/torch_peer_mpi"
    print(f"PyTorch {torch.__version__} (float64, F.batch_norm + autograd on the concatenated batch) vs syncbn over MPI ranks")
    failed = 0
    for i, cfg in enumerate(CONFIGS):
        P, ndim, cl, C, affine, track, mom, steps, Ns, sp, scale = cfg[:11]
        f64 = len(cfg) > 11 and cfg[11] == 64
        tol = {k: (1e-9 if scale > 1 else TOL_F64) for k in TOL} if f64 else TOL
        desc = (f"{'float64 ' if f64 else ''}np={P} {ndim}D {'CL' if cl else 'CF'} C={C} affine={int(affine)} track={int(track)} "
                f"mom={mom} steps={steps}+eval N={Ns} spatial={sp} scale={scale:g}")
        r = run_config(binary, cfg, 1234 + i)
        if r is None:
            print(f"FAIL {desc}")
            failed += 1
            continue
        worst, wall = r
        bad = [k for k in tol if not worst[k] <= tol[k]]
        failed += bool(bad)
        print(f"{'FAIL' if bad else 'ok  '} {desc} ({wall:.1f} s)")
        print("     " + "  ".join(f"{k} {worst[k]:.1e} (tol {tol[k]:.0e})" for k in tol))
    print(f"\n{len(CONFIGS)} configurations, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
