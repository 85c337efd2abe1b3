#!/usr/bin/env python3
"""Agreement of the built-in rule table with the installed megatron-core.

Runs the differential matrix (scripts/mbridge_recompute/rules/differential.py)
through the real TransformerConfig and the built-in table, prints one line per
disagreement and the agreement figure, e.g.

    agreement: 132/132 verdicts (accept/reject + constraint id + exception type); ...

Needs megatron-core installed. Run: .venv/bin/python benchmarks/check_agreement.py [--verbose]
"""

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

from mbridge_recompute.rules import differential  # noqa: E402


def main() -> int:
    verbose = "--verbose" in sys.argv[1:]
    start = time.perf_counter()
    results = differential.run_matrix()
    elapsed = time.perf_counter() - start
    for r in results:
        if verbose or not r.agrees:
            mark = "ok  " if r.agrees else "DIFF"
            print(f"{mark} {r.name}: live={r.live} builtin={r.builtin}"
                  + ("" if r.live_warnings == r.builtin_warnings else
                     f" warnings live={sorted(r.live_warnings)} builtin={sorted(r.builtin_warnings)}"))
    print(differential.summary(results))
    print(f"cases: {len(differential.REFERENCE_CASES)} reference + {len(differential.VARIATION_CASES)} "
          f"variations; {elapsed:.1f} s including the megatron-core import")
    return 0 if all(r.agrees for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
