"""`eagle-synth demo` (the README's first set-up command) runs a whole campaign end to end:
private Redis, devserver, a real worker, conversations with tool calls; then shows a record."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

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
    # The closing hints run as printed in a new shell of the same folder (no venv on PATH).
    hints = shown[shown.index("next, in this shell:") :].splitlines()[1:]
    export = next(line.strip() for line in hints if " export " in line)
    venv_bin = str(Path(sys.executable).parent)
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if p != venv_bin)
    ran = subprocess.run(["bash", "-c", export], env=env, capture_output=True, timeout=120)
    assert ran.returncode == 0, (export, ran.stderr.decode())
    assert len((tmp_path / "demo" / "train.jsonl").read_text().splitlines()) == done
    if not export.startswith("eagle-synth "):  # named by its path: say how to put it on PATH
        assert any("bin/activate` first" in line for line in hints), hints
