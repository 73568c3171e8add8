"""`tokenspeed bench KIND [options]`: run a benchmark.

KIND `serving` is the load generator in `tokenspeed.bench_serving` (it ships with the package). Other kinds
run `benchmarks/<kind>.py` from a source checkout (the current directory or the one holding this package),
e.g. `tokenspeed bench cpu_engine`.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path


def _benchmark_dirs() -> list[Path]:
    return [Path.cwd() / "benchmarks", Path(__file__).resolve().parents[1] / "benchmarks"]


def available() -> list[str]:
    names = {"serving"}
    for d in _benchmark_dirs():
        if d.is_dir():
            names.update(p.stem for p in d.glob("*.py") if not p.stem.startswith("_"))
    return sorted(names)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        print("available:", ", ".join(available()))
        return 0 if argv else 2
    kind, rest = argv[0].replace("-", "_"), argv[1:]
    if kind == "serving":
        from tokenspeed.bench_serving import main as serving_main

        return serving_main(rest)
    for d in _benchmark_dirs():
        script = d / f"{kind}.py"
        if script.is_file():
            old_argv = sys.argv
            sys.argv = [str(script), *rest]
            try:
                runpy.run_path(str(script), run_name="__main__")
            except SystemExit as exc:
                return int(exc.code or 0) if not isinstance(exc.code, str) else 1
            finally:
                sys.argv = old_argv
            return 0
    print(
        f"tokenspeed bench: unknown benchmark {argv[0]!r}; available: {', '.join(available())}",
        file=sys.stderr,
    )
    return 2
