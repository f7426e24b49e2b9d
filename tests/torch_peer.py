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
# float64 layers (param_dtype FLOAT64) against F.batch_norm in float64: both
# compute in float64 with different summation orders, which agree to ~1e-15
# on these unit-scale values; 1e-12 everywhere.
TOL_F64 = 1e-12
F64_SCENARIOS = [
    (2, 3, (4, 5), [3, 2], 0, True, True, 0.1, 3),
    (3, 4, (6,), [2, 0, 5], 1, True, True, None, 3),
    (4, 5, (3, 2, 2), [1, 2, 0, 3], 1, False, True, 0.3, 2),
    (2, 3, (), [40, 0], 0, True, True, 0.1, 2),
    (2, 6, (5, 5), [2, 3], 0, True, False, 0.1, 2),
    (2, 3, (3, 3), [0, 0], 1, True, True, 0.1, 2),
]


def to_memory(t, layout, np_dtype="float32"):
    """logical (N, C, *) -> the memory order our layout expects"""
    if layout and t.dim() > 2:
        perm = [0] + list(range(2, t.dim())) + [1]
        t = t.permute(*perm)
    return t.contiguous().numpy().astype(np_dtype).tobytes()


def from_memory(buf, shape, layout, np_dtype="float32"):
    import numpy as np
    a = torch.from_numpy(np.frombuffer(buf, dtype=np_dtype).copy())
    if layout and len(shape) > 2:
        mem = [shape[0]] + list(shape[2:]) + [shape[1]]
        inv = [0, len(shape) - 1] + list(range(1, len(shape) - 1))
        return a.reshape(mem).permute(*inv)
    return a.reshape(shape)


def read(d, name, shape=None, layout=0):
    np_dtype = "float64" if name.endswith(".f64") else "float32"
    with open(os.path.join(d, name), "rb") as f:
        buf = f.read()
    if shape is None:
        import numpy as np
        return torch.from_numpy(np.frombuffer(buf, dtype=np_dtype).copy())
    return from_memory(buf, shape, layout, np_dtype)


def run_scenario(binary, sc, seed, launcher=None, dtype=torch.float32):
    """dtype float64: a float64 layer, float64 data of full precision (.f64
    files, a 10th config value 64), the reference in float64."""
    P, C, spatial, Ns, layout, affine, track, momentum, steps = sc
    f64 = dtype == torch.float64
    ext, npd, bits = ("f64", "float64", " 64") if f64 else ("f32", "float32", "")
    g = torch.Generator().manual_seed(seed)
    shapes = [(n, C) + tuple(spatial) for n in Ns]
    w = (0.5 + torch.rand(C, generator=g, dtype=dtype)) if affine else None
    b = (torch.rand(C, generator=g, dtype=dtype) - 0.5) if affine else None
    worst = {"y": 0.0, "dx": 0.0, "gw": 0.0, "gb": 0.0, "rm": 0.0, "rv": 0.0}
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "config.txt"), "w") as f:
            f.write(f"{P} {C} {2 + len(spatial)} {layout} {int(affine)} {int(track)} "
                    f"{-1 if momentum is None else momentum} 1e-5 {steps}{bits}\n")
            for s in shapes:
                f.write(" ".join(map(str, s)) + "\n")
        if affine:
            open(os.path.join(d, "w." + ext), "wb").write(w.numpy().tobytes())
            open(os.path.join(d, "b." + ext), "wb").write(b.numpy().tobytes())
        xs, dys = [], []
        for s in range(steps + 1):
            mean = torch.randn(C, generator=g, dtype=dtype) * 3
            std = 0.5 + torch.rand(C, generator=g, dtype=dtype) * 2
            bshape = (1, C) + (1,) * len(spatial)
            xs.append([torch.randn(sh, generator=g, dtype=dtype) * std.view(bshape) + mean.view(bshape)
                       for sh in shapes])
            dys.append([torch.randn(sh, generator=g, dtype=dtype) for sh in shapes])
            for r in range(P):
                open(os.path.join(d, f"x_{s}_{r}.{ext}"), "wb").write(to_memory(xs[s][r], layout, npd))
                open(os.path.join(d, f"dy_{s}_{r}.{ext}"), "wb").write(to_memory(dys[s][r], layout, npd))
        cmd = (launcher or []) + [binary, d]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if res.returncode != 0:
            print(res.stdout, res.stderr)
            raise RuntimeError(f"{cmd} failed with {res.returncode}")

        rm = torch.zeros(C, dtype=dtype) if track else None
        rv = torch.ones(C, dtype=dtype) if track else None
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
                yo = read(d, f"y_{s}_{r}.{ext}", shapes[r], layout)
                dxo = read(d, f"dx_{s}_{r}.{ext}", shapes[r], layout)
                if yo.numel():
                    worst["y"] = max(worst["y"], float((yo - ys[r]).abs().max()))
                    worst["dx"] = max(worst["dx"], float((dxo - dxs[r]).abs().max()) / dxmax)
            if affine:
                gw = sum(read(d, f"gw_{s}_{r}.{ext}") for r in range(P))
                gb = sum(read(d, f"gb_{s}_{r}.{ext}") for r in range(P))
                worst["gw"] = max(worst["gw"], float(((gw - wt.grad).abs() / (1 + wt.grad.abs())).max()))
                worst["gb"] = max(worst["gb"], float(((gb - bt.grad).abs() / (1 + bt.grad.abs())).max()))
            if track:
                rmo, rvo = read(d, f"rm_{s}.{ext}"), read(d, f"rv_{s}.{ext}")
                worst["rm"] = max(worst["rm"], float(((rmo - rm).abs() / (1 + rm.abs())).max()))
                worst["rv"] = max(worst["rv"], float(((rvo - rv).abs() / (1 + rv.abs())).max()))
                nbto = int(open(os.path.join(d, f"nbt_{s}.txt")).read())
                if nbto != nbt:
                    raise AssertionError(f"num_batches_tracked {nbto} != torch {nbt}")
    return worst


def run_scenarios(binary, launcher=None, scenarios=SCENARIOS, dtype=torch.float32):
    bad = 0
    f64 = dtype == torch.float64
    ty, tdx, tg, ts = (TOL_F64,) * 4 if f64 else (TOL_Y, TOL_DX_REL, TOL_GRAD_REL, TOL_STATS_REL)
    for i, sc in enumerate(scenarios):
        wst = run_scenario(binary, sc, (2000 if f64 else 1000) + i, launcher, dtype)
        ok = (wst["y"] <= ty and wst["dx"] <= tdx and wst["gw"] <= tg
              and wst["gb"] <= tg and wst["rm"] <= ts and wst["rv"] <= ts)
        bad += not ok
        P, C, spatial, Ns, layout, affine, track, momentum, steps = sc
        print(f"{'ok  ' if ok else 'FAIL'} {'float64 ' if f64 else ''}P={P} C={C} spatial={spatial} N={Ns} "
              f"{'CL' if layout else 'CF'} affine={affine} track={track} momentum={momentum}: "
              f"y {wst['y']:.1e} (tol {ty:.0e}) dx {wst['dx']:.1e} (tol {tdx:.0e} rel) "
              f"gw {wst['gw']:.1e} gb {wst['gb']:.1e} (tol {tg:.0e}) "
              f"rm {wst['rm']:.1e} rv {wst['rv']:.1e} (tol {ts:.0e})")
    return bad


if __name__ == "__main__":
    torch.set_num_threads(1)
    failures = run_scenarios(sys.argv[1])
    failures += run_scenarios(sys.argv[1], scenarios=F64_SCENARIOS, dtype=torch.float64)
    print(f"{len(SCENARIOS) + len(F64_SCENARIOS)} scenarios vs PyTorch {torch.__version__} "
          f"({len(F64_SCENARIOS)} float64), {failures} failed")
    sys.exit(1 if failures else 0)
