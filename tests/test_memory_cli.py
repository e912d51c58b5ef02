"""``optpipe memplan``: figures for good input, one clear line for bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from optpipe.cli import main
from optpipe.memory.trace import load_trace
from optpipe.memory.validate import plan_violations

CSV = """id,lower,upper,size
b1,0,3,4
b2,3,9,4
b3,0,9,4
b4,9,21,4
b5,0,21,4
"""


@pytest.fixture()
def csv_trace(tmp_path: Path) -> Path:
    path = tmp_path / "input.12.csv"
    path.write_text(CSV)
    return path


def test_trace_json_has_the_documented_keys(csv_trace, capsys):
    assert main(["memplan", "--trace", str(csv_trace), "--json", "--time-limit", "2"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {"peak_live", "planned_peak", "caching_reserved", "caching_fragmentation",
            "planned_fragmentation", "offsets"} <= set(data)
    assert data["peak_live"] == 12 and data["planned_peak"] == 12
    assert data["caching_reserved"] == 2 * 2**20  # five 512-byte blocks in one segment
    assert data["planned_fragmentation"] == 0.0
    assert not plan_violations(load_trace(csv_trace), data["offsets"], 12)


def test_trace_text_output_and_plot(csv_trace, tmp_path, capsys):
    plot = tmp_path / "plan.png"
    assert main(["memplan", "--trace", str(csv_trace), "--plot", str(plot),
                 "--time-limit", "2"]) == 0
    out = capsys.readouterr().out
    assert "peak live" in out and "planned arena" in out and "caching reserved" in out
    assert plot.stat().st_size > 1000 and plot.read_bytes()[:4] == b"\x89PNG"


def test_schedule_gives_one_plan_per_device(tmp_path, capsys):
    svg = tmp_path / "plan.svg"
    saved = tmp_path / "traces.json"
    assert main(["memplan", "--schedule", "zb-h1", "--model", "tiny-gpt", "--stages", "2",
                 "--microbatches", "4", "--json", "--time-limit", "2", "--workers", "1",
                 "--plot", str(svg), "--save-trace", str(saved)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert len(data["devices"]) == 2
    for row in data["devices"]:
        assert row["planned_peak"] >= row["peak_live"] > 0
        assert row["caching_reserved"] >= row["peak_live"]
    assert data["planned_peak"] == max(r["planned_peak"] for r in data["devices"])
    assert svg.read_text().lstrip().startswith("<?xml")
    assert len(json.loads(saved.read_text())) == 2


def test_a_schedule_file_alone_is_enough(tmp_path, capsys):
    """``optpipe memplan FILE`` like ``optpipe gantt FILE``: the file's own problem; a
    held-back schedule (OFFLOADs marked wait) plans like any other."""
    from optpipe.generators import generate
    from optpipe.problem import uniform_problem

    problem = uniform_problem(4, 8, p2p=0.05, freed_by_b=0, d2h_bandwidth=2000.0,
                              h2d_bandwidth=2000.0).activation_budget(1.1)
    schedule = generate("pipeoffload", problem)
    assert any(a.wait for _, a in schedule)
    schedule.provenance["problem"] = problem.to_dict()
    path = tmp_path / "held.json"
    schedule.save(path)
    assert main(["memplan", str(path), "--json", "--time-limit", "2", "--workers", "1"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert len(data["devices"]) == 4
    assert all(row["planned_peak"] >= row["peak_live"] > 0 for row in data["devices"])


def test_capacity_too_small_exits_1(csv_trace, capsys):
    assert main(["memplan", "--trace", str(csv_trace), "--capacity", "8", "--json",
                 "--time-limit", "1"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["devices"][0]["fits_capacity"] is False


@pytest.mark.parametrize("args, message", [
    ([], "needs --trace FILE or --schedule"),
    (["--trace", "missing.csv"], "does not exist"),
    (["--trace", "x.csv", "--schedule", "1f1b"], "not both"),
    (["--trace", "x.csv", "--capacity", "lots"], "cannot read --capacity"),
    (["--trace", "x.csv", "--time-limit", "0"], "--time-limit must be positive"),
    (["--schedule", "1f1b", "--model", "tiny-gpt", "--stages", "2", "--device", "5"],
     "--device 5 does not exist"),
])
def test_user_errors_are_one_line(args, message, capsys):
    assert main(["memplan", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
