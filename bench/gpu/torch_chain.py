#!/usr/bin/env python3
"""PyTorch's SyncBatchNorm CUDA kernel chain, timed on the same work as
syncbn-bench-gpu (bench/gpu/bench_gpu.c), and cuDNN's F.batch_norm for
reference. Prints the same table and "ROW ..." lines; bench/gpu/combine.py
turns both outputs into speedups.

The chain is what torch.nn.SyncBatchNorm runs per layer (torch/nn/modules/
_functions.py), without its collectives (one rank: the all-gather of the
statistics and the all-reduce of the gradient sums move nothing):
  forward:  torch.batch_norm_stats, torch.batch_norm_gather_stats_with_counts,
            torch.batch_norm_elemt
  backward: torch.batch_norm_backward_reduce, torch.batch_norm_backward_elemt
Each is captured in a CUDA graph per input set and replayed, so Python is not
timed; CUDA events around each replay, the median after warm-up. The inputs
rotate over R sets (R * bytes >= 4x the L2), forward on set i and backward on
set i - R/2, as in bench_gpu.c.

cuDNN reference: F.batch_norm in training mode (forward graph) and forward +
autograd backward (second graph); its backward time is the difference.

Run with a python that has CUDA PyTorch (the GPU machine's python3):
  python3 bench/gpu/torch_chain.py [--iters N] [--warmup W] [--only SHAPE]
                                   [--dtype f32|bf16] [--layout cf|cl] [--no-cudnn]
Without CUDA it says so and exits 0 after checking its arguments.
"""
import argparse
import statistics
import sys

SHAPES = [
    ("32x64x112x112", (32, 64, 112, 112)),
    ("32x128x56x56", (32, 128, 56, 56)),
    ("32x256x56x56", (32, 256, 56, 56)),
    ("32x512x28x28", (32, 512, 28, 28)),
    ("32x1024x14x14", (32, 1024, 14, 14)),
    ("32x2048x7x7", (32, 2048, 7, 7)),
    ("16384x1024", (16384, 1024)),
]
EPS, MOMENTUM = 1e-5, 0.1


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--iters", type=int, default=30, help="timed calls per configuration")
    p.add_argument("--warmup", type=int, default=5, help="untimed calls first")
    p.add_argument("--only", default=None, help="shapes whose label starts with this")
    p.add_argument("--dtype", choices=["f32", "bf16"], default=None)
    p.add_argument("--layout", choices=["cf", "cl"], default=None)
    p.add_argument("--no-cudnn", action="store_true", help="skip the F.batch_norm reference")
    a = p.parse_args(argv)
    if a.iters < 1 or a.warmup < 0:
        p.error("--iters must be >= 1 and --warmup >= 0")
    return a


def median_event_ms(torch, fn, sets, pick, iters, warmup, stream):
    """Median over `iters` of fn(sets[pick(it)]) timed with CUDA events."""
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters + warmup)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters + warmup)]
    with torch.cuda.stream(stream):
        for it in range(iters + warmup):
            starts[it].record(stream)
            fn(sets[pick(it)])
            ends[it].record(stream)
    stream.synchronize()
    return statistics.median(starts[it].elapsed_time(ends[it]) for it in range(warmup, iters + warmup))


def backward_elemt(torch, dy, x, mean, invstd, weight, sum_dy, sum_dy_xmu, count_i32, total):
    """torch.batch_norm_backward_elemt: since PyTorch 1.10 it takes the sums
    and the per-rank counts; before, the means (sums / total count)."""
    try:
        return torch.batch_norm_backward_elemt(dy, x, mean, invstd, weight, sum_dy, sum_dy_xmu, count_i32)
    except TypeError:
        return torch.batch_norm_backward_elemt(dy, x, mean, invstd, weight, sum_dy / total, sum_dy_xmu / total)


def copy_gbs(torch):
    n = 1 << 28  # 1 GiB of float32
    a = torch.rand(n, device="cuda")
    b = torch.empty_like(a)
    ts = []
    for i in range(18):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        b.copy_(a)
        e.record()
        e.synchronize()
        if i >= 3:
            ts.append(s.elapsed_time(e))
    del a, b
    torch.cuda.empty_cache()
    return 2.0 * 4 * n / (statistics.median(ts) * 1e-3) / 1e9


def run_case(torch, F, label, dims, dt, layout, args, copy, l2, stream):
    dtype = torch.float32 if dt == "f32" else torch.bfloat16
    esz = 4 if dt == "f32" else 2
    numel = 1
    for d in dims:
        numel *= d
    nbytes = numel * esz
    C = dims[1]
    R = max(2, min(64, -(-4 * l2 // nbytes)))
    free, _ = torch.cuda.mem_get_info()
    while R > 2 and R * 4 * nbytes > free // 2:
        R -= 1
    mf = torch.channels_last if (layout == "cl" and len(dims) == 4) else torch.contiguous_format
    gen = torch.Generator(device="cuda").manual_seed(1234)

    def make():
        t = torch.rand(dims, device="cuda", generator=gen) * 4.0 - 2.0 + 0.5
        return t.to(dtype).contiguous(memory_format=mf)

    xs = [make() for _ in range(R)]
    dys = [make() for _ in range(R)]
    weight = torch.ones(C, device="cuda")
    bias = torch.zeros(C, device="cuda")
    rmean = torch.zeros(C, device="cuda")
    rvar = torch.ones(C, device="cuda")
    count = torch.full((1,), numel // C, dtype=torch.float32, device="cuda")
    count_i32 = count.to(torch.int32)

    # forward chain: per set, stats -> gather -> elemt; saves mean/invstd for backward
    saved = {}

    def fwd_chain(i):
        x = xs[i]
        mean, invstd = torch.batch_norm_stats(x, EPS)
        mean_g, invstd_g = torch.batch_norm_gather_stats_with_counts(
            x, mean.view(1, -1), invstd.view(1, -1), rmean, rvar, MOMENTUM, EPS, count)
        y = torch.batch_norm_elemt(x, weight, bias, mean_g, invstd_g, EPS)
        saved[i] = (mean_g, invstd_g)
        return y

    def bwd_chain(i):
        x, dy = xs[i], dys[i]
        mean, invstd = saved[i]
        sum_dy, sum_dy_xmu, gw, gb = torch.batch_norm_backward_reduce(dy, x, mean, invstd, weight, True, True, True)
        return backward_elemt(torch, dy, x, mean, invstd, weight, sum_dy, sum_dy_xmu, count_i32, float(numel // C))

    def capture(fn, i):
        with torch.cuda.stream(stream):
            for _ in range(2):  # warm-up outside the graph (allocator, lazy init)
                fn(i)
        stream.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=stream):
            fn(i)
        return g

    fg = [capture(fwd_chain, i) for i in range(R)]
    bg = [capture(bwd_chain, i) for i in range(R)]
    fms = median_event_ms(torch, lambda g: g.replay(), fg, lambda it: it % R, args.iters, args.warmup, stream)
    bms = median_event_ms(torch, lambda g: g.replay(), bg, lambda it: (it + R // 2) % R, args.iters, args.warmup,
                          stream)
    emit("torch_chain", label, dt, layout, nbytes, fms, bms, copy, R)
    del fg, bg
    saved.clear()

    if not args.no_cudnn:
        leaves = [x.detach().requires_grad_(True) for x in xs]
        w = weight.clone().requires_grad_(True)
        b = bias.clone().requires_grad_(True)

        def f_only(i):
            return F.batch_norm(leaves[i], rmean, rvar, w, b, True, MOMENTUM, EPS)

        def f_and_b(i):
            y = F.batch_norm(leaves[i], rmean, rvar, w, b, True, MOMENTUM, EPS)
            return torch.autograd.grad(y, (leaves[i], w, b), dys[i])

        try:
            gf = [capture(f_only, i) for i in range(R)]
            gfb = [capture(f_and_b, i) for i in range(R)]
            f1 = median_event_ms(torch, lambda g: g.replay(), gf, lambda it: it % R, args.iters, args.warmup, stream)
            fb = median_event_ms(torch, lambda g: g.replay(), gfb, lambda it: it % R, args.iters, args.warmup,
                                 stream)
            emit("torch_F.batch_norm", label, dt, layout, nbytes, f1, max(fb - f1, 1e-6), copy, R)
            del gf, gfb
        except RuntimeError as e:  # e.g. a configuration the graph capture refuses
            print(f"# F.batch_norm {label} {dt} {layout}: not timed ({str(e).splitlines()[0]})")
    del xs, dys
    torch.cuda.empty_cache()


def emit(impl, label, dt, layout, nbytes, fms, bms, copy, R):
    mb = nbytes / 1e6
    fgbs = 3.0 * nbytes / (fms * 1e-3) / 1e9
    bgbs = 5.0 * nbytes / (bms * 1e-3) / 1e9
    print(f"{label:<15} {dt:<4} {layout:<2} {impl[:18]:<18} {mb:8.1f} {fms:9.4f} {fgbs:7.0f} {fgbs / copy:5.2f} "
          f"{bms:9.4f} {bgbs:7.0f} {bgbs / copy:5.2f}  R={R}")
    print(f"ROW impl={impl} shape={label} dtype={dt} layout={layout} mb={mb:.3f} fwd_ms={fms:.5f} bwd_ms={bms:.5f} "
          f"fwd_gbs={fgbs:.1f} bwd_gbs={bgbs:.1f} fwd_frac={fgbs / copy:.3f} bwd_frac={bgbs / copy:.3f}", flush=True)


def main(argv):
    args = parse_args(argv)
    try:
        import torch
        import torch.nn.functional as F
    except ImportError as e:
        print(f"SKIP: torch_chain.py needs PyTorch ({e})")
        return 0
    if not torch.cuda.is_available():
        print(f"SKIP: torch_chain.py needs CUDA: this PyTorch ({torch.__version__}, CUDA build "
              f"{torch.version.cuda}) sees no GPU. Run it with the GPU machine's python3.")
        return 0
    torch.backends.cudnn.benchmark = False
    props = torch.cuda.get_device_properties(0)
    l2 = getattr(props, "L2_cache_size", 50 * 1000 * 1000)
    copy = copy_gbs(torch)
    print(f"device 0: {props.name}, {props.multi_processor_count} SMs, L2 {l2 / 1e6:.0f} MB; copy bandwidth "
          f"{copy:.0f} GB/s (read + write); torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}")
    print(f"COPY gbs={copy:.1f}")
    print(f"\n{'shape':<15} {'dt':<4} {'ly':<2} {'impl':<18} {'MB':>8} {'fwd_ms':>9} {'GB/s':>7} {'frac':>5} "
          f"{'bwd_ms':>9} {'GB/s':>7} {'frac':>5}")
    stream = torch.cuda.Stream()
    for label, dims in SHAPES:
        if args.only and not label.startswith(args.only):
            continue
        for dt in ("f32", "bf16"):
            if args.dtype and dt != args.dtype:
                continue
            for layout in ("cf", "cl"):
                if args.layout and layout != args.layout:
                    continue
                if len(dims) == 2 and layout == "cl":
                    continue
                run_case(torch, F, label, dims, dt, layout, args, copy, l2, stream)
    print(f"\ncopy bandwidth at the end: {copy_gbs(torch):.0f} GB/s (start {copy:.0f})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
