#!/usr/bin/python3
"""PyTorch peer for syncbn-bench, run as a coprocess so that its calls
interleave with ours in the same run (same load, same machine state).

Times F.batch_norm(training=True) forward and autograd backward on the CPU
with the same threads and the same input rotation as the C side: `copies`
copies of (x, dy) whose total exceeds the caches; forward on copy i, backward
of the forward made `depth` steps earlier, so neither pass reads inputs that
are still in the caches from the pass before.

Protocol (one line each way; times in ms):
  setup N C HW LAYOUT DTYPE COPIES DEPTH  -> ok
  run CALLS                               -> r F1,F2,...;B1,B2,...
  free                                    -> ok
  quit
"""
import ctypes
import sys
import time

try:  # Linux: end with the bench if it is killed (no orphan holding memory and a core)
    ctypes.CDLL(None).prctl(1, 15)  # PR_SET_PDEATHSIG, SIGTERM
except Exception:
    pass

try:
    import torch
    import torch.nn.functional as F
except Exception as e:  # the bench reports the peer as unavailable
    print("#torch unavailable:", e, flush=True)
    sys.exit(3)

torch.set_num_threads(int(sys.argv[1]))
print("#torch", torch.__version__, "threads", torch.get_num_threads(), flush=True)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class Case:
    def __init__(self, n, c, hw, layout, dt, copies, depth):
        side = int(round(hw ** 0.5))
        shape = (n, c) if hw == 1 else (n, c, side, hw // side)
        gen = torch.Generator().manual_seed(1)
        x0 = torch.randn(shape, generator=gen).to(DTYPES[dt])  # random once, copied (randn is slow)
        if layout == "cl" and len(shape) == 4:
            x0 = x0.contiguous(memory_format=torch.channels_last)
        dy0 = torch.randn(shape, generator=gen).to(DTYPES[dt])
        if layout == "cl" and len(shape) == 4:
            dy0 = dy0.contiguous(memory_format=torch.channels_last)
        self.xs = [x0.clone().requires_grad_() for _ in range(copies)]
        self.dys = [dy0.clone() for _ in range(copies)]
        self.w = torch.ones(c, requires_grad=True)
        self.b = torch.zeros(c, requires_grad=True)
        self.rm, self.rv = torch.zeros(c), torch.ones(c)
        self.depth, self.i, self.pending = depth, 0, []
        for _ in range(depth + 1):  # fill the pipeline (warm-up, untimed)
            self.step()

    def step(self):
        k = self.i % len(self.xs)
        self.i += 1
        x = self.xs[k]
        t0 = time.perf_counter()
        y = F.batch_norm(x, self.rm, self.rv, self.w, self.b, True, 0.1, 1e-5)
        t1 = time.perf_counter()
        self.pending.append((y, k))
        tb = None
        if len(self.pending) > self.depth:
            y0, k0 = self.pending.pop(0)
            t2 = time.perf_counter()
            y0.backward(self.dys[k0])
            tb = time.perf_counter() - t2
            self.xs[k0].grad = None
        return t1 - t0, tb


case = None
for line in sys.stdin:
    a = line.split()
    if not a:
        continue
    if a[0] == "setup":
        case = None
        case = Case(int(a[1]), int(a[2]), int(a[3]), a[4], a[5], int(a[6]), int(a[7]))
        print("ok", flush=True)
    elif a[0] == "run":
        fw, bw = [], []
        for _ in range(int(a[1])):
            f, b = case.step()
            fw.append(f * 1e3)
            if b is not None:
                bw.append(b * 1e3)
        print("r " + ",".join(f"{v:.5f}" for v in fw) + ";" + ",".join(f"{v:.5f}" for v in bw), flush=True)
    elif a[0] == "free":
        case = None
        print("ok", flush=True)
    elif a[0] == "quit":
        break
