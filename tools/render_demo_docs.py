"""Rewrite the console screens in docs/DEMO.md and the README's fleet table from a real run of the demo fleet.

    python3 tools/render_demo_docs.py            # start the demo fleet, draw every screen, rewrite the docs
    python3 tools/render_demo_docs.py --check    # only say whether the docs show what the console shows

It starts profiles/demo.toml on free ports in a scratch state directory (a demo fleet already running is
left alone), waits for three busy READY servers, drives the console with Textual's pilot, and replaces the
blocks between `<!-- demo-screen:NAME -->` markers; the fleet is stopped on the way out. About a minute
on two idle cores. tests/console/test_demo_docs.py fails when the docs' structure is out of date.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tools.demo_docs import (  # noqa: E402
    DEMO_DOC,
    README,
    ROOT,
    blocks_of,
    capture,
    demo_fleet,
    read_blocks,
    structure,
    write_blocks,
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="Compare only; write nothing (exit 1 if stale).")
    args = parser.parse_args()
    with demo_fleet() as run:
        blocks = blocks_of(asyncio.run(capture(run.state_dir)), run.relabel)
    stale = 0
    for doc in (DEMO_DOC, README):
        text = doc.read_text()
        present = read_blocks(text)
        for name in present:
            if structure(name, present[name]) != structure(name, blocks[name]):
                stale += 1
                print(f"{doc.relative_to(ROOT)}: {name} does not match the console")
        if not args.check:
            doc.write_text(write_blocks(text, {n: blocks[n] for n in present}))
            print(f"{doc.relative_to(ROOT)}: rewrote {', '.join(present) or 'nothing (no markers)'}")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
