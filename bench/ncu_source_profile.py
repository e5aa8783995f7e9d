"""Hot regions of one kernel from an ncu per-SASS-instruction profile.

    ncu -k regex:requant -s 1 -c 1 --section SourceCounters -o r python3 bench/ncu_codecs.py nvfp4 --pages 8192
    ncu -i r.ncu-rep --page source --csv --print-source sass > r.csv
    python3 bench/ncu_source_profile.py r.csv --values 67108864 [--top 25]

Consecutive SASS lines executed equally often form a region (a basic block, or a run of them);
regions are listed by their share of all executed warp-instructions, with thread instructions per
value (warp-instructions x 32 / --values) and their most common opcodes.
"""
import argparse
import collections
import csv


def opcode(line: str) -> str:
    words = line.split()
    op = words[1] if words[0].startswith("@") else words[0]  # predicated: "@P0 OP ..."
    return op.split(".")[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--values", type=float, required=True, help="values the profiled launch processed")
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args()
    rows = list(csv.reader(open(a.csv)))
    h = next(i for i, r in enumerate(rows) if "Source" in r)  # the header row (ncu puts a title above it)
    hdr, data = rows[h], [r for r in rows[h + 1:] if len(r) == len(rows[h])]
    i_exec, i_src = hdr.index("Instructions Executed"), hdr.index("Source")
    # warp-state samples per instruction (SourceCounters), where the profile has them
    i_stall = next((i for i, c in enumerate(hdr) if c.startswith("Warp Stall Sampling (All")), None)

    def num(x):
        return float(x.replace(",", "") or 0)

    total = sum(num(r[i_exec]) for r in data)
    samples = sum(num(r[i_stall]) for r in data) if i_stall is not None else 0
    print(f"total warp instructions {total:.0f}, thread instructions per value {total * 32 / a.values:.2f}"
          + (f", stall samples {samples:.0f}" if samples else ""))
    regions = []  # [first line, count, [sources], samples]
    for i, r in enumerate(data):
        n = num(r[i_exec])
        st = num(r[i_stall]) if i_stall is not None else 0
        if regions and regions[-1][1] == n:
            regions[-1][2].append(r[i_src].strip())
            regions[-1][3] += st
        else:
            regions.append([i, n, [r[i_src].strip()], st])
    regions.sort(key=lambda x: -(x[3] if samples else x[1] * len(x[2])))
    for first, n, src, st in regions[:a.top]:
        ops = collections.Counter(opcode(s) for s in src).most_common(6)
        print(f"line {first:5d} count {n:9.0f} len {len(src):4d} share {n * len(src) / total:6.3f} "
              f"per value {n * len(src) * 32 / a.values:5.2f}"
              + (f" samples {st / samples:6.3f}" if samples else "") + f" | {dict(ops)}")
    if samples:  # the single instructions the warps waited at most
        print("top instructions by stall samples:")
        for r in sorted(data, key=lambda r: -num(r[i_stall]))[:a.top]:
            print(f"  {num(r[i_stall]) / samples:6.3f} x{num(r[i_exec]):9.0f}  {r[i_src].strip()[:90]}")


if __name__ == "__main__":
    main()
