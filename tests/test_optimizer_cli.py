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


def test_a_run_past_the_time_limit_says_why(problem_file) -> None:
    """The fixed schedules and the first warm starts are built whatever the limit; a
    command that ran past it says so, with the time they took and what the search had,
    and one within it (or within the slack) says nothing."""
    from optpipe.optimizer.cli import LIMIT_SLACK, _over_limit
    from optpipe.optimizer.driver import solve

    _, problem = problem_file
    result = solve(problem, time_limit=5, progress=False, cache=False)
    assert _over_limit(result, problem, 5, result.wall_time) == ""
    assert _over_limit(result, problem, 1, 1 + LIMIT_SLACK) == ""
    note = _over_limit(result, problem, 1, 7.5)
    assert note.startswith("note: took 7.5 s, over --time-limit 1 s")
    assert f"({result.warm_start_time:.1f} s for 3 x 4 here)" in note
    result.warm_start_time = None                        # a cached answer
    assert _over_limit(result, problem, 1, 7.5) == "note: took 7.5 s, over --time-limit 1 s"


def test_solve_infeasible_is_one_line(tmp_path, problem_file, capsys) -> None:
    path, _ = problem_file
    code = main(["solve", "--problem", str(path), "--mem", "1.5GB", "--time-limit", "5",
                 "-o", str(tmp_path / "s.json"), "--no-gantt"])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("optpipe: error: no schedule fits") and "\n" not in err
    assert err.endswith("to fit, raise the budget (--mem, or the problem file's budget) "
                        "or split the model over more stages")


@pytest.mark.parametrize("argv, remedy", [
    # llama2-13b's weights and Adam state over 4 stages (50.7 GiB) exceed 40 GB
    (["--model", "llama2-13b", "--stages", "4", "--mem", "40GB"],
     "device 0's static memory alone"),
    # gpt-14.6b on 8 stages: the static part (28.6 GiB) fits in 32 GB (29.8 GiB), one
    # activation more does not
    (["--stages", "8", "--mem", "32GB"], "shrink a microbatch's activations (--recompute"),
])
def test_an_infeasible_preset_says_which_option_lowers_the_need(tmp_path, capsys, argv,
                                                                remedy) -> None:
    code = main(["solve", *argv, "--time-limit", "5", "-o", str(tmp_path / "s.json"),
                 "--no-gantt"])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("optpipe: error: no schedule fits") and "\n" not in err
    assert remedy in err and "(--mem)" in err


@pytest.mark.parametrize("text, value", [("0.02", 0.02), ("2%", 0.02), ("0", 0.0),
                                         ("0.5 %", 0.005)])
def test_the_gap_is_a_fraction_or_a_percentage(text, value) -> None:
    from optpipe.optimizer.cli import _gap
    assert _gap(text) == pytest.approx(value)


@pytest.mark.parametrize("text, message", [("2", "for 2 percent write 2%"),
                                           ("-1", "must not be negative"),
                                           ("abc", "write 0.01 or 1%")])
def test_a_bad_gap_is_refused_with_what_to_write(tmp_path, problem_file, capsys,
                                                 text, message) -> None:
    path, _ = problem_file
    with pytest.raises(SystemExit) as exit_:
        main(["solve", "--problem", str(path), f"--gap={text}", "--no-gantt",
              "-o", str(tmp_path / "s.json")])
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


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


# ------------------------------------------------ a solved file brings its problem
def _solved(tmp_path, problem_file) -> tuple:
    path, problem = problem_file
    out = tmp_path / "s.json"
    assert main(["solve", "--problem", str(path), "--mem", "3GB", "--time-limit", "10",
                 "-o", str(out), "--no-gantt", "--quiet", "--no-offload"]) == 0
    return out, problem.with_budget(3 * 10**9)


def test_a_solved_file_carries_its_problem(tmp_path, problem_file) -> None:
    out, problem = _solved(tmp_path, problem_file)
    record = load_schedule(out).provenance["problem"]
    from optpipe.problem import problem_from_dict
    assert problem_from_dict(record).hash() == problem.hash()
    # strict JSON: an unlimited budget is left out, not written as Infinity
    assert "Infinity" not in json.dumps(uniform_problem(2, 2).to_record())


def test_gantt_and_simulate_take_the_file_alone(tmp_path, problem_file, capsys) -> None:
    """After ``optpipe solve``, ``optpipe gantt FILE`` needs no problem options: the
    default problem (8 stages of the default model) would not even fit the file."""
    out, problem = _solved(tmp_path, problem_file)
    capsys.readouterr()
    png = tmp_path / "g.png"
    assert main(["gantt", str(out), "-o", str(png)]) == 0
    assert png.stat().st_size > 10_000
    capsys.readouterr()
    assert main(["simulate", str(out), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    expected = simulate(problem, load_schedule(out))
    assert data["makespan"] == pytest.approx(expected.makespan)
    assert data["budget"] == [3 * 10**9] * 3
    assert main(["simulate", str(out)]) == 0
    assert "problem      uniform" in capsys.readouterr().out     # the file's, by name
    # --mem still adjusts the carried problem: 1.5 GB holds one activation (1 GB)
    # above the static 1 GB only partly, so the schedule is over it
    assert main(["simulate", str(out), "--mem", "1.5GB", "--strict"]) == 1


def test_the_schedule_is_given_once(tmp_path, problem_file, capsys) -> None:
    out, _ = _solved(tmp_path, problem_file)
    capsys.readouterr()
    assert main(["gantt", str(out), "--schedule", "1f1b"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "not both" in err


def test_problem_options_replace_the_carried_problem(tmp_path, problem_file, capsys) -> None:
    out, _ = _solved(tmp_path, problem_file)
    capsys.readouterr()
    assert main(["simulate", str(out), "--stages", "8"]) == 2
    err = capsys.readouterr().err.strip()
    assert "3 devices but the problem has 8" in err and err.count("\n") == 0


def test_a_file_without_a_problem_says_what_to_give(tmp_path, problem_file, capsys) -> None:
    out, _ = _solved(tmp_path, problem_file)
    schedule = load_schedule(out)
    del schedule.provenance["problem"]
    bare = tmp_path / "bare.json"
    schedule.save(bare)
    capsys.readouterr()
    assert main(["gantt", str(bare)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--stages 3 --microbatches 4" in err


def test_a_corrupt_carried_problem_is_one_line(tmp_path, problem_file, capsys) -> None:
    out, _ = _solved(tmp_path, problem_file)
    data = json.loads(out.read_text())
    data["provenance"]["problem"]["forward"] = "fast"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    capsys.readouterr()
    assert main(["simulate", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "carries a problem that is not valid" in err


def test_an_exported_schedule_carries_its_problem_too(tmp_path, problem_file, capsys) -> None:
    path, problem = problem_file
    out = tmp_path / "zbh1.json"
    assert main(["export", "--schedule", "zb-h1", "--problem", str(path), "--mem", "3GB",
                 "-o", str(out)]) == 0
    capsys.readouterr()
    assert main(["simulate", str(out), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["budget"] == [3 * 10**9] * 3
    assert data["makespan"] == pytest.approx(
        simulate(problem.with_budget(3 * 10**9), load_schedule(out)).makespan)
