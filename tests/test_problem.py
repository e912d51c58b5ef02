"""Problem files, validation, splitting into chunks and the content hash."""

import json

import pytest

from optpipe.errors import OptPipeError
from optpipe.problem import (load_problem, problem_from_dict, problem_to_toml,
                             uniform_problem)
from optpipe.schedule import interleaved_placement, v_placement

ISSUE_EXAMPLE = '''
stages = 8
microbatches = 24
[time]
forward = "18.522ms"
backward_input = "18.086ms"
backward_weight = "9.337ms"
p2p = "0.601ms"
[memory]
activation = "10MiB"
freed_by_backward_input = "6MiB"
freed_by_backward_weight = "4MiB"
static = "0"
budget = "80GB"
[offload]
d2h_bandwidth = "25GB/s"
h2d_bandwidth = "25GB/s"
'''


def test_issue_example_loads(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text(ISSUE_EXAMPLE)
    p = load_problem(path)
    assert p.stages == 8 and p.microbatches == 24 and p.devices == 8
    assert p.forward == (0.018522,) * 8
    assert p.activation == (10 * 2**20,) * 8
    assert p.freed_by_b == (6 * 2**20,) * 8 and p.freed_by_w == (4 * 2**20,) * 8
    assert p.budget == (80e9,) * 8
    assert p.p2p == pytest.approx(0.601e-3)
    assert p.d2h_bandwidth == 25e9


def test_per_stage_lists_and_derived_weight_release():
    p = problem_from_dict({"stages": 2, "microbatches": 4,
                           "time": {"forward": ["1ms", "2ms"], "backward_input": "1ms"},
                           "memory": {"activation": [100, 200], "freed_by_backward_input": 60}})
    assert p.forward == (0.001, 0.002)
    assert p.freed_by_w == (40, 140)
    assert p.backward_weight == (0.0, 0.0)
    assert p.budget == (float("inf"),) * 2


@pytest.mark.parametrize("change, message", [
    ({"stages": 0}, "stages must be at least 1"),
    ({"time": {"forward": ["1ms"] * 3, "backward_input": "1ms"}}, "3 values but there are 2"),
    ({"memory": {"activation": 10, "freed_by_backward_input": 6,
                 "freed_by_backward_weight": 6}}, "must equal activation"),
    ({"memory": {"activation": "10 apples"}}, "512MiB"),
    ({"colour": "red"}, "unknown problem key"),
    ({"time": {"forward": "1ms", "backward_input": "1ms", "bogus": 1}}, "unknown key"),
])
def test_bad_problems_are_named(change, message):
    data = {"stages": 2, "microbatches": 4, "time": {"forward": "1ms", "backward_input": "1ms"},
            "memory": {"activation": 10}}
    data.update(change)
    with pytest.raises(OptPipeError, match=message):
        problem_from_dict(data)


def test_corrupt_file(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("stages = = 3")
    with pytest.raises(OptPipeError, match="not valid TOML"):
        load_problem(bad)
    with pytest.raises(OptPipeError, match="does not exist"):
        load_problem(tmp_path / "missing.toml")


def test_round_trips_through_toml_and_json(tmp_path):
    p = uniform_problem(4, 8, forward=1e-3, backward_input=2e-3, backward_weight=1e-3,
                        p2p=1e-4, activation=1000, static=5, budget=9000)
    path = tmp_path / "p.toml"
    path.write_text(problem_to_toml(p))
    q = load_problem(path)
    assert q.hash() == p.hash()
    path = tmp_path / "p.json"
    path.write_text(json.dumps(p.to_dict()))
    assert load_problem(path).hash() == p.hash()


def test_hash_ignores_name_but_not_content():
    a = uniform_problem(4, 8, name="a")
    assert a.hash() == uniform_problem(4, 8, name="b").hash()
    assert a.hash() != uniform_problem(4, 9).hash()


def test_split_interleaved_and_v():
    p = problem_from_dict({"stages": 2, "microbatches": 4,
                           "time": {"forward": ["2ms", "4ms"], "backward_input": "2ms"},
                           "memory": {"activation": [100, 201], "freed_by_backward_input": 50}})
    q = p.split(interleaved_placement(2, 2))
    assert q.stages == 4 and q.devices == 2 and q.chunks == 2
    assert q.forward == pytest.approx((1e-3, 2e-3, 1e-3, 2e-3))
    assert all(b + w == a for a, b, w in zip(q.activation, q.freed_by_b, q.freed_by_w))
    v = p.split(v_placement(2))
    assert v.forward == pytest.approx((1e-3, 2e-3, 2e-3, 1e-3))
    with pytest.raises(OptPipeError, match="equally"):
        p.split([0, 0, 1])


def test_activation_budget():
    p = uniform_problem(4, 8, activation=1000, static=500)
    assert p.activation_budget(2).budget == (2500.0,) * 4


# ------------------------------------------------------------- measured chunks
def _v_profile(**change):
    """A V-shape cut of a 2-device problem whose device 0 holds the heavy chunks."""
    from optpipe.problem import ChunkProfile

    figures = dict(placement=(0, 1, 1, 0), forward=(1.0, 0.5, 0.5, 2.0),
                   backward_input=(1.0, 0.5, 0.5, 2.0), backward_weight=(1.0, 0.5, 0.5, 1.0),
                   activation=(300, 100, 100, 500), freed_by_b=(100, 50, 50, 400),
                   freed_by_w=(200, 50, 50, 100), static=(900, 100), partition=(1, 1, 1, 1))
    figures.update(change)
    return ChunkProfile(**figures)


def test_split_uses_measured_chunks_and_files_keep_them(tmp_path):
    from dataclasses import replace

    base = uniform_problem(2, 4, activation=400).with_budget(4000)
    problem = replace(base, chunk_profiles=(_v_profile(),))
    v = problem.split(v_placement(2))
    assert v.forward == (1.0, 0.5, 0.5, 2.0) and v.activation == (300, 100, 100, 500)
    assert v.static == (900, 100) and v.budget == (4000, 4000)
    assert v.meta["per_chunk"] and v.meta["partition"] == [1, 1, 1, 1]
    even = problem.split(interleaved_placement(2, 2))      # no profile: even split
    assert even.activation == (200, 200, 200, 200) and "per_chunk" not in even.meta
    for path in (tmp_path / "p.toml", tmp_path / "p.json"):
        path.write_text(problem_to_toml(problem) if path.suffix == ".toml"
                        else json.dumps(problem.to_dict()))
        again = load_problem(path)
        assert again == problem and again.hash() == problem.hash()
    # the record a solved schedule carries: strict JSON, the same problem back
    again = problem_from_dict(json.loads(json.dumps(problem.to_record(), allow_nan=False)))
    assert again == problem and again.hash() == problem.hash()
    assert problem.hash() != base.hash()
    # no chunk profiles: the dict (and so the hash the bundled library is keyed by)
    # has no such key, as before the field existed
    assert "chunk_profiles" not in base.to_dict()


def test_the_simulator_and_the_solver_judge_measured_chunks():
    """Where measured chunks differ from an even split, the one judge uses them: a V
    schedule that fits the even split does not fit the measured cut, and the solver's
    answer fits the measured cut."""
    from dataclasses import replace

    from optpipe.generators import generate
    from optpipe.optimizer import solve
    from optpipe.simulator import simulate

    base = uniform_problem(2, 4, p2p=0.0, activation=400).with_budget(1800)
    heavy = replace(base, chunk_profiles=(_v_profile(),))
    schedule = generate("zb-v", base)
    assert simulate(base, schedule).fits
    assert not simulate(heavy, schedule).fits
    result = solve(heavy, time_limit=10, progress=False, cache=False, offload=False)
    assert result.sim.fits
    assert simulate(heavy, result.schedule).peak_memory == result.sim.peak_memory


@pytest.mark.parametrize("change, message", [
    (dict(placement=(0, 1)), "more stages than devices"),
    (dict(forward=(1.0, 1.0)), "'forward' has 2 entries"),
    (dict(static=(1,)), "'static' has 1 entries"),
    (dict(freed_by_b=(0, 0, 0, 0)), "must equal activation"),
])
def test_bad_chunk_profiles_are_named(change, message):
    from dataclasses import replace

    with pytest.raises(OptPipeError, match=message):
        replace(uniform_problem(2, 4), chunk_profiles=(_v_profile(**change),))


def test_bad_chunk_tables_in_files_are_named(tmp_path):
    text = problem_to_toml(uniform_problem(2, 4))
    path = tmp_path / "p.toml"
    path.write_text(text + "[[chunked]]\nplacement = [0, 1, 1, 0]\nforward = [1, 1]\n")
    with pytest.raises(OptPipeError, match="needs backward_input, activation, static"):
        load_problem(path)
    path.write_text(text + "[[chunked]]\nplacement = [0, 1, 1, 0]\nforward = [1, 1]\n"
                    "backward_input = [1, 1, 1, 1]\nactivation = [1, 1, 1, 1]\n"
                    "static = [0, 0]\n")
    with pytest.raises(OptPipeError, match="'forward' must list 4 values"):
        load_problem(path)


def test_a_flat_record_with_bad_values_is_one_clear_error():
    """The flat form (``to_dict``/``to_record``, what a schedule file carries) names
    what is wrong instead of raising Python's own errors."""
    record = uniform_problem(2, 2).to_record()
    assert "budget" not in record                      # unlimited: left out
    assert problem_from_dict(record).budget == (float("inf"),) * 2
    for key, value in (("forward", ["fast", 1.0]), ("activation", "big")):
        with pytest.raises(OptPipeError, match=f"'{key}' must list numbers"):
            problem_from_dict({**record, key: value})
    with pytest.raises(OptPipeError, match="problem data is not valid"):
        problem_from_dict({**record, "p2p": None})
    with pytest.raises(OptPipeError, match="has no 'freed_by_backward_input'"):
        problem_from_dict({k: v for k, v in record.items()
                           if k != "freed_by_backward_input"})
