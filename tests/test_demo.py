"""`eagle-synth demo` (the README's first set-up command) runs a whole campaign end to end:
private Redis, devserver, a real worker, conversations with tool calls; then shows a record."""

from __future__ import annotations

import re

from eagle_synth.records import iter_records
from tests.helpers import cli


def test_demo_runs_a_campaign_with_tool_conversations_end_to_end(tmp_path):
    shown = cli("demo", "--dir", str(tmp_path / "demo"), timeout=300).stdout.decode()
    assert "100.0% finished" in shown
    done = int(re.search(r"^│ done\s+│\s+(\d+) │", shown, re.M).group(1))
    records = list(iter_records(tmp_path / "demo" / "out" / "demo"))
    assert len(records) == done and len({r.key for r in records}) == done
    # The tool conversation: parallel calls replayed, the turn after its results answered in
    # words, and a row where the model called a tool where the dataset answered in words.
    turns = {r.turn: r for r in records if r.id == "demo-tools-0"}
    assert turns[0].tool_calls == 2 and turns[1].tool_calls == 0 and 2 in turns
    assert re.search(r"tool-call-mismatch\s+│\s+1 │", shown)
    assert "its own tool calls among them" in shown and "<tool_response>" in shown
