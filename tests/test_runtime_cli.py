"""``optpipe profile`` and ``optpipe run`` end to end (real processes, tiny GPT on CPU)."""

from __future__ import annotations

import json

import pytest

from optpipe.cli import main
from optpipe.problem import load_problem
from optpipe.simulator import simulate


def test_profile_writes_a_problem_the_optimizer_accepts(tmp_path, capsys):
    out = tmp_path / "problem.toml"
    assert main(["profile", "--model", "tiny-gpt", "--stages", "4", "--microbatches", "8",
                 "--p2p", "0.05ms", "--repeats", "1", "-o", str(out)]) == 0
    assert "wrote" in capsys.readouterr().out
    problem = load_problem(out)
    assert (problem.stages, problem.microbatches, problem.devices) == (4, 8, 4)
    assert problem.p2p == pytest.approx(5e-5)
    assert all(t > 0 for t in problem.forward + problem.backward_weight)
    assert problem.backward_input[0] < problem.backward_input[1]   # stage 0's B is empty
    assert all(a > 0 for a in problem.activation)
    assert problem.freed_by_b[3] > 0                               # the loss is freed by B
    assert all(s > 0 for s in problem.static)
    from optpipe.generators import generate

    assert simulate(problem, generate("zb-h1", problem)).makespan > 0


def test_run_prints_measured_beside_simulated(tmp_path, capsys):
    gantt = tmp_path / "measured.png"
    assert main(["run", "--model", "tiny-gpt", "--layers", "2", "--schedule", "zb-h1",
                 "--stages", "2", "--microbatches", "4", "--steps", "2",
                 "--gantt", str(gantt)]) == 0
    out = capsys.readouterr().out
    assert "measured" in out and "simulated" in out and "device 1 peak" in out
    assert "gloo, 2 processes" in out
    assert gantt.stat().st_size > 0
    assert main(["run", "--layers", "2", "--stages", "2", "--microbatches", "4",
                 "--steps", "1", "--p2p", "0ms", "--single-process", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["processes"] == 1 and data["measured_step"] > 0
    # peaks follow the same accounting as the simulator: equal on the profiled problem
    assert data["measured_peak"] == data["simulated_peak"]


def test_user_errors_are_one_line(capsys):
    assert main(["run", "--stages", "8", "--steps", "1", "--p2p", "0ms"]) == 2
    assert "fewer than the 8 stages" in capsys.readouterr().err
    assert main(["profile", "--model", "no-such-model", "--p2p", "0ms"]) == 2
    assert "unknown model 'no-such-model'" in capsys.readouterr().err
    assert main(["run", "--stages", "2", "--partition", "a,b", "--p2p", "0ms"]) == 2
    assert "--partition 'a,b'" in capsys.readouterr().err


def test_run_takes_the_pipeline_from_a_schedule_file(tmp_path, capsys):
    """No --stages or --microbatches: the schedule file's devices and microbatches (a
    solved file has 32 microbatches; the plain default of 8 would refuse it)."""
    from optpipe.generators import generate
    from optpipe.problem import uniform_problem

    path = tmp_path / "s.json"
    generate("zb-h1", uniform_problem(2, 5)).save(path)
    assert main(["run", "--layers", "2", str(path), "--steps", "1",      # as gantt takes it
                 "--p2p", "0ms", "--single-process", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["problem"]["devices"], data["problem"]["microbatches"]) == (2, 5)
    # given options still win, and a mismatch is still one clear line
    assert main(["run", "--layers", "2", "--schedule", str(path), "--microbatches", "4",
                 "--steps", "1", "--p2p", "0ms", "--single-process"]) == 2
    assert "is for 5 microbatches but the problem has 4" in capsys.readouterr().err
