"""A results file records the environment switches that chose its kernels (`bench_results.SWITCHES`): each
one the constant its module reads, recorded when set, and nothing else from the environment."""

from __future__ import annotations

import pytest

from tokenspeed.bench_results import SWITCHES, provenance


def test_every_switch_is_the_name_its_module_reads():
    pytest.importorskip("triton")
    from tokenspeed.runtime.kernels import decode_attention, pdl
    from tokenspeed.runtime.moe import backend
    from tokenspeed.runtime.moe.kernels import gemv_table

    read = {pdl.ENV, decode_attention.ONE_LAUNCH_ENV, backend.FUSED_ROUTE_ENV, gemv_table.ENV}
    assert set(SWITCHES) == read


def test_provenance_records_the_switches_set_and_no_other_variable(monkeypatch):
    for name in SWITCHES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TOKENSPEED_DECODE_ONE_LAUNCH", "1")
    monkeypatch.setenv("TOKENSPEED_MOE_GEMV", "force")
    monkeypatch.setenv("TOKENSPEED_API_KEY", "sk-secret")
    switches = provenance()["switches"]
    assert switches == {"TOKENSPEED_DECODE_ONE_LAUNCH": "1", "TOKENSPEED_MOE_GEMV": "force"}
    assert "sk-secret" not in repr(provenance())
