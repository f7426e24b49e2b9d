#!/usr/bin/env python3
"""Speedups of syncbn's CUDA layer over PyTorch's SyncBatchNorm kernel chain
(and cuDNN's F.batch_norm), from the outputs of syncbn-bench-gpu and
bench/gpu/torch_chain.py (their "ROW ..." lines), one run of each on the same
GPU.

  python3 bench/gpu/combine.py ours.log torch.log [--ours syncbn-none]

Per shape, dtype and layout: forward, backward and forward+backward times,
the speedup over each peer (peer time / our time), our fraction of copy
bandwidth; then the geometric-mean speedups and the goals of the GPU work
(>= 0.85 of copy bandwidth on every shape above 25 MB, geometric-mean speedup
>= 1.5x over the chain)."""
import argparse
import math
import sys


def read_rows(paths):
    rows, copies = {}, {}
    for path in paths:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line.startswith("COPY "):
                    copies[path] = float(line.split("=", 1)[1])
                if not line.startswith("ROW "):
                    continue
                kv = dict(tok.split("=", 1) for tok in line.split()[1:] if "=" in tok)
                if "shape" not in kv:
                    continue  # e.g. the collective rows
                key = (kv["impl"], kv["shape"], kv["dtype"], kv["layout"])
                rows[key] = {k: (float(v) if k.endswith(("ms", "gbs", "frac", "mb")) else v) for k, v in kv.items()}
    return rows, copies


def geomean(xs):
    xs = [x for x in xs if x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("logs", nargs="+", help="outputs of syncbn-bench-gpu and torch_chain.py")
    p.add_argument("--ours", default="syncbn-none", help="our implementation's row name")
    p.add_argument("--peer", default="torch_chain", help="the peer to compare with")
    a = p.parse_args(argv)
    rows, copies = read_rows(a.logs)
    for path, gbs in copies.items():
        print(f"copy bandwidth in {path}: {gbs:.0f} GB/s")
    keys = sorted({(s, d, l) for (impl, s, d, l) in rows if impl == a.ours},
                  key=lambda k: (k[1], k[2], -rows[(a.ours,) + k]["mb"]))
    if not keys:
        print(f"no rows of '{a.ours}' found")
        return 1
    peers = [a.peer] + sorted({impl for (impl, *_rest) in rows if impl not in (a.ours, a.peer)
                               and not impl.startswith("syncbn")})
    print(f"\n{'shape':<15} {'dt':<4} {'ly':<2} {'MB':>7} {'ours f+b ms':>11} {'frac f/b':>10}" +
          "".join(f" {('x ' + p)[:22]:>22}" for p in peers))
    speed = {p: [] for p in peers}
    fwd_speed, bwd_speed = [], []
    goal_misses = []
    for k in keys:
        o = rows[(a.ours,) + k]
        ot = o["fwd_ms"] + o["bwd_ms"]
        line = f"{k[0]:<15} {k[1]:<4} {k[2]:<2} {o['mb']:7.1f} {ot:11.4f} {o['fwd_frac']:4.2f}/{o['bwd_frac']:4.2f}"
        for p in peers:
            r = rows.get((p,) + k)
            if r is None:
                line += f" {'-':>22}"
                continue
            s = (r["fwd_ms"] + r["bwd_ms"]) / ot
            speed[p].append(s)
            if p == a.peer:
                fwd_speed.append(r["fwd_ms"] / o["fwd_ms"])
                bwd_speed.append(r["bwd_ms"] / o["bwd_ms"])
            line += f" {s:21.2f}x"
        print(line)
        if o["mb"] > 25 and min(o["fwd_frac"], o["bwd_frac"]) < 0.85:
            goal_misses.append(f"{k[0]} {k[1]} {k[2]} ({o['fwd_frac']:.2f}/{o['bwd_frac']:.2f})")
    print()
    for p in peers:
        if speed[p]:
            print(f"geometric-mean speedup over {p} (forward+backward, {len(speed[p])} configurations): "
                  f"{geomean(speed[p]):.2f}x (min {min(speed[p]):.2f}x, max {max(speed[p]):.2f}x)")
    if fwd_speed:
        print(f"  over {a.peer}: forward {geomean(fwd_speed):.2f}x, backward {geomean(bwd_speed):.2f}x")
    g = geomean(speed[a.peer]) if speed[a.peer] else float("nan")
    print(f"goal >= 1.5x geometric-mean speedup over {a.peer}: {'met' if g >= 1.5 else 'NOT met'} ({g:.2f}x)")
    print("goal >= 0.85 of copy bandwidth on every shape above 25 MB: " +
          ("met" if not goal_misses else "NOT met: " + "; ".join(goal_misses)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
