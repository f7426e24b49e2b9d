#!/usr/bin/python3
"""PyTorch as the peer: for several scenarios, generate per-rank inputs, run
them through our SyncBN on P thread ranks (the C driver torch_peer), and
compare with F.batch_norm + autograd on the concatenated batch (PyTorch's
SyncBatchNorm refuses CPU tensors; on one process it is exactly this).

Usage: torch_peer.py PATH_TO_torch_peer_BINARY [python driver for other
launchers, e.g. an mpirun wrapper, may import run_scenarios()]."""
import os
import subprocess
import sys
import tempfile

import torch
import torch.nn.functional as F

# Tolerances against PyTorch's float32 CPU kernels (ours are float64-
# accurate, see tests/bn_case.c; the slack is PyTorch's float32 rounding):
TOL_Y = 1e-5        # |y| <= ~8: a few float32 ulps of PyTorch's own error
TOL_DX_REL = 1e-4   # relative to max |dx|
TOL_STATS_REL = 1e-5
TOL_GRAD_REL = 1e-4  # relative to 1 + |grad|, sums of up to ~2000 terms

SCENARIOS = [
    # P, C, spatial, per-rank N, layout(1=channels-last), affine, track, momentum, steps
    (2, 3, (4, 5), [3, 2], 0, True, True, 0.1, 3),
    (3, 4, (6,), [2, 0, 5], 1, True, True, None, 3),
    (4, 5, (3, 2, 2), [1, 2, 0, 3], 1, True, True, 0.3, 2),
    (4, 2, (), [3, 1, 2, 4], 0, False, True, 0.1, 2),
    (2, 6, (5, 5), [2, 3], 0, True, False, 0.1, 2),
    (1, 3, (7, 3), [4], 1, True, True, 0.1, 2),
    # every rank empty (global count 0): success, empty outputs, zero
    # gradients, running statistics and num_batches_tracked untouched
    (3, 4, (3, 3), [0, 0, 0], 0, True, True, 0.1, 2),
    (2, 3, (), [0, 0], 1, True, True, None, 2),
    (1, 2, (5,), [0], 0, True, True, 0.3, 2),
]


def to_memory(t, layout):
    """logical (N, C, *) -> the memory order our layout expects"""
    if layout and t.dim() > 2:
        perm = [0] + list(range(2, t.dim())) + [1]
        t = t.permute(*perm)
    return t.contiguous().numpy().astype("float32").tobytes()


def from_memory(buf, shape, layout):
    import numpy as np
    a = torch.from_numpy(np.frombuffer(buf, dtype=np.float32).copy())
    if layout and len(shape) > 2:
        mem = [shape[0]] + list(shape[2:]) + [shape[1]]
        inv = [0, len(shape) - 1] + list(range(1, len(shape) - 1))
        return a.reshape(mem).permute(*inv)
    return a.reshape(shape)


def read(d, name, shape=None, layout=0):
    with open(os.path.join(d, name), "rb") as f:
        buf = f.read()
    if shape is None:
        import numpy as np
        return torch.from_numpy(np.frombuffer(buf, dtype=np.float32).copy())
    return from_memory(buf, shape, layout)


def run_scenario(binary, sc, seed, launcher=None):
    P, C, spatial, Ns, layout, affine, track, momentum, steps = sc
    g = torch.Generator().manual_seed(seed)
    shapes = [(n, C) + tuple(spatial) for n in Ns]
    w = (0.5 + torch.rand(C, generator=g)) if affine else None
    b = (torch.rand(C, generator=g) - 0.5) if affine else None
    worst = {"y": 0.0, "dx": 0.0, "gw": 0.0, "gb": 0.0, "rm": 0.0, "rv": 0.0}
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "config.txt"), "w") as f:
            f.write(f"{P} {C} {2 + len(spatial)} {layout} {int(affine)} {int(track)} "
                    f"{-1 if momentum is None else momentum} 1e-5 {steps}\n")
            for s in shapes:
                f.write(" ".join(map(str, s)) + "\n")
        if affine:
            open(os.path.join(d, "w.f32"), "wb").write(w.numpy().tobytes())
            open(os.path.join(d, "b.f32"), "wb").write(b.numpy().tobytes())
        xs, dys = [], []
        for s in range(steps + 1):
            mean = torch.randn(C, generator=g) * 3
            std = 0.5 + torch.rand(C, generator=g) * 2
            bshape = (1, C) + (1,) * len(spatial)
            xs.append([torch.randn(sh, generator=g) * std.view(bshape) + mean.view(bshape) for sh in shapes])
            dys.append([torch.randn(sh, generator=g) for sh in shapes])
            for r in range(P):
                open(os.path.join(d, f"x_{s}_{r}.f32"), "wb").write(to_memory(xs[s][r], layout))
                open(os.path.join(d, f"dy_{s}_{r}.f32"), "wb").write(to_memory(dys[s][r], layout))
        cmd = (launcher or []) + [binary, d]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if res.returncode != 0:
            print(res.stdout, res.stderr)
            raise RuntimeError(f"{cmd} failed with {res.returncode}")

        rm = torch.zeros(C) if track else None
        rv = torch.ones(C) if track else None
        nbt = 0
        for s in range(steps + 1):
            training = s < steps
            wt = w.clone().requires_grad_() if affine else None
            bt = b.clone().requires_grad_() if affine else None
            if training or track:
                x = torch.cat(xs[s]).requires_grad_()
                if training and track and sum(Ns) > 0:  # an empty global batch observes nothing
                    nbt += 1
                mom = (1.0 / max(nbt, 1) if momentum is None else momentum) if (training and track) else 0.0
                y = F.batch_norm(x, rm, rv, wt, bt, training=training or not track, momentum=mom, eps=1e-5)
                y.backward(torch.cat(dys[s]))
                ys = list(torch.split(y.detach(), Ns))
                dxs = list(torch.split(x.grad, Ns))
            else:  # eval without tracking: each rank's own batch statistics
                ys, dxs = [], []
                for r in range(P):
                    x = xs[s][r].clone().requires_grad_()
                    y = F.batch_norm(x, None, None, wt, bt, training=True, eps=1e-5)
                    y.backward(dys[s][r])
                    ys.append(y.detach())
                    dxs.append(x.grad)
            dxmax = max((float(t.abs().max()) for t in dxs if t.numel()), default=0.0) + 1e-30
            for r in range(P):
                yo = read(d, f"y_{s}_{r}.f32", shapes[r], layout)
                dxo = read(d, f"dx_{s}_{r}.f32", shapes[r], layout)
                if yo.numel():
                    worst["y"] = max(worst["y"], float((yo - ys[r]).abs().max()))
                    worst["dx"] = max(worst["dx"], float((dxo - dxs[r]).abs().max()) / dxmax)
            if affine:
                gw = sum(read(d, f"gw_{s}_{r}.f32") for r in range(P))
                gb = sum(read(d, f"gb_{s}_{r}.f32") for r in range(P))
                worst["gw"] = max(worst["gw"], float(((gw - wt.grad).abs() / (1 + wt.grad.abs())).max()))
                worst["gb"] = max(worst["gb"], float(((gb - bt.grad).abs() / (1 + bt.grad.abs())).max()))
            if track:
                rmo, rvo = read(d, f"rm_{s}.f32"), read(d, f"rv_{s}.f32")
                worst["rm"] = max(worst["rm"], float(((rmo - rm).abs() / (1 + rm.abs())).max()))
                worst["rv"] = max(worst["rv"], float(((rvo - rv).abs() / (1 + rv.abs())).max()))
                nbto = int(open(os.path.join(d, f"nbt_{s}.txt")).read())
                if nbto != nbt:
                    raise AssertionError(f"num_batches_tracked {nbto} != torch {nbt}")
    return worst


def run_scenarios(binary, launcher=None, scenarios=SCENARIOS):
    bad = 0
    for i, sc in enumerate(scenarios):
        wst = run_scenario(binary, sc, 1000 + i, launcher)
        ok = (wst["y"] <= TOL_Y and wst["dx"] <= TOL_DX_REL and wst["gw"] <= TOL_GRAD_REL
              and wst["gb"] <= TOL_GRAD_REL and wst["rm"] <= TOL_STATS_REL and wst["rv"] <= TOL_STATS_REL)
        bad += not ok
        P, C, spatial, Ns, layout, affine, track, momentum, steps = sc
        print(f"{'ok  ' if ok else 'FAIL'} P={P} C={C} spatial={spatial} N={Ns} "
              f"{'CL' if layout else 'CF'} affine={affine} track={track} momentum={momentum}: "
              f"y {wst['y']:.1e} (tol {TOL_Y:.0e}) dx {wst['dx']:.1e} (tol {TOL_DX_REL:.0e} rel) "
              f"gw {wst['gw']:.1e} gb {wst['gb']:.1e} (tol {TOL_GRAD_REL:.0e}) "
              f"rm {wst['rm']:.1e} rv {wst['rv']:.1e} (tol {TOL_STATS_REL:.0e})")
    return bad


if __name__ == "__main__":
    torch.set_num_threads(1)
    failures = run_scenarios(sys.argv[1])
    print(f"{len(SCENARIOS)} scenarios vs PyTorch {torch.__version__}, {failures} failed")
    sys.exit(1 if failures else 0)
