"""``optpipe solve`` end to end on a small problem file (no cost model needed)."""

from __future__ import annotations

import json

import pytest

from optpipe.problem import problem_to_toml, uniform_problem
from optpipe.schedule import load_schedule
from optpipe.simulator import simulate


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("OPTPIPE_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture
def problem_file(tmp_path):
    problem = uniform_problem(3, 4, forward=0.001, backward_input=0.001,
                              backward_weight=0.001, p2p=0.0001, activation=10**9,
                              static=10**9)
    path = tmp_path / "p.toml"
    path.write_text(problem_to_toml(problem))
    return path, problem


def main(argv):
    from optpipe.cli import main as cli_main
    return cli_main(argv)


def test_solve_json(tmp_path, problem_file, capsys) -> None:
    path, problem = problem_file
    out = tmp_path / "s.json"
    code = main(["solve", "--problem", str(path), "--mem", "3GB", "--time-limit", "10",
                 "-o", str(out), "--no-gantt", "--json", "--no-offload"])
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    for key in ("makespan", "bubble_rate", "peak_memory", "fits", "status", "objective",
                "bound", "gap", "actions"):
        assert key in data
    assert data["fits"] is True
    schedule = load_schedule(out)
    sim = simulate(problem.with_budget(3 * 10**9), schedule)
    assert sim.makespan == pytest.approx(data["makespan"])
    assert all(p <= 3 * 10**9 for p in sim.peak_memory)


def test_solve_table(tmp_path, problem_file, capsys) -> None:
    path, _ = problem_file
    code = main(["solve", "--problem", str(path), "--mem", "3GB", "--time-limit", "10",
                 "-o", str(tmp_path / "s.json"), "--no-gantt", "--quiet"])
    assert code == 0
    text = capsys.readouterr().out
    assert "optpipe" in text and "1f1b" in text and "status" in text


def test_solve_infeasible_is_one_line(tmp_path, problem_file, capsys) -> None:
    path, _ = problem_file
    code = main(["solve", "--problem", str(path), "--mem", "1.5GB", "--time-limit", "5",
                 "-o", str(tmp_path / "s.json"), "--no-gantt"])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("optpipe: error: no schedule fits") and "\n" not in err


def test_solve_placements(tmp_path, problem_file, capsys) -> None:
    """``--placements linear``: a one-stage-per-device answer, and the fixed schedules on
    other placements marked as not allowed; a misspelt placement is one line."""
    path, _ = problem_file
    out = tmp_path / "s.json"
    code = main(["solve", "--problem", str(path), "--mem", "3GB", "--time-limit", "10",
                 "-o", str(out), "--no-gantt", "--quiet", "--placements", "linear"])
    assert code == 0
    assert load_schedule(out).placement == [0, 1, 2]
    text = capsys.readouterr().out
    assert "placement not allowed" in text
    code = main(["solve", "--problem", str(path), "--mem", "3GB", "--time-limit", "5",
                 "-o", str(out), "--no-gantt", "--placements", "linear,zigzag"])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("optpipe: error: unknown placement zigzag") and "\n" not in err
