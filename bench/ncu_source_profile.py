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
    hdr, data = rows[1], rows[2:]
    i_exec, i_src = hdr.index("Instructions Executed"), hdr.index("Source")
    total = sum(int(r[i_exec]) for r in data)
    print(f"total warp instructions {total}, thread instructions per value {total * 32 / a.values:.2f}")
    regions = []  # [first line, count, [sources]]
    for i, r in enumerate(data):
        n = int(r[i_exec])
        if regions and regions[-1][1] == n:
            regions[-1][2].append(r[i_src].strip())
        else:
            regions.append([i, n, [r[i_src].strip()]])
    regions.sort(key=lambda x: -x[1] * len(x[2]))
    for first, n, src in regions[:a.top]:
        ops = collections.Counter(opcode(s) for s in src).most_common(6)
        print(f"line {first:5d} count {n:9d} len {len(src):4d} share {n * len(src) / total:6.3f} "
              f"per value {n * len(src) * 32 / a.values:5.2f} | {dict(ops)}")


if __name__ == "__main__":
    main()
