"""TileLang's own example programs, timed by themselves, under tritile and under TileLang 0.1.15
on the same GPU, one after the other.

    PYTHONPATH=$PWD python bench/tilelang_examples_h100.py EXAMPLES_DIR [--only SUBSTRING ...]
        [--timeout S] [--out results.json]

EXAMPLES_DIR is ../shared/tilelang-examples (TileLang's examples, MIT; test data, not ours).  Each
example that prints its own latency runs twice, each time in a fresh process: with `import
tilelang` resolving to tritile (the examples' `tilelang_alias`), and, when TILELANG_SITE names a
directory holding TileLang 0.1.15 and its dependencies (unpacked wheels), with the real TileLang.
The lines the example prints about time (ms, TFlops, latency, speedup) are kept as they are: the
examples time different things (some a torch reference too), so the comparison is line by line,
for the same example on the same GPU.  Runs are sequential so that they do not share the GPU.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))
from timing import save  # noqa: E402

TIMING_LINE = re.compile(r"(\bms\b|TFlop|TFLOP|tflop|[Ll]atency|[Ss]peedup|GB/s|TB/s)")
PRINTS_TIMING = re.compile(r"print\(.*(ms|TFlop|latency|Latency|tflops|TFLOPS)")


def timed_examples(examples: Path) -> list:
    programs = (examples / "programs.txt").read_text().split()
    return [p for p in programs if not Path(p).name.startswith("test_")
            and PRINTS_TIMING.search((examples / p).read_text())]


def run(program: Path, pythonpath: list, timeout: float) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(map(str, pythonpath + [program.parent])))
    start = time.time()
    try:
        out = subprocess.run([sys.executable, program.name], cwd=program.parent, env=env, capture_output=True,
                             text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"status": "TIMEOUT", "seconds": timeout}
    lines = (out.stdout + out.stderr).splitlines()
    result = {"status": "PASS" if out.returncode == 0 else "FAIL", "seconds": round(time.time() - start, 1),
              "timing": [ln.strip() for ln in lines if TIMING_LINE.search(ln) and "Warning" not in ln]}
    if out.returncode != 0:
        result["error"] = next((ln for ln in reversed(lines) if "Error" in ln or "error" in ln), lines[-1:] or "")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("examples", type=Path)
    parser.add_argument("--only", nargs="*", default=None, help="run the examples whose path contains one of these")
    parser.add_argument("--timeout", type=float, default=240)
    parser.add_argument("--out", default=os.path.join(os.environ.get("OUT", "bench/results"),
                                                      "tilelang_examples_latency_h100.json"))
    args = parser.parse_args()
    examples = args.examples.resolve()
    project = Path(__file__).resolve().parent.parent
    site = os.environ.get("TILELANG_SITE")
    rows = []
    for rel in timed_examples(examples):
        if args.only and not any(s in rel for s in args.only):
            continue
        row = {"example": rel, "tritile": run(examples / rel, [examples, project], args.timeout)}
        row["tilelang"] = (run(examples / rel, [Path(site)], args.timeout) if site
                           else {"status": "n/a", "reason": "TILELANG_SITE not set"})
        rows.append(row)
        for side in ("tritile", "tilelang"):
            r = row[side]
            print(f"{rel} [{side}] {r['status']}: " + " | ".join(r.get("timing", [])) + (
                f"  ({r['error']})" if r.get("error") else ""), flush=True)
    save(args.out, rows)


if __name__ == "__main__":
    main()
