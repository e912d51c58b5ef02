"""Tests of the pictures and trace export (optpipe.viz).

Schedules are built by hand with ``from_orders`` so these tests depend only on the
schedule, problem and simulator contracts, not on any generator.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from optpipe.errors import OptPipeError
from optpipe.problem import uniform_problem
from optpipe.schedule import Schedule, from_orders, interleaved_placement, linear_placement
from optpipe.simulator import SimResult, simulate

MAGIC = {".png": b"\x89PNG\r\n\x1a\n", ".svg": b"<?xml", ".pdf": b"%PDF-"}


# ------------------------------------------------------------------ hand-built schedules
def one_f_one_b(devices: int, microbatches: int, split: bool = False) -> Schedule:
    """1F1B; with ``split`` each fused backward becomes B then W right after it."""
    orders = []
    for d in range(devices):
        warmup = min(devices - d - 1, microbatches)
        order: list[tuple[str, int, int]] = [("F", d, m) for m in range(warmup)]
        for m in range(warmup, microbatches):
            order.append(("F", d, m))
            b = m - warmup
            order += [("B", d, b), ("W", d, b)] if split else [("BW", d, b)]
        for b in range(microbatches - warmup, microbatches):
            order += [("B", d, b), ("W", d, b)] if split else [("BW", d, b)]
        orders.append(order)
    return from_orders("1F1B" + (" (split B/W)" if split else ""), linear_placement(devices),
                       microbatches, orders)


def zb_h1(devices: int, microbatches: int) -> Schedule:
    """A ZB-H1-like order: up to D-1-d weight gradients deferred to fill the cool-down."""
    orders = []
    for d in range(devices):
        warmup = min(devices - d - 1, microbatches)
        order: list[tuple[str, int, int]] = [("F", d, m) for m in range(warmup)]
        pending: list[int] = []
        for m in range(warmup, microbatches):
            b = m - warmup
            order += [("F", d, m), ("B", d, b)]
            pending.append(b)
            if len(pending) > devices - 1 - d:
                order.append(("W", d, pending.pop(0)))
        for b in range(microbatches - warmup, microbatches):
            order.append(("B", d, b))
            pending.append(b)
            order.append(("W", d, pending.pop(0)))
        order += [("W", d, b) for b in pending]
        orders.append(order)
    return from_orders("ZB-H1 (hand-built)", linear_placement(devices), microbatches, orders)


def offloaded(devices: int, microbatches: int) -> Schedule:
    """1F1B whose activations go to host after F and come back one action before BW."""
    base = one_f_one_b(devices, microbatches)
    orders = []
    for d, acts in enumerate(base.actions):
        order = [(a.op.value, a.stage, a.microbatch) for a in acts]
        where = {(op, m): i for i, (op, _, m) in enumerate(order)}
        out: list[tuple[str, int, int]] = []
        reload_before: dict[int, int] = {}
        for m in range(microbatches):
            f, bw = where[("F", m)], where[("BW", m)]
            if bw - f >= 3:
                reload_before[bw - 1] = m
        for i, item in enumerate(order):
            if i in reload_before:
                out.append(("RELOAD", d, reload_before[i]))
            out.append(item)
            if item[0] == "F" and item[2] in reload_before.values():
                out.append(("OFFLOAD", d, item[2]))
        orders.append(out)
    return from_orders("1F1B + offload (hand-built)", linear_placement(devices),
                       microbatches, orders)


def interleaved(devices: int, microbatches: int, chunks: int = 2) -> Schedule:
    """Megatron's interleaved 1F1B (microbatches a multiple of devices)."""
    D, v, M = devices, chunks, microbatches
    total = M * v

    def unit(k: int, forward: bool) -> tuple[int, int]:
        chunk = (k // D) % v
        if not forward:
            chunk = v - 1 - chunk
        return chunk, (k // (D * v)) * D + k % D

    orders = []
    for d in range(D):
        warmup = min((D - d - 1) * 2 + (v - 1) * D, total)
        order: list[tuple[str, int, int]] = []
        for k in range(warmup):
            c, m = unit(k, True)
            order.append(("F", c * D + d, m))
        for k in range(warmup, total):
            c, m = unit(k, True)
            order.append(("F", c * D + d, m))
            c, m = unit(k - warmup, False)
            order.append(("BW", c * D + d, m))
        for k in range(total - warmup, total):
            c, m = unit(k, False)
            order.append(("BW", c * D + d, m))
        orders.append(order)
    return from_orders("interleaved 1F1B (hand-built)", interleaved_placement(D, v), M, orders)


def problem(devices: int, microbatches: int, **kw):
    params = dict(forward=1e-3, backward_input=1e-3, backward_weight=0.6e-3, p2p=0.05e-3,
                  activation=64 << 20, static=4 << 30, budget=float(6 << 30),
                  d2h_bandwidth=50e9, h2d_bandwidth=50e9)
    params.update(kw)
    return uniform_problem(devices, microbatches, **params)


def run(schedule: Schedule, **kw) -> SimResult:
    return simulate(problem(schedule.devices, schedule.microbatches, **kw), schedule)


# ----------------------------------------------------------------------------- figures
def texts_of(ax) -> list:
    return [t for t in ax.texts if t.get_text()]


@pytest.mark.parametrize("ext", [".png", ".svg", ".pdf"])
def test_gantt_writes_each_format(tmp_path: Path, ext: str) -> None:
    from optpipe.viz import plot_gantt

    path = tmp_path / f"gantt{ext}"
    plot_gantt(run(one_f_one_b(4, 8)), path)
    data = path.read_bytes()
    assert len(data) > 1000
    assert data.startswith(MAGIC[ext])


def test_comparison_writes_png_with_a_panel_per_schedule(tmp_path: Path) -> None:
    from optpipe.viz import plot_comparison

    results = [run(one_f_one_b(4, 8)), run(zb_h1(4, 8)),
               run(offloaded(4, 8), budget=float(4 << 30))]
    path = tmp_path / "compare.png"
    fig = plot_comparison(results, path)
    assert path.read_bytes().startswith(MAGIC[".png"])
    assert len(fig.axes) == 3
    titles = [" ".join(t.get_text() for t in ax.texts if not t.get_text().isdigit())
              for ax in fig.axes]
    assert "1F1B" in titles[0] and "bubble" in titles[0]
    assert "OVER budget" in titles[2]
    # one shared time axis: every panel spans the same range
    assert len({ax.get_xlim() for ax in fig.axes}) == 1


def test_comparison_of_nothing_is_a_clear_error() -> None:
    from optpipe.viz import plot_comparison

    with pytest.raises(OptPipeError, match="at least one"):
        plot_comparison([])


@pytest.mark.parametrize("name", ["gantt.jpg", "gantt", "gantt.PNG.txt"])
def test_unsupported_extension_is_refused_before_drawing(tmp_path: Path, name: str) -> None:
    from optpipe.viz import plot_comparison, plot_gantt

    result = run(one_f_one_b(2, 2))
    with pytest.raises(OptPipeError, match=r"unsupported extension.*\.png, \.svg, \.pdf"):
        plot_gantt(result, tmp_path / name)
    with pytest.raises(OptPipeError, match="unsupported extension"):
        plot_comparison([result], tmp_path / name)
    assert not (tmp_path / name).exists()


def test_uppercase_extension_is_accepted(tmp_path: Path) -> None:
    from optpipe.viz import plot_gantt

    path = tmp_path / "sub" / "GANTT.PNG"
    plot_gantt(run(one_f_one_b(2, 2)), path, memory=False)
    assert path.read_bytes().startswith(MAGIC[".png"])


def test_offload_lanes_appear_only_when_offloading() -> None:
    from optpipe.viz import plot_gantt

    plain = plot_gantt(run(one_f_one_b(4, 8)), memory=False)
    lanes = {t.get_text() for t in plain.axes[0].get_yticklabels()}
    assert lanes == {f"device {d}" for d in range(4)}

    result = run(offloaded(4, 8))
    assert any(r.lane == "d2h" for r in result.records)
    fig = plot_gantt(result, memory=False)
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert labels[:3] == ["device 0", "d2h", "h2d"]
    assert labels.count("d2h") == labels.count("h2d") == 4
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "offload (d2h)" in legend and "reload (h2d)" in legend


def test_memory_panel_and_title(tmp_path: Path) -> None:
    from optpipe.viz import plot_gantt

    result = run(one_f_one_b(4, 8))
    fig = plot_gantt(result, title="my schedule")
    assert len(fig.axes) == 2
    words = " ".join(t.get_text() for t in fig.texts)
    assert "my schedule" in words and "makespan" in words and "bubble" in words
    memory = fig.axes[1]
    assert memory.get_ylabel() == "memory (GiB)"
    assert len(memory.get_lines()) == 4 + 1            # a curve per device + one budget line
    no_budget = plot_gantt(run(one_f_one_b(4, 8), budget=float("inf")))
    assert len(no_budget.axes[1].get_lines()) == 4
    small = plot_gantt(run(one_f_one_b(4, 8), static=0, activation=1 << 20,
                           budget=float("inf")))
    assert small.axes[1].get_ylabel() == "memory (MiB)"
    assert len(plot_gantt(result, memory=False).axes) == 1


def test_over_budget_is_stated_in_the_title() -> None:
    from optpipe.viz import plot_gantt

    fig = plot_gantt(run(one_f_one_b(4, 8), budget=float(4 << 30)))
    words = " ".join(t.get_text() for t in fig.findobj(lambda a: hasattr(a, "get_text")))
    assert "OVER budget on device 0" in words


def test_chunks_are_told_apart() -> None:
    from optpipe.viz import plot_gantt

    fig = plot_gantt(run(interleaved(4, 8)), memory=False)
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "chunk 1" in legend and "chunk 2 (lighter)" in legend
    faces = {tuple(c) for c in fig.axes[0].collections[0].get_facecolors().round(3)}
    assert len(faces) == 4                             # F and BW, each in two shades


def test_microbatch_labels_never_overlap_and_stay_legible() -> None:
    from optpipe.viz import plot_gantt
    from optpipe.viz.gantt import MIN_FONT

    fig = plot_gantt(run(zb_h1(8, 32)), memory=False)
    ax = fig.axes[0]
    renderer = fig.canvas.get_renderer()
    labels = texts_of(ax)
    assert len(labels) > 8 * 32                        # most boxes are numbered
    by_row: dict[float, list] = {}
    for t in labels:
        assert t.get_fontsize() >= MIN_FONT
        by_row.setdefault(round(t.get_position()[1], 3), []).append(
            t.get_window_extent(renderer))
    for extents in by_row.values():
        extents.sort(key=lambda e: e.x0)
        for left, right in zip(extents, extents[1:]):
            assert left.x1 <= right.x0 + 0.5


def test_large_pipeline_renders(tmp_path: Path) -> None:
    from optpipe.viz import plot_gantt

    path = tmp_path / "big.png"
    fig = plot_gantt(run(one_f_one_b(16, 64)), path)
    assert path.stat().st_size > 10_000
    width, height = fig.get_size_inches()
    assert width <= 24 and height <= 12


# ------------------------------------------------------------------------ chrome trace
def test_chrome_trace_round_trips_with_one_event_per_action(tmp_path: Path) -> None:
    from optpipe.viz import chrome_trace, write_chrome_trace

    result = run(offloaded(4, 8))
    path = write_chrome_trace(result, tmp_path / "trace.json")
    data = json.loads(path.read_text())
    assert data == json.loads(json.dumps(chrome_trace(result)))
    complete = [e for e in data["traceEvents"] if e["ph"] == "X"]
    assert len(complete) == len(result.records)
    lanes = {"compute": 0, "d2h": 1, "h2d": 2}
    by_key = {(e["args"]["op"], e["args"]["stage"], e["args"]["microbatch"]): e
              for e in complete}
    for rec in result.records:
        a = rec.action
        event = by_key[(a.op.value, a.stage, a.microbatch)]
        assert event["name"] == f"{a.op.value}{a.microbatch}"
        assert event["pid"] == rec.device and event["tid"] == lanes[rec.lane]
        assert event["ts"] == pytest.approx((rec.start - result.start_time) * 1e6, abs=1e-6)
        assert event["dur"] == pytest.approx((rec.end - rec.start) * 1e6, abs=1e-6)
    threads = {(e["pid"], e["args"]["name"]) for e in data["traceEvents"]
               if e["ph"] == "M" and e["name"] == "thread_name"}
    assert (0, "d2h") in threads and (0, "h2d") in threads
    counters = [e for e in data["traceEvents"] if e["ph"] == "C"]
    assert len(counters) == sum(len(c) for c in result.memory_timeline)
    peak0 = max(e["args"]["allocated"] for e in counters if e["pid"] == 0)
    assert peak0 == pytest.approx(result.peak_memory[0] / 2**20)
    assert data["otherData"]["makespan_s"] == result.makespan


def test_chrome_trace_without_offload_has_only_compute_threads() -> None:
    from optpipe.viz import chrome_trace

    data = chrome_trace(run(interleaved(4, 8)))
    names = {e["args"]["name"] for e in data["traceEvents"]
             if e["ph"] == "M" and e["name"] == "thread_name"}
    assert names == {"compute"}
    assert all("chunk" in e["args"] for e in data["traceEvents"] if e["ph"] == "X")


def test_chrome_trace_needs_a_json_name(tmp_path: Path) -> None:
    from optpipe.viz import write_chrome_trace

    with pytest.raises(OptPipeError, match=r"\.json"):
        write_chrome_trace(run(one_f_one_b(2, 2)), tmp_path / "trace.png")


def test_hand_built_schedules_are_valid() -> None:
    for sched in (one_f_one_b(4, 8), zb_h1(4, 8), offloaded(4, 8), interleaved(4, 8)):
        result = run(sched)
        assert result.makespan > 0
