"""docs/DEMO.md and the README show what the console really draws on the demo fleet.

The demo fleet (profiles/demo.toml on free ports) runs under a real supervisor; the console is driven
over it with Textual's pilot, every screen is drawn as text, and its structure (column headers and sort
arrow, screen titles and sections, the key bindings in the footer and in help) is compared with the
blocks between `<!-- demo-screen:NAME -->` markers. Times, rates, pids and counts are masked.
"""

from __future__ import annotations

import asyncio

from tools.demo_docs import (
    BLOCKS,
    DEMO_DOC,
    README,
    UPDATE_COMMAND,
    blocks_of,
    capture,
    demo_fleet,
    read_blocks,
    screen_blocks,
    structure,
)


def describe(name: str, documented: dict, drawn: dict) -> str:
    lines = [f"{name}:"]
    for key in drawn:
        if documented.get(key) != drawn[key]:
            lines.append(f"  {key}: the docs show {documented.get(key)!r}")
            lines.append(f"  {key}: the console draws {drawn[key]!r}")
    return "\n".join(lines)


def test_every_generated_block_of_the_docs_matches_the_console_on_the_demo_fleet():
    documented = {DEMO_DOC: read_blocks(DEMO_DOC.read_text()), README: read_blocks(README.read_text())}
    assert set(documented[DEMO_DOC]) == set(BLOCKS) - {"fleet-table"}, "docs/DEMO.md lost a screen's markers"
    assert set(documented[README]) == {"fleet-table"}, "README.md lost the fleet table's markers"

    expected = {
        name: structure(name, text) for blocks in documented.values() for name, text in blocks.items()
    }
    with demo_fleet() as run:
        # A screen is taken once it matches the docs, or as drawn after capture's settling time: a loaded
        # machine caught screens half drawn, and a screen that really changed still fails below.
        def settled(screen: str, lines: list[str]) -> bool:
            blocks = screen_blocks(screen, lines, run.relabel)
            return all(structure(name, text) == expected[name] for name, text in blocks.items())

        drawn = blocks_of(asyncio.run(capture(run.state_dir, settled=settled)), run.relabel)

    stale = [
        describe(f"{doc.name} {name}", structure(name, text), structure(name, drawn[name]))
        for doc, blocks in documented.items()
        for name, text in blocks.items()
        if structure(name, text) != structure(name, drawn[name])
    ]
    assert not stale, (
        "the docs no longer show what the console draws; run `"
        + UPDATE_COMMAND
        + "` and commit the result\n"
        + "\n".join(stale)
    )


def test_a_changed_column_or_key_is_caught_and_volatile_values_are_not():
    """The comparison itself: numbers, times and pids may differ; a column, section or key may not."""
    table = (
        " demo  3 servers  3 ready  ·  every 1s  ·  polled 03:15:09\n"
        " load: 0.5 req/s target, sent 94, ok 94, errors 0, skipped 10 (concurrency full)\n"
        " NAME          STATE ▲  KV  TOK/S  ERRORS 30s\n"
        "▶demo-dense-0  READY    0%  9.6    0\n"
        " demo-moe-0    READY    3%  -      0"
    )
    later = (
        table.replace("03:15:09", "11:02:58").replace("94", "7").replace("9.6", "12.4")
        .replace("-     ", "0.0   ").replace(", skipped 10 (concurrency full)", "")
    )  # fmt: skip
    assert structure("fleet-table", table) == structure("fleet-table", later)
    assert structure("fleet-table", table) != structure("fleet-table", table.replace("STATE ▲", "STATE"))
    assert structure("fleet-table", table) != structure("fleet-table", table.replace("KV  ", "KV%  "))
    footer = "  esc  Back   q  Quit   ?  Help"
    screen = " demo-dense-0  READY  pid 8286  up 3m54s\n Live state\n status: ready\n" + footer
    moved = screen.replace("8286", "911").replace("3m54s", "12s")
    assert structure("server", screen) == structure("server", moved)
    assert structure("server", screen) != structure("server", screen.replace("Live state", "State"))
    assert structure("server", screen) != structure("server", screen.replace("?  Help", "h  Help"))


def test_the_server_screen_is_the_same_with_a_process_more_or_less():
    """How many processes a server has when the screen is drawn moves its side column (and where the
    screen's height cuts the ServerArgs table); a section or column that changes is still caught."""
    lines = read_blocks(DEMO_DOC.read_text())["server"].splitlines()
    body, footer = lines[:-1], lines[-1]
    x = next(line.index("Processes") for line in body if line.rstrip().endswith("Processes")) - 2
    side = [line[x:] for line in body]
    row = next(i for i, part in enumerate(side) if part.strip().endswith(("front end", "controller")))
    fewer = side[: row + 1] + side[row + 2 :] + [""]  # the row after the front end's gone, the rest up a line
    moved = "\n".join([line[:x].ljust(x) + part for line, part in zip(body, fewer, strict=True)] + [footer])
    original = "\n".join(lines)
    assert structure("server", moved) == structure("server", original)
    assert structure("server", original.replace("Live state", "Live")) != structure("server", original)
    assert structure("server", original.replace("ROLE", "NAME")) != structure("server", original)
