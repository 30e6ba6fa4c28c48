"""The run history (bench/results/history.jsonl) is data a reader can trust: each record's figures
are those of the results file it names, newest first, and `python -m bench.history` shows every run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench import history

ROOT = Path(__file__).parent.parent.parent
RUNS = history.load()
IN_TREE = [r for r in RUNS if r["results"].startswith("bench/results/")]


def test_the_runs_are_newest_first_and_say_what_each_was_for() -> None:
    assert [r["date"] for r in RUNS] == sorted((r["date"] for r in RUNS), reverse=True)
    for r in RUNS:
        assert r["commit"] and r["note"], r["date"]
        assert {"cpus", "python", "postgres", "commit_baseline_tx_s"} <= set(r["host"]), r["commit"]


@pytest.mark.parametrize("run", IN_TREE, ids=lambda r: r["commit"])
def test_each_records_figures_are_its_results_files(run: dict[str, Any]) -> None:
    """A figure typed into the history by hand, or a results file replaced, shows here."""
    out = json.loads((ROOT / run["results"]).read_text(encoding="utf-8"))
    made = history.record(out, run["results"], run["note"], run["host"]["speed"])
    for key, value in made.items():
        if key != "commit":  # (a run's results before 1c585b2's named no commit)
            assert run[key] == value, key


def test_adding_a_run_puts_it_first_and_the_table_shows_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    latest = ROOT / "bench" / "results" / "latest.json"
    monkeypatch.setattr(history, "HISTORY", tmp_path / "history.jsonl")
    (tmp_path / "history.jsonl").write_text("".join(json.dumps(r) + "\n" for r in RUNS[1:3]))
    assert history.main(["add", str(latest), "what it was for", "a fast host"]) == 0
    runs = history.load(tmp_path / "history.jsonl")
    assert [r["date"] for r in runs] == [
        json.loads(latest.read_text())["started"],
        RUNS[1]["date"],
        RUNS[2]["date"],
    ]
    assert runs[0]["host"]["speed"] == "a fast host" and runs[0]["results"] == "bench/results/latest.json"
    rows = history.markdown(runs).splitlines()[2:]
    assert len(rows) == 3 and rows[0].endswith("| what it was for |")
    assert f"| {RUNS[1]['commit']} |" in rows[1]
