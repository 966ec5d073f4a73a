"""Two JSON files compared value by value, floats within 1e-12 (relative): for docs/benchmarks.md, where
MEGA-Bench's breakdown tool sums the same task scores in another order than its published run did.

    python docs/benchmarks/compare_stats.py A.json B.json
"""

from __future__ import annotations

import json
import math
import sys


def differences(a: object, b: object, path: str = "") -> list[tuple[str, object, object]]:
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            return [(path, sorted(a), sorted(b))]
        return [d for key in a for d in differences(a[key], b[key], f"{path}.{key}")]
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [(path, len(a), len(b))]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{path}[{i}]")]
    if isinstance(a, float) or isinstance(b, float):
        return [] if math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-15) else [(path, a, b)]
    return [] if a == b else [(path, a, b)]


def main() -> int:
    a, b = (json.load(open(path, encoding="utf-8")) for path in sys.argv[1:3])
    found = differences(a, b)
    print(f"{len(found)} value(s) differ beyond 1e-12" + "".join(f"\n  {d}" for d in found[:20]))
    return int(bool(found))


if __name__ == "__main__":
    sys.exit(main())
