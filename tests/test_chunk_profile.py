"""Chunked schedules predicted on a per-chunk profile (real torch, tiny GPT on CPU).

A chunked schedule (V, interleaved) runs the model cut into ``len(placement)`` stages
with the runner's own partition; those stages differ (embedding, head), so the profiler
measures each of them and builds the chunked problem directly, in the form
``Problem.split`` gives, instead of an even split of the one-stage-per-device profile.
"""

from __future__ import annotations

import json
from dataclasses import asdict, replace

import pytest
import torch

from optpipe.cli import main
from optpipe.errors import OptPipeError
from optpipe.generators import generate
from optpipe.problem import load_problem, uniform_problem
from optpipe.runtime import GPT, GPTConfig, OptPipeRunner, gpt_batch, gpt_loss
from optpipe.runtime.measure import RunSpec, compare, measure_schedule, prediction_basis
from optpipe.runtime.profile import profile_gpt, profile_model, static_bytes
from optpipe.schedule import interleaved_placement, v_placement
from optpipe.simulator import simulate

CONFIG = GPTConfig.from_preset("tiny-gpt")          # 4 blocks of 64, tied embeddings


def _profile(stages, placement=None, **kw):
    torch.manual_seed(0)
    model = GPT(CONFIG)
    x, y = gpt_batch(CONFIG, 4)
    return profile_model(model, gpt_loss, x, y, stages, 8, repeats=1,
                         placement=placement, **kw), model


@pytest.fixture(scope="module")
def profiles():
    base, _ = _profile(2)
    v, model = _profile(4, v_placement(2))
    return base, v, model


def test_v_profile_is_a_chunked_problem_like_split(profiles):
    base, v, _ = profiles
    assert (v.stages, v.devices, v.chunks, v.microbatches) == (4, 2, 2, 8)
    assert v.meta["placement"] == [0, 1, 1, 0] and v.meta["per_chunk"] is True
    assert v.meta["partition"] == [1, 1, 1, 1]
    for key in ("forward", "backward_input", "backward_weight", "backward_fused"):
        assert len(getattr(v, key)) == 4
    assert all(t > 0 for t in v.forward + v.backward_weight + v.backward_fused)
    assert all(t > 0 for t in v.backward_input[1:])     # stage 0's B is empty
    assert all(a > 0 for a in v.activation) and v.freed_by_b[3] > 0
    assert len(v.static) == len(v.budget) == 2 and all(s > 0 for s in v.static)
    # the same form as Problem.split: fields, per-device lists, placement in meta
    split = base.split(v.meta["placement"])
    assert asdict(split).keys() == asdict(v).keys()
    assert (split.stages, split.devices, split.chunks) == (v.stages, v.devices, v.chunks)
    assert split.meta["placement"] == v.meta["placement"]
    # but measured per chunk: the last chunk holds the head and the loss
    assert v.activation[3] > v.activation[1]
    assert split.activation[3] == split.activation[0]


def test_activation_bytes_add_up_across_cuts(profiles):
    """Per device the V and the contiguous cut hold different blocks (device 0 of the V:
    embedding, block 0, block 3 and head; of the 2-stage cut: embedding, blocks 0 and 1),
    so their per-device bytes differ by design. What must hold: the chunks' total equals
    the base profile's total, and a placement that groups the same blocks per device
    ([0, 0, 1, 1]) reproduces the base profile per device."""
    base, v, _ = profiles
    assert sum(v.activation) == pytest.approx(sum(base.activation), rel=0.01)
    grouped, _ = _profile(4, [0, 0, 1, 1])
    assert grouped.meta["partition"] == [1, 1, 1, 1] and base.meta["partition"] == [2, 2]
    for d in range(2):
        chunks = [s for s in range(4) if grouped.meta["placement"][s] == d]
        assert sum(grouped.activation[s] for s in chunks) == pytest.approx(
            base.activation[d], rel=0.01)
        assert sum(grouped.freed_by_b[s] for s in chunks) <= base.activation[d]
    # the V's device 0 holds the first and the last chunk of the same 4-stage cut
    assert v.activation[0] == grouped.activation[0]
    assert v.activation[3] == grouped.activation[3]


def test_static_per_device_counts_a_shared_tensor_once(profiles):
    _, v, model = profiles
    schedule = generate("zb-v", uniform_problem(2, 8))
    runner = OptPipeRunner(model, schedule, gpt_loss)
    assert runner.plan.partition == v.meta["partition"]       # the runner's own cut
    modules = runner.plan.modules
    assert v.static[0] == static_bytes([modules[0], modules[3]], "adam")
    assert v.static[1] == static_bytes([modules[1], modules[2]], "adam")
    # the tied embedding (stages 0 and 3, both on device 0) once, as the runner counts it
    assert v.static[0] < static_bytes([modules[0]], "adam") + static_bytes([modules[3]], "adam")
    assert v.static[0] == 2 * runner.static_bytes(0)           # + Adam's two moments


def test_simulator_runs_zb_v_on_the_per_chunk_problem(profiles):
    base, v, _ = profiles
    schedule = generate("zb-v", base)
    assert schedule.placement == v.meta["placement"]
    result = simulate(v, schedule)
    assert result.makespan > 0 and len(result.peak_memory) == 2
    assert all(p > s for p, s in zip(result.peak_memory, v.static))
    # a schedule with another placement does not fit the chunked problem
    with pytest.raises(OptPipeError, match="does not match"):
        simulate(v, generate("interleaved-1f1b", base))
    assert prediction_basis(v, schedule) == "per-chunk profile"
    assert prediction_basis(base, schedule) == "even split"
    assert prediction_basis(base.split(schedule.placement), schedule) == "even split"
    assert prediction_basis(base, generate("zb-h1", base)) == "profile"


def test_measured_peaks_equal_the_per_chunk_plan():
    """Same accounting, same cut: the run's peaks equal the simulated ones (one process)."""
    problem, _ = _profile(4, interleaved_placement(2, 2))
    schedule = generate("interleaved-1f1b", uniform_problem(2, 4))
    problem = replace(problem, microbatches=4)
    spec = RunSpec(config=asdict(CONFIG), schedule=schedule.to_dict(), steps=1,
                   partition=problem.meta["partition"])
    run = measure_schedule(spec, single_process=True, threads=1)
    figures = compare(run, schedule, problem)
    assert figures["prediction"] == "per-chunk profile"
    assert figures["partition"] == problem.meta["partition"]
    assert figures["measured_peak"] == figures["simulated_peak"]


def test_placement_and_budget_checks():
    with pytest.raises(OptPipeError, match="has 4 stages but"):
        _profile(2, v_placement(2))
    with pytest.raises(OptPipeError, match="same number of stages"):
        _profile(3, [0, 0, 1])
    p, _ = _profile(4, v_placement(2), budget=[3e6, 4e6])
    assert p.budget == (3e6, 4e6)
    linear, _ = _profile(2, [0, 1])            # a linear placement: the base problem
    assert linear.devices == 2 and "placement" not in linear.meta


def test_profile_gpt_under_load_per_chunk():
    config = GPTConfig.from_preset("tiny-gpt", layers=4)
    p = profile_gpt(config, 4, 4, repeats=1, processes=2, threads=1,
                    placement=v_placement(2))
    assert (p.stages, p.devices) == (4, 2) and p.meta["placement"] == [0, 1, 1, 0]
    assert p.meta["profile_processes"] == 2 and len(p.forward) == 4


# ------------------------------------------------------------------ optpipe run
def test_run_predicts_a_chunked_schedule_per_chunk(capsys):
    args = ["run", "--model", "tiny-gpt", "--schedule", "zb-v", "--stages", "2",
            "--microbatches", "4", "--steps", "1", "--p2p", "0ms"]
    assert main(args + ["--single-process", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["prediction"] == "per-chunk profile"
    assert data["problem"]["stages"] == 4 and data["problem"]["devices"] == 2
    assert data["problem"]["placement"] == [0, 1, 1, 0]
    assert data["problem"]["partition"] == data["partition"] == [1, 1, 1, 1]
    assert data["measured_peak"] == data["simulated_peak"]
    # on real processes (gloo), printed
    assert main(args + ["--partition", "1,1,1,1"]) == 0
    out = capsys.readouterr().out
    assert "gloo, 2 processes" in out
    assert "predicted per chunk" in out and "placement [0, 1, 1, 0]" in out


def test_run_with_a_base_problem_file_says_even_split(tmp_path, capsys):
    path = tmp_path / "problem.toml"
    assert main(["profile", "--stages", "2", "--microbatches", "4", "--repeats", "1",
                 "--p2p", "0ms", "--no-chunks", "-o", str(path)]) == 0
    assert "chunked cuts: not measured" in capsys.readouterr().out
    assert "[[chunked]]" not in path.read_text()
    args = ["run", "--problem", str(path), "--schedule", "zb-v", "--stages", "2",
            "--microbatches", "4", "--steps", "1", "--single-process"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "even split" in out and "predicted per chunk" not in out


def test_a_profiled_file_carries_every_cut_the_optimizer_searches(tmp_path, capsys):
    """``optpipe profile`` measures the V-shape and interleaved cuts too; a schedule on
    either is then predicted (and solved) on measured chunks, the runner runs the cut
    that was measured, and its peaks equal the plan."""
    path = tmp_path / "problem.toml"
    assert main(["profile", "--stages", "2", "--microbatches", "4", "--repeats", "1",
                 "--p2p", "0ms", "-o", str(path)]) == 0
    assert "V shape and interleaved x2 measured" in capsys.readouterr().out
    problem = load_problem(path)
    assert [list(c.placement) for c in problem.chunk_profiles] == [[0, 1, 1, 0],
                                                                   [0, 1, 0, 1]]
    direct, _ = _profile(4, v_placement(2))   # the same cut, profiled on its own
    split = problem.split(v_placement(2))
    assert split.meta["per_chunk"] and split.meta["partition"] == direct.meta["partition"]
    assert split.activation == direct.activation and split.static == direct.static
    for schedule in ("zb-v", "interleaved-1f1b"):
        assert main(["run", "--problem", str(path), "--schedule", schedule, "--stages",
                     "2", "--microbatches", "4", "--steps", "1", "--single-process",
                     "--json"]) == 0
        data = json.loads(capsys.readouterr().out)
        assert data["prediction"] == "per-chunk profile", schedule
        assert data["measured_peak"] == data["simulated_peak"], schedule


def test_run_rejects_a_per_chunk_partition_for_an_unchunked_schedule(capsys):
    assert main(["run", "--stages", "2", "--partition", "1,1,1,1", "--schedule", "1f1b",
                 "--microbatches", "4", "--p2p", "0ms", "--single-process"]) == 2
    assert "--partition 1,1,1,1 lists 4 stages but schedule '1f1b' has 2" in \
        capsys.readouterr().err


def test_profile_under_load_needs_one_process_per_device():
    """Profiling under load is one pipeline of ranks: any other count is a clear error."""
    from optpipe.errors import OptPipeError
    from optpipe.runtime import GPTConfig
    from optpipe.runtime.profile import profile_gpt

    config = GPTConfig.from_preset("tiny-gpt")
    with pytest.raises(OptPipeError, match="one rank per device"):
        profile_gpt(config, 4, 4, repeats=1, processes=3)


def test_profile_says_when_the_model_is_too_short_for_the_cuts(tmp_path, capsys):
    path = tmp_path / "problem.toml"         # tiny-gpt: 4 blocks, the cuts need 8
    assert main(["profile", "--stages", "4", "--microbatches", "4", "--repeats", "1",
                 "--p2p", "0ms", "-o", str(path)]) == 0
    out = capsys.readouterr().out
    assert "chunked cuts: none measured" in out and "too few blocks for 8 stages" in out
    assert load_problem(path).chunk_profiles == ()
