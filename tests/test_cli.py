"""The command line: results for good input, one clear line and a non-zero exit for bad."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from optpipe.cli import main
from optpipe.problem import problem_to_toml, uniform_problem


@pytest.fixture()
def problem_file(tmp_path: Path) -> Path:
    path = tmp_path / "p.toml"
    path.write_text(problem_to_toml(uniform_problem(4, 8, forward=1e-3, backward_input=1e-3,
                                                    backward_weight=1e-3, activation=2**20,
                                                    budget=float("inf"))))
    return path


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "optpipe.cli", *args], capture_output=True,
                          text=True, timeout=300)


def test_simulate_json_has_the_documented_keys(problem_file, capsys):
    assert main(["simulate", "--problem", str(problem_file), "--schedule", "1f1b", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {"makespan", "bubble_rate", "peak_memory", "device_span", "actions"} <= set(data)
    assert data["makespan"] == pytest.approx((8 + 4 - 1) * 3e-3)
    assert len(data["peak_memory"]) == 4 and len(data["device_span"]) == 4
    action = data["actions"][0]
    assert {"device", "stage", "op", "microbatch", "start", "end"} <= set(action)
    assert len(data["actions"]) == 4 * 8 * 2


def test_compare_lists_every_schedule(problem_file, capsys):
    assert main(["compare", "--problem", str(problem_file), "--json"]) == 0
    names = {row["schedule"] for row in json.loads(capsys.readouterr().out)}
    assert {"gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-h2", "zb-v", "zb-auto",
            "pipeoffload"} <= names


def test_export_formats(problem_file, tmp_path):
    for fmt, name in (("json", "s.json"), ("chrome", "s.trace.json"), ("torch-csv", "s.csv")):
        out = tmp_path / name
        assert main(["export", "--problem", str(problem_file), "--schedule", "zb-h1",
                     "--format", fmt, "-o", str(out)]) == 0
        assert out.stat().st_size > 0
    # an exported schedule file is accepted back as --schedule
    assert main(["simulate", "--problem", str(problem_file), "--schedule",
                 str(tmp_path / "s.json")]) == 0


@pytest.mark.parametrize("args, message", [
    (["simulate", "--stages", "4", "--mem", "80 gigs"], "80GiB"),
    # a plain 80 is 80 bytes: refused rather than a table where nothing fits
    (["compare", "--stages", "4", "--mem", "80"], "--mem 80GB or 80GiB"),
    (["solve", "--stages", "4", "--mem", "80"], "has no unit"),
    (["simulate", "--problem", "/nonexistent.toml"], "does not exist"),
    (["simulate", "--stages", "4", "--model", "gpt-9000"], "unknown model"),
    (["simulate", "--stages", "4", "--schedule", "zigzag"], "known:"),
])
def test_user_mistakes_get_one_line_and_exit_2(args, message, capsys):
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("optpipe: error:") and message.lower() in err.lower()
    assert "\n" not in err and "Traceback" not in err


def test_corrupt_schedule_file_is_named(problem_file, tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "optpipe-schedule", "version": 1, "actions": [[["F", 0, 0]]]')
    assert main(["simulate", "--problem", str(problem_file), "--schedule", str(bad)]) == 2
    assert "not valid JSON" in capsys.readouterr().err
    good = tmp_path / "good.json"
    assert main(["export", "--problem", str(problem_file), "--schedule", "1f1b", "-o",
                 str(good)]) == 0
    data = json.loads(good.read_text())
    data["actions"][1] = [a for a in data["actions"][1] if a != ["F", 1, 3]]
    good.write_text(json.dumps(data))
    capsys.readouterr()
    assert main(["simulate", "--problem", str(problem_file), "--schedule", str(good)]) == 2
    err = capsys.readouterr().err
    assert "BW(stage 1, mb 3)" in err and "its F is missing on device 1" in err


def test_schedule_for_another_pipeline_is_rejected(problem_file, tmp_path, capsys):
    other = tmp_path / "other.toml"
    other.write_text(problem_to_toml(uniform_problem(4, 6)))
    out = tmp_path / "s.json"
    assert main(["export", "--problem", str(other), "--schedule", "1f1b", "-o", str(out)]) == 0
    assert main(["simulate", "--problem", str(problem_file), "--schedule", str(out)]) == 2
    assert "6 microbatches" in capsys.readouterr().err


def test_real_process_exit_code_and_no_traceback():
    proc = run_cli("compare", "--stages", "4", "--mem", "lots")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and "write it like" in proc.stderr


def test_python_dash_m_optpipe_is_the_same_command(problem_file):
    """``python -m optpipe`` (no console script on PATH) runs the same CLI, exit codes too."""
    ok = subprocess.run([sys.executable, "-m", "optpipe", "simulate", "--problem",
                         str(problem_file), "--schedule", "1f1b", "--json"],
                        capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0 and json.loads(ok.stdout)["makespan"] > 0
    bad = subprocess.run([sys.executable, "-m", "optpipe", "compare", "--stages", "4",
                          "--mem", "lots"], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
