"""`tokenspeed profile validate` reports every mistake of a profile, each at its file:line, tables included
(a misspelled `[group.dense]` is found at its header), not only the first one the loader meets."""

from __future__ import annotations

import re

from tests.console.conftest import tokenspeed

PROFILE = """\
[server]
model = "demo"
device = "cpu"
max_num_seqz = 4

[group.dense]
replicas = 1

[fleet]
name = "x"
restat = "always"
base_port = 80

[fleet.helth]
interval_s = 2
"""


def test_validate_reports_every_error_with_its_line(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text(PROFILE)
    result = tokenspeed("profile", "validate", str(bad))
    assert result.returncode == 2, result.stdout + result.stderr
    found = re.findall(rf"^error: {re.escape(str(bad))}:(\d+): (\S+(?: \S+)?): ", result.stderr, re.M)
    assert found == [
        ("4", "[server] max_num_seqz"),
        ("6", "group"),
        ("11", "[fleet] restat"),
        ("12", "[fleet] base_port"),
        ("14", "[fleet] helth"),
    ], result.stderr
    assert "did you mean 'groups'" in result.stderr and "did you mean 'health'" in result.stderr
    assert f"{bad}: 5 error(s)" in result.stderr


def test_validate_keeps_lines_through_extends_and_passes_good_profiles(tmp_path):
    base = tmp_path / "base.toml"
    base.write_text('[server]\nmodel = "demo"\ndevice = "cpu"\n')
    top = tmp_path / "sub" / "top.toml"
    top.parent.mkdir()
    top.write_text('extends = "../base.toml"\n\n[server]\nmax_num_seqz = 2\n\n[fleet]\nreplicaz = 2\n')
    result = tokenspeed("profile", "validate", str(top), str(base))
    assert result.returncode == 2
    assert (
        f"{top}:4: [server] max_num_seqz" in result.stderr and f"{top}:7: [fleet] replicaz" in result.stderr
    )
    assert f"{base}: ok" in result.stdout


def test_a_base_passed_with_the_profiles_that_extend_it_is_checked_through_them(tmp_path):
    """`tokenspeed profile validate profiles/*.toml` passes the shared `_base.toml` too: it has no
    model of its own, so alone it is not a fleet, but with the profiles extending it, it is fine."""
    base = tmp_path / "_base.toml"
    base.write_text('[fleet]\nrestart = "on-failure"\n')
    top = tmp_path / "demo.toml"
    top.write_text('extends = "_base.toml"\n\n[server]\nmodel = "demo"\ndevice = "cpu"\n')
    result = tokenspeed("profile", "validate", str(base), str(top))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{base}: ok (a base, extended by {top}; checked through them)" in result.stdout
    alone = tokenspeed("profile", "validate", str(base))
    assert alone.returncode == 2 and "model: is required" in alone.stderr


def test_a_list_of_server_tables_is_named_with_its_line_and_the_profile_shape(tmp_path):
    """`[[server]]`, the array-of-tables a list of servers suggests, read as a Python error before; now the
    first error names it at its line and says how a profile lists servers."""
    bad = tmp_path / "servers.toml"
    bad.write_text('[fleet]\nname = "x"\n\n[[server]]\nmodel = "demo"\ndevice = "cpu"\n')
    result = tokenspeed("profile", "validate", str(bad))
    assert result.returncode == 2, result.stdout + result.stderr
    first = result.stderr.splitlines()[0]
    assert first.startswith(f"error: {bad}:4: server: must be a table: [server]"), result.stderr
    assert "got [[server]] (a list of 1 table)" in first and "[groups.NAME]" in first, first
    assert "dictionary update sequence" not in result.stderr
