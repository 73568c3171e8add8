"""The console's incident drills, timed: runs tests/console/test_drills.py (the real console over a real fleet
of demo-size servers, each fault injected) and keeps what each drill measured in
benchmarks/results/console_drills.json: seconds from the fault to what the operator sees, the keys pressed
to the diagnosis and to the fix, and the seconds from the fix to its effect.

    python benchmarks/console_drills.py [-k crash]   # extra arguments go to pytest
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "benchmarks" / "results" / "console_drills.json"


def table(path: Path) -> str:
    """The drill table, one line per drill, as the issue's closing note gives it."""
    lines = ["| drill | first sign on screen | diagnosis (keys) | fix (keys) | fix took effect |", "|---|---|---|---|---|"]
    for d in json.loads(path.read_text())["drills"]:
        seen = [(what, t) for what, t in d["seen"].items() if isinstance(t, (int, float))]
        first = f"{seen[0][1]:.1f} s: {seen[0][0]}" if seen else "-"
        why = next((f"{t:.1f} s: {what}" for what, t in seen if t == d.get("diagnosis_s")), "-")
        effect = f"{d['fix_effect_s']:.1f} s" if d.get("fix_effect_s") is not None else "-"
        lines.append(f"| {d['name']} | {first} | {why} ({d['keys_to_diagnosis']}: {' '.join(d['diagnosis_keys'])}) "
                     f"| {' '.join(d['fix_keys'])} | {effect} |")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    # The results file names this script, not the pytest run that measures for it.
    command = json.dumps(["benchmarks/console_drills.py", *argv])
    env = dict(os.environ, TOKENSPEED_DRILL_TIMES=str(OUT), TOKENSPEED_BENCH_COMMAND=command)
    code = subprocess.call(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/console/test_drills.py", *argv],
        cwd=REPO,
        env=env,
    )
    if OUT.exists():
        print(table(OUT))
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
