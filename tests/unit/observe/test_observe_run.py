"""The commands' output paths: one status, JSON, `--watch` in a terminal and piped, Ctrl-C."""

from __future__ import annotations

import asyncio
import io
import json

import pytest
from rich.console import Console

from kit.errors import ProbeError
from kit.observe import run
from kit.observe.report import build_report
from kit.plan.resolve import resolve
from tests.conftest import REPO
from tests.support.observe_builders import cluster

PLAN = resolve(REPO / "topologies" / "local.yaml")


def canned_report():
    targets, now = cluster()
    return build_report(targets, now, timeout_s=3.0)


@pytest.fixture
def fake_rounds(monkeypatch):
    """Replace probing by two canned reports (or an interrupt)."""
    calls = {}

    async def watch(targets, options, interval_s, on_report, count=None):
        calls["targets"], calls["count"] = targets, count
        for _ in range(count or 2):
            on_report(canned_report())

    async def once(targets, options, rate_window_s=0.0):
        calls["rate_window_s"] = rate_window_s
        return canned_report()

    monkeypatch.setattr(run, "watch_reports", watch)
    monkeypatch.setattr(run, "probe_once", once)
    return calls


def console(terminal: bool) -> tuple[Console, io.StringIO]:
    buffer = io.StringIO()
    return Console(file=buffer, force_terminal=terminal, width=100, color_system=None), buffer


def test_status_once_waits_a_rate_window_and_prints_wide_tables_when_piped(fake_rounds):
    out, buffer = console(terminal=False)
    assert run.status(PLAN, out, run.ProbeOptions()) == 0
    assert fake_rounds["rate_window_s"] == run.DEFAULT_RATE_WINDOW_S
    text = buffer.getvalue()
    assert "prefill (2)" in text and "tok/s" in text and "not shown" not in text  # 180 columns
    assert max(len(line) for line in text.splitlines()) > 100


def test_status_watch_json_prints_one_object_per_line(fake_rounds):
    out, buffer = console(terminal=False)
    run.status(PLAN, out, run.ProbeOptions(), as_json=True, watch=True, count=2)
    lines = buffer.getvalue().splitlines()
    assert len(lines) == 2 and all(json.loads(line)["deployment"] == "demo" for line in lines)
    assert [w.name for w in fake_rounds["targets"].workers] == [
        "prefill-0",
        "prefill-1",
        "decode-0",
    ]


@pytest.mark.parametrize("terminal", [True, False])
def test_status_watch_refreshes_on_a_terminal_and_appends_when_piped(fake_rounds, terminal):
    out, buffer = console(terminal)
    run.status(PLAN, out, run.ProbeOptions(), watch=True, count=2)
    text = buffer.getvalue()
    if terminal:
        assert text.count("all healthy") >= 1
    else:  # every screen, as wide as a single status when piped
        assert text.count("all healthy") == 2
        assert max(len(line) for line in text.splitlines()) > 100


def test_ctrl_c_ends_watch_quietly(monkeypatch):
    async def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(run, "watch_reports", interrupted)
    out, _ = console(terminal=True)
    assert run.status(PLAN, out, run.ProbeOptions(), watch=True) == 0


def test_health_exit_status_and_json(fake_rounds, monkeypatch):
    out, buffer = console(terminal=False)
    assert run.health(PLAN, out, run.ProbeOptions()) == 0
    assert buffer.getvalue().startswith("OK: demo:")
    out, buffer = console(terminal=False)
    assert run.health(PLAN, out, run.ProbeOptions(), as_json=True) == 0
    assert json.loads(buffer.getvalue())["healthy"] is True


def test_a_zero_interval_is_refused():
    with pytest.raises(ProbeError, match="interval"):
        asyncio.run(run.watch_reports(run.targets_from_plan(PLAN), run.ProbeOptions(), 0, print))
