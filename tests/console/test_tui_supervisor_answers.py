"""The console's header says what went wrong with the fleet poll: "supervisor unreachable" only when nothing
answered; an answer the console cannot use (not JSON, not a fleet, an error status) is named as such.

What answers on the control socket here is a small HTTP process standing in for a supervisor of another
version (or another program on its socket): a real supervisor never answers these on purpose.
"""

from __future__ import annotations

import json
import shutil
import socketserver
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from console.supervisor.paths import StatePaths
from console.tui.app import ConsoleApp
from console.tui.live_source import LiveSource
from tests.console import supervised_http
from tests.console.tui_pilot import status, table_rows, wait_for

# What the stand-in answers on GET /fleet, by mode: (HTTP status, body, content type).
ANSWERS = {
    "fleet": (200, json.dumps({"name": "odd", "servers": [{"name": "odd-0"}]}), "application/json"),
    "html": (200, "<html><body>502 Bad Gateway</body></html>", "text/html"),
    "not_a_fleet": (200, json.dumps({"name": "odd", "servers": 7}), "application/json"),
    "error": (500, json.dumps({"error": "history database is locked"}), "application/json"),
}


class _Handler(supervised_http.Handler):
    """The supervised test server's handler (its way of sending an answer), answering the mode's /fleet."""

    def do_GET(self) -> None:  # noqa: N802 - the name http.server calls
        self._send(*ANSWERS[self.server.mode])


class _UnixHTTPServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    mode = "fleet"


@pytest.fixture
def answering() -> Iterator[tuple[Path, _UnixHTTPServer]]:
    # A short directory: the control socket path must fit in sockaddr_un.
    root = Path(tempfile.mkdtemp(prefix="tsa-"))
    server = _UnixHTTPServer(str(StatePaths(root).socket), _Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    thread.start()
    try:
        yield root, server
    finally:
        server.shutdown()
        server.server_close()
        shutil.rmtree(root, ignore_errors=True)


async def test_the_header_names_an_unusable_answer_and_unreachable_only_when_nothing_answers(answering):
    root, server = answering
    app = ConsoleApp(LiveSource(root, timeout=2.0), interval=0.5)
    async with app.run_test(size=(170, 40)) as pilot:
        await wait_for(pilot, lambda: "odd-0" in table_rows(app), what="the fleet on screen")
        assert "unreadable" not in status(app) and "unreachable" not in status(app)
        for mode, words in (
            ("html", "fleet: not JSON (JSONDecodeError"),
            ("not_a_fleet", "fleet: not a fleet this console reads (TypeError"),
            ("error", "fleet: history database is locked"),
        ):
            server.mode = mode
            await wait_for(pilot, lambda w=words: w in status(app), what=f"the {mode} answer named")
            line = status(app)
            assert "supervisor answered, fleet unreadable: " + words in line, line
            assert "unreachable" not in line, line
            assert "odd-0" in table_rows(app)  # the last fleet read stays on screen
        server.mode = "fleet"
        await wait_for(pilot, lambda: "unreadable" not in status(app), what="recovery")
        # Nothing listens any more: now, and only now, the supervisor is unreachable.
        server.shutdown()
        server.server_close()
        await wait_for(pilot, lambda: "supervisor unreachable: fleet: " in status(app), what="unreachable")
        assert "unreadable" not in status(app)
