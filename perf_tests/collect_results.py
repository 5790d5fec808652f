# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""Merges the rows of the compare_*.py --json files of one run into one JSON
list, each row completed with the date, the commit, the Kokkos version and
the device (perf_tests/results/<device>.json).

  python3 perf_tests/collect_results.py --out h100.json --commit SHA \\
      --kokkos-version 4.6.1 --device "NVIDIA H100 80GB HBM3" rows1.json rows2.json ...
"""
import argparse
import datetime
import json

from result_rows import FIELDS


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("rows", nargs="*", help="JSON files of rows (missing ones are skipped)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--commit", required=True)
    ap.add_argument("--kokkos-version", required=True)
    ap.add_argument("--device", required=True)
    ap.add_argument("--date", default=datetime.date.today().isoformat())
    args = ap.parse_args()
    merged = []
    for path in args.rows:
        try:
            rows = json.load(open(path))
        except FileNotFoundError:
            continue  # a family that did not run
        for r in rows:
            missing = [f for f in FIELDS if f not in r]
            if missing:
                raise SystemExit(f"{path}: a row without {', '.join(missing)}: {r}")
            merged.append(dict(r, date=args.date, commit=args.commit,
                               kokkos_version=args.kokkos_version, device=args.device))
    with open(args.out, "w") as f:
        json.dump(merged, f, indent=1)
    print(f"{len(merged)} rows in {args.out}")


if __name__ == "__main__":
    main()
