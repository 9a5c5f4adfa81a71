"""Summarise a per-SASS-instruction ncu export (bench/ncu_sass.sh): the instructions holding the
most warp-stall samples, with their main stall reasons and a few instructions of context.
    python bench/sass_stalls.py bench/results/causal_sass.csv [top]
"""
import csv
import sys


def load(path: str):
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    header_at = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
    header = rows[header_at]
    return header, [r for r in rows[header_at + 1:] if len(r) == len(header)]


def number(text: str) -> float:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def main(path: str, top: int = 25):
    header, rows = load(path)
    col = {name: i for i, name in enumerate(header)}
    samples = [number(r[col["Warp Stall Sampling (All Samples)"]]) for r in rows]
    total = sum(samples)
    reasons = [name for name in header if name.startswith("stall_") and "Not Issued" not in name]
    by_reason = {name: sum(number(r[col[name]]) for r in rows) for name in reasons}
    print(f"{len(rows)} instructions, {total:.0f} samples; by reason:")
    for name, count in sorted(by_reason.items(), key=lambda kv: -kv[1])[:8]:
        print(f"  {name:28s} {count / total:6.1%}")
    print(f"\ntop {top} instructions (share of all samples, main reasons):")
    for i in sorted(range(len(rows)), key=lambda i: -samples[i])[:top]:
        main_reasons = sorted(((number(rows[i][col[n]]), n) for n in reasons), reverse=True)[:2]
        why = ", ".join(f"{n[6:]} {c / max(samples[i], 1):.0%}" for c, n in main_reasons if c)
        before = " | ".join(rows[j][col["Source"]].strip() for j in range(max(0, i - 2), i))
        print(f"{samples[i] / total:6.1%}  {rows[i][col['Address']]:>6}  {rows[i][col['Source']].strip():60.60s}  [{why}]"
              f"\n          after: {before[:150]}")


if __name__ == "__main__":
    main(sys.argv[1], *(int(a) for a in sys.argv[2:3]))
