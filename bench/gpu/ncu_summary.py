"""Summary of an Nsight Compute CSV (--csv --page details): per kernel name,
launches, median duration, grid, registers and the SpeedOfLight, occupancy
and issue figures of its median launch (lines that are not CSV, the
program's own output, are skipped). Where the CSV holds stall-reason metrics
(--metrics smsp__average_warps_issue_stalled_*_per_issue_active.ratio), a
second table gives them per kernel: warps stalled for each reason per
issued instruction, the largest first."""
import csv
import io
import re
import statistics
import sys

WANT = {
    "Duration": "us",
    "DRAM Throughput": "dram%",
    "L1/TEX Cache Throughput": "l1%",
    "Compute (SM) Throughput": "sm%",
    "Achieved Occupancy": "occ%",
    "Warp Cycles Per Issued Instruction": "cpi",
    "Issue Slots Busy": "iss%",
    "Registers Per Thread": "regs",
    "Grid Size": "grid",
}


def short(name):
    name = re.sub(r"\(anonymous namespace\)::", "", name)
    name = re.sub(r"sbn_cuda::", "", name)
    return re.sub(r"\(.*", "", name)[:48]


def main(path):
    rows, header = [], None
    for line in open(path, errors="replace"):
        if line.startswith('"'):
            rec = next(csv.reader(io.StringIO(line)))
            if header is None:
                header = rec
            elif rec != header:
                rows.append(dict(zip(header, rec)))
    kern = {}
    order = []
    for r in rows:
        k = (r["ID"], r["Kernel Name"])
        if k not in kern:
            kern[k] = {}
            order.append(k)
        m = r["Metric Name"]
        st = re.match(r"smsp__average_warps_issue_stalled_(\w+?)_per_issue_active", m)
        if st:
            try:
                kern[k]["stall:" + st.group(1)] = float(r["Metric Value"].replace(",", ""))
            except ValueError:
                pass
        if m in WANT:
            v = r["Metric Value"].replace(",", "")
            try:
                v = float(v)
            except ValueError:
                continue
            if m == "Duration":
                unit = r["Metric Unit"]
                v *= {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3}.get(unit, 1.0)
            kern[k][WANT[m]] = v
    by_name = {}
    for k in order:
        by_name.setdefault(short(k[1]), []).append(kern[k])
    cols = ["us", "dram%", "l1%", "sm%", "occ%", "cpi", "iss%", "regs", "grid"]
    print("%-48s %4s " % ("kernel", "n") + " ".join("%6s" % c for c in cols))
    for name, ls in by_name.items():
        ls = sorted(ls, key=lambda d: d.get("us", 0))
        med = ls[len(ls) // 2]
        print("%-48s %4d " % (name, len(ls)) + " ".join("%6.0f" % med.get(c, float("nan")) for c in cols))
    stalls = [(name, ls[len(ls) // 2]) for name, ls in by_name.items()]
    if any(k.startswith("stall:") for _, d in stalls for k in d):
        print("stalls per issued instruction (median launch), largest first:")
        for name, d in stalls:
            st = sorted(((v, k[6:]) for k, v in d.items() if k.startswith("stall:")), reverse=True)
            print("%-48s " % name + "  ".join("%s %.2f" % (k, v) for v, k in st[:6]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
