"""Shared by the Python tests: a float64 reference (F.batch_norm + autograd on
the concatenated batch) and checks that print their evidence."""
import os
import sys
import tempfile
import time

import torch
import torch.multiprocessing as mp
import torch.nn.functional as F

FAILURES = []


def check(name, err, tol):
    """Print 'name: max err E (tol T) ok|FAIL'; remember failures."""
    ok = err <= tol
    print("  %-58s max err %.3e (tol %.1e) %s" % (name, err, tol, "ok" if ok else "FAIL"),
          flush=True)
    if not ok:
        FAILURES.append(name)
    return ok


def expect(name, cond, detail=""):
    print("  %-58s %s%s" % (name, "ok" if cond else "FAIL", (": " + detail) if detail else ""),
          flush=True)
    if not cond:
        FAILURES.append(name)
    return cond


def finish(what):
    if FAILURES:
        print("FAILED %d checks in %s: %s" % (len(FAILURES), what, ", ".join(FAILURES)))
        sys.exit(1)
    print("all %s checks passed" % what)


def _run_rank(rank, worker, P, tmpdir, init_file):
    torch.save(worker(rank, P, init_file), os.path.join(tmpdir, "rank%d.pt" % rank))


def spawn_ranks(worker, P, timeout_s):
    """worker(rank, P, init_file) in P spawned processes that meet at a
    file:// rendezvous (init_file); returns the list of what each returned,
    or None (after a FAIL line) when they do not finish within timeout_s."""
    with tempfile.TemporaryDirectory() as tmpdir:
        init_file = os.path.join(tmpdir, "rendezvous")
        t0 = time.monotonic()
        ctx = mp.spawn(_run_rank, args=(worker, P, tmpdir, init_file), nprocs=P, join=False)
        while not ctx.join(timeout=1):
            if time.monotonic() - t0 > timeout_s:
                for p in ctx.processes:
                    p.kill()
                expect("workers finish within %d s" % timeout_s, False)
                return None
        print("  workers done in %.1f s" % (time.monotonic() - t0), flush=True)
        return [torch.load(os.path.join(tmpdir, "rank%d.pt" % r)) for r in range(P)]


def rel_err(a, b):
    """max |a - b| / max(1, max |b|): absolute at unit scale, relative above."""
    a, b = a.double(), b.double()
    if b.numel() == 0:
        return 0.0
    return ((a - b).abs().max() / max(1.0, b.abs().max().item())).item()


def to_layout(t, channels_last):
    if channels_last and t.dim() in (4, 5):  # (also right for empty tensors)
        return t.contiguous(memory_format=torch.channels_last if t.dim() == 4
                            else torch.channels_last_3d)
    if channels_last and t.dim() > 2:
        perm = (0,) + tuple(range(2, t.dim())) + (1,)
        inv = [perm.index(i) for i in range(t.dim())]
        return t.permute(perm).contiguous().permute(inv)
    return t.contiguous()


class Reference:
    """float64 BatchNorm over the concatenation of the ranks' batches."""

    def __init__(self, C, eps=1e-5, momentum=0.1, affine=True, track=True, weight=None, bias=None):
        self.eps, self.momentum, self.affine, self.track = eps, momentum, affine, track
        self.w = (weight if weight is not None else torch.ones(C)).double()
        self.b = (bias if bias is not None else torch.zeros(C)).double()
        self.rm = torch.zeros(C, dtype=torch.float64)
        self.rv = torch.ones(C, dtype=torch.float64)
        self.nbt = 0

    def step(self, xs, dys, training):
        """xs, dys: per-rank tensors. Returns per-rank y and dx, and the total
        grad_weight/grad_bias (the sum of the ranks' local ones)."""
        if not training and not self.track:  # eval without running stats: each rank alone
            outs = [Reference._local(self, x, dy) for x, dy in zip(xs, dys)]
            return [o[0] for o in outs], [o[1] for o in outs], None, None
        x = torch.cat([t.double() for t in xs]).requires_grad_()
        w = self.w.clone().requires_grad_()
        b = self.b.clone().requires_grad_()
        use_batch = training or not self.track
        factor = 0.0
        if training and self.track:
            self.nbt += 1
            factor = 1.0 / self.nbt if self.momentum is None else self.momentum
        y = F.batch_norm(x, self.rm if self.track else None, self.rv if self.track else None,
                         w if self.affine else None, b if self.affine else None,
                         use_batch, factor, self.eps)
        dy = torch.cat([t.double() for t in dys])
        gx, gw, gb = torch.autograd.grad(y, (x, w, b), dy, allow_unused=True)
        sizes = [t.shape[0] for t in xs]
        return (list(y.detach().split(sizes)), list(gx.split(sizes)),
                gw if self.affine else None, gb if self.affine else None)

    @staticmethod
    def _local(self, x, dy):
        x = x.double().requires_grad_()
        y = F.batch_norm(x, None, None, self.w if self.affine else None,
                         self.b if self.affine else None, True, 0.0, self.eps)
        gx, = torch.autograd.grad(y, (x,), dy.double())
        return y.detach(), gx
