"""The Problem: everything a pipeline schedule must respect, and nothing about solvers.

A :class:`Problem` describes one training step of a pipeline-parallel job: ``stages``
model stages (one per device in the base problem), ``microbatches`` microbatches, the
per-stage times of forward (F), backward-for-input (B) and backward-for-weights (W)
(optionally a measured time of the fused backward BW, else B + W), the point-to-point
latency between neighbouring devices, the activation bytes F keeps per microbatch and
how B and W release them, static bytes and a budget per device, and the host-link
bandwidths used by activation offload.

Schedules that split each device's share of the model into ``v`` chunks (interleaved
1F1B, ZB-V) are judged against a chunked problem: ``stages`` = v x ``devices`` and the
stage -> device ``placement`` in ``meta``. :meth:`Problem.split` makes one from a base
problem by dividing every per-stage cost evenly among the chunks (the device count,
static memory and budgets stay); the runtime's profiler can also measure each chunk
(:func:`optpipe.runtime.profile.profile_model` with a placement).

Problems load from TOML or JSON files (:func:`load_problem`) or come from the cost model
(:mod:`optpipe.costmodel`); both are equally first-class.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Sequence

from optpipe.errors import OptPipeError
from optpipe.units import parse_bandwidth, parse_bytes, parse_seconds

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


#: Per-stage figures, in seconds and in bytes, that a Problem and a ChunkProfile share.
STAGE_TIMES = ("forward", "backward_input", "backward_weight")
STAGE_BYTES = ("activation", "freed_by_b", "freed_by_w")


def _numbers(value: Any, kind: type, message: str) -> tuple:
    """``value`` as a tuple of ``kind``, or :class:`OptPipeError` with ``message``
    (a string is not a list, though Python would iterate its characters)."""
    try:
        if isinstance(value, (str, bytes)):
            raise TypeError
        return tuple(kind(x) for x in value)
    except (TypeError, ValueError):
        raise OptPipeError(message) from None


def _coerce_figures(obj: Any) -> None:
    """Store the per-stage figures (and ``static``) as tuples of floats and ints, and
    ``backward_fused`` as floats or None: the one normal form both dataclasses keep."""
    for keys, kind, unit in ((STAGE_TIMES, float, "seconds"),
                             (STAGE_BYTES + ("static",), int, "bytes")):
        for key in keys:
            value = getattr(obj, key)
            object.__setattr__(obj, key, _numbers(
                value, kind, f"'{key}' must list numbers ({unit}), got {value!r}"))
    if obj.backward_fused is not None:
        object.__setattr__(obj, "backward_fused", _numbers(
            obj.backward_fused, float, f"'backward_fused' must list one time in seconds "
                                       f"per stage, got {obj.backward_fused!r}"))


def _check_figures(obj: Any, stages: int, devices: int, prefix: str = "",
                   stage_count: str = "there are {n} stages") -> None:
    """Reject per-stage figures of the wrong length, negative ones, releases that do
    not add up to the activation and a fused backward that is not a positive time;
    every message starts with ``prefix`` (which chunk profile, for those)."""
    counted = stage_count.format(n=stages)
    for key in STAGE_TIMES + STAGE_BYTES:
        values = getattr(obj, key)
        if len(values) != stages:
            raise OptPipeError(f"{prefix}'{key}' has {len(values)} entries but {counted}")
        if any(v < 0 for v in values):
            raise OptPipeError(f"{prefix}'{key}' must not be negative: {list(values)}")
    if len(obj.static) != devices:
        raise OptPipeError(f"{prefix}'static' has {len(obj.static)} entries but there "
                           f"are {devices} devices")
    for s in range(stages):
        if obj.freed_by_b[s] + obj.freed_by_w[s] != obj.activation[s]:
            raise OptPipeError(
                f"{prefix}stage {s}: freed_by_backward_input + freed_by_backward_weight "
                f"({obj.freed_by_b[s]} + {obj.freed_by_w[s]}) must equal activation "
                f"({obj.activation[s]}); omit freed_by_backward_weight to derive it")
    if obj.backward_fused is not None:
        if len(obj.backward_fused) != stages:
            raise OptPipeError(f"{prefix}'backward_fused' has {len(obj.backward_fused)} "
                               f"entries but {counted}")
        if not all(v > 0 and math.isfinite(v) for v in obj.backward_fused):
            raise OptPipeError(f"{prefix}'backward_fused' must be positive and finite: "
                               f"{list(obj.backward_fused)}; omit it to time a fused "
                               f"backward as backward_input + backward_weight")


def _file_keys(data: dict[str, Any]) -> dict[str, Any]:
    """``asdict`` data with the file schema's names for the releases, lists for tuples,
    and the optional fields left out when unset (so hashes of older problems stay)."""
    data["freed_by_backward_input"] = data.pop("freed_by_b")
    data["freed_by_backward_weight"] = data.pop("freed_by_w")
    for key in ("backward_fused", "partition"):
        if key in data and data[key] is None:
            del data[key]
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in data.items()}


@dataclass(frozen=True)
class ChunkProfile:
    """Measured figures of the model cut for one chunked placement (V shape, interleaved).

    Why: :meth:`Problem.split` shares each device's figures evenly among its chunks,
    which is only right when every device holds equal, uniform layers. A real model is
    not uniform, and a chunked placement regroups it: the V shape puts the output head
    on device 0, next to the embedding. An even split of the one-stage-per-device profile
    then misjudges both time and memory. A schedule solved on it went over its budget on
    a GPU (docs/gpu.md). ``optpipe profile`` measures every chunk of the placements the
    optimizer searches, and :meth:`Problem.split` uses these figures for that placement.

    Per-stage lists have ``len(placement)`` entries, in model order; ``static`` has one
    per device (the parameters a device holds depend on its chunks).
    """

    placement: tuple[int, ...]
    forward: tuple[float, ...]
    backward_input: tuple[float, ...]
    backward_weight: tuple[float, ...]
    activation: tuple[int, ...]
    freed_by_b: tuple[int, ...]
    freed_by_w: tuple[int, ...]
    static: tuple[int, ...]
    backward_fused: tuple[float, ...] | None = None
    partition: tuple[int, ...] | None = None   # blocks per stage of the measured cut

    def __post_init__(self) -> None:
        object.__setattr__(self, "placement", tuple(int(d) for d in self.placement))
        if self.partition is not None:
            object.__setattr__(self, "partition", tuple(int(b) for b in self.partition))
        _coerce_figures(self)

    @classmethod
    def from_problem(cls, chunked: "Problem") -> "ChunkProfile":
        """The figures of a chunked problem (``meta["placement"]``, as
        :func:`~optpipe.runtime.profile.profile_model` builds one per cut)."""
        partition = chunked.meta.get("partition")
        return cls(placement=tuple(chunked.meta["placement"]), **_figures(chunked),
                   partition=None if partition is None else tuple(partition))

    def figures(self) -> dict[str, Any]:
        """The fields a chunked :class:`Problem` takes from this profile."""
        return _figures(self)

    def to_dict(self) -> dict[str, Any]:
        return _file_keys(asdict(self))


def _figures(obj: Any) -> dict[str, Any]:
    return {key: getattr(obj, key)
            for key in STAGE_TIMES + STAGE_BYTES + ("static", "backward_fused")}


@dataclass(frozen=True)
class Problem:
    """A pipeline-parallel step to schedule. Times in seconds, sizes in bytes.

    Per-stage lists have one entry per stage; per-device lists one per device. The
    activation that F keeps for a microbatch is released in two parts: ``freed_by_b`` at
    the end of B and ``freed_by_w`` at the end of W (both at once by a fused BW), so
    ``freed_by_b + freed_by_w == activation`` on every stage.

    ``backward_fused`` optionally gives, per stage, the measured seconds of a fused
    backward (BW: input and weight gradients in one pass), which real runtimes do faster
    than B and W apart; ``None`` times BW as B + W. :meth:`bw_time` is the one place
    that decides.

    ``chunk_profiles`` optionally holds measured figures for chunked placements
    (:class:`ChunkProfile`); :meth:`split` prefers them to an even split.
    """

    stages: int
    microbatches: int
    forward: tuple[float, ...]
    backward_input: tuple[float, ...]
    backward_weight: tuple[float, ...]
    activation: tuple[int, ...]
    freed_by_b: tuple[int, ...]
    freed_by_w: tuple[int, ...]
    static: tuple[int, ...]
    budget: tuple[float, ...]
    p2p: float = 0.0
    d2h_bandwidth: float = 25e9
    h2d_bandwidth: float = 25e9
    devices: int = 0
    name: str = "problem"
    meta: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    backward_fused: tuple[float, ...] | None = None
    chunk_profiles: tuple[ChunkProfile, ...] = ()

    def __post_init__(self) -> None:
        if self.devices == 0:
            object.__setattr__(self, "devices", self.stages)
        _coerce_figures(self)
        object.__setattr__(self, "budget", tuple(float(x) for x in self.budget))
        profiles = tuple(c if isinstance(c, ChunkProfile) else _chunk_profile(c)
                         for c in self.chunk_profiles)
        object.__setattr__(self, "chunk_profiles", profiles)
        self.validate()

    # ------------------------------------------------------------------ checks
    def validate(self) -> None:
        """Reject impossible problems with one line that names the field."""
        if self.stages < 1:
            raise OptPipeError(f"stages must be at least 1, got {self.stages}")
        if self.microbatches < 1:
            raise OptPipeError(f"microbatches must be at least 1, got {self.microbatches}")
        if self.devices < 1 or self.stages % self.devices:
            raise OptPipeError(
                f"{self.stages} stages cannot be spread evenly over {self.devices} devices")
        if len(self.budget) != self.devices:
            raise OptPipeError(f"'budget' has {len(self.budget)} entries but there are "
                               f"{self.devices} devices")
        _check_figures(self, self.stages, self.devices)
        self._validate_chunk_profiles()
        if self.p2p < 0:
            raise OptPipeError(f"p2p latency must not be negative, got {self.p2p}")
        if self.d2h_bandwidth <= 0 or self.h2d_bandwidth <= 0:
            raise OptPipeError("host-link bandwidths must be positive")

    def _validate_chunk_profiles(self) -> None:
        from optpipe.schedule import check_placement

        seen = set()
        for c in self.chunk_profiles:
            where = f"chunk profile of placement {list(c.placement)}"
            if self.chunks != 1:
                raise OptPipeError(f"{where}: only a base problem (one stage per device) "
                                   f"carries chunk profiles")
            placement = check_placement(list(c.placement), self.devices)
            if len(placement) == self.devices or tuple(placement) in seen:
                raise OptPipeError(f"{where}: give each chunked placement (more stages "
                                   f"than devices) once")
            seen.add(tuple(placement))
            _check_figures(c, len(placement), self.devices, prefix=f"{where}: ",
                           stage_count="the placement has {n} stages")

    def chunk_profile(self, placement: Sequence[int]) -> ChunkProfile | None:
        """The measured figures for ``placement``, or None (then :meth:`split` divides
        evenly)."""
        key = tuple(int(d) for d in placement)
        return next((c for c in self.chunk_profiles if c.placement == key), None)

    # ------------------------------------------------------------- derived data
    @property
    def chunks(self) -> int:
        """Stages per device (1 for the base problem, v after :meth:`split`)."""
        return self.stages // self.devices

    def bw_time(self, stage: int) -> float:
        """Seconds of a fused backward (BW) of ``stage``: the measured ``backward_fused``
        when the problem has it, else ``backward_input + backward_weight``."""
        if self.backward_fused is not None:
            return self.backward_fused[stage]
        return self.backward_input[stage] + self.backward_weight[stage]

    def offload_time(self, stage: int, fraction: float = 1.0) -> float:
        """Seconds to move ``fraction`` of one microbatch's activation of ``stage`` to host."""
        return self.activation[stage] * fraction / self.d2h_bandwidth

    def reload_time(self, stage: int, fraction: float = 1.0) -> float:
        """Seconds to bring ``fraction`` of one microbatch's activation of ``stage`` back."""
        return self.activation[stage] * fraction / self.h2d_bandwidth

    def split(self, placement: Sequence[int]) -> "Problem":
        """The same job with each device's share cut into equal chunks, one per stage.

        ``placement[s]`` is the device of model stage ``s`` (so ``len(placement)`` stages
        in model order); every device must hold the same number ``v`` of stages. Stage
        ``s`` gets ``1/v`` of device ``placement[s]``'s base-stage times and bytes (bytes
        rounded so that the parts of every chunk still add up). Interleaved 1F1B and ZB-V
        are judged against this problem; device count, static bytes and budgets stay.
        When the problem has a measured :class:`ChunkProfile` for ``placement``, its
        figures (static bytes included) are used instead, and ``meta["per_chunk"]`` says so.
        """
        if self.chunks != 1:
            raise OptPipeError("only a base problem (one stage per device) can be split")
        from optpipe.schedule import check_placement
        placement = check_placement(placement, self.devices)
        chunks = len(placement) // self.devices
        if chunks == 1 and placement == list(range(self.devices)):
            return self
        measured = self.chunk_profile(placement)
        if measured is not None:
            return replace(
                self, stages=len(placement), **measured.figures(), chunk_profiles=(),
                meta={**self.meta, "placement": placement, "per_chunk": True,
                      "partition": (None if measured.partition is None
                                    else list(measured.partition))})
        # chunk j of a device gets an equal share, the first (bytes mod v) chunks one byte
        # more, so that every device's chunks add up to its base stage exactly
        chunk_index = [placement[:s].count(d) for s, d in enumerate(placement)]

        def share(values: Sequence[int]) -> list[int]:
            return [values[d] // chunks + (1 if j < values[d] % chunks else 0)
                    for d, j in zip(placement, chunk_index)]

        activation = share(self.activation)
        freed_b = share(self.freed_by_b)
        freed_w = share(self.freed_by_w)
        if any(b + w != a for a, b, w in zip(activation, freed_b, freed_w)):
            freed_w = [a - b for a, b in zip(activation, freed_b)]
        return replace(
            self,
            stages=len(placement),
            forward=tuple(self.forward[d] / chunks for d in placement),
            backward_input=tuple(self.backward_input[d] / chunks for d in placement),
            backward_weight=tuple(self.backward_weight[d] / chunks for d in placement),
            backward_fused=(None if self.backward_fused is None else
                            tuple(self.backward_fused[d] / chunks for d in placement)),
            activation=tuple(activation),
            freed_by_b=tuple(freed_b),
            freed_by_w=tuple(freed_w),
            chunk_profiles=(),
            meta={**self.meta, "placement": placement},
        )

    def with_budget(self, budget: float | Sequence[float]) -> "Problem":
        """A copy with a new budget (one number for all devices or one per device)."""
        values = [budget] * self.devices if isinstance(budget, (int, float)) else list(budget)
        return replace(self, budget=tuple(float(v) for v in values))

    def activation_budget(self, microbatches_worth: float) -> "Problem":
        """A copy whose budget is static + ``k`` microbatches' worth of kept activations.

        This is how benchmarks state budgets ("budget S/2", "budget 2S"): the device
        holding the largest stage activation sets the unit.
        """
        if self.chunks != 1:
            raise OptPipeError("budgets in microbatches are defined on the base problem")
        return self.with_budget([self.static[d] + microbatches_worth * self.activation[d]
                                 for d in range(self.devices)])

    # ------------------------------------------------------------------ identity
    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data (seconds and bytes) that :func:`problem_from_dict` reads."""
        data = asdict(self)
        del data["chunk_profiles"]           # only when there are some, like backward_fused
        if self.chunk_profiles:
            data["chunk_profiles"] = [c.to_dict() for c in self.chunk_profiles]
        return _file_keys(data)

    def to_record(self) -> dict[str, Any]:
        """:meth:`to_dict` as strict JSON (no ``Infinity``: an unlimited budget is left
        out, which :func:`problem_from_dict` reads back as unlimited). Why: a solved
        schedule's file carries the problem it was solved for under
        ``provenance["problem"]``, so ``optpipe gantt FILE`` needs no options."""
        data = self.to_dict()
        if all(math.isinf(b) for b in self.budget):
            del data["budget"]
        return data

    def hash(self) -> str:
        """Stable content hash (name and metadata excluded): the cache key of a solve.

        ``backward_fused`` and ``chunk_profiles`` enter only when set, so problems without
        them keep the hashes they had before the fields existed (the bundled schedule
        library is keyed by them).
        """
        data = self.to_dict()
        data.pop("name", None)
        data.pop("meta", None)
        text = json.dumps(data, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]


# ---------------------------------------------------------------------- loading
def _chunk_profile(data: Any) -> ChunkProfile:
    """A :class:`ChunkProfile` from ``ChunkProfile.to_dict`` data or a ``[[chunked]]``
    table of a problem file (times with units, bytes with units)."""
    if not isinstance(data, dict):
        raise OptPipeError(f"a chunk profile must be a table, got {data!r}")
    known = {"placement", "forward", "backward_input", "backward_weight", "backward_fused",
             "activation", "freed_by_backward_input", "freed_by_backward_weight", "static",
             "partition"}
    unknown = set(data) - known
    if unknown:
        raise OptPipeError(f"unknown key(s) {sorted(unknown)} in a chunk profile; known: "
                           f"{sorted(known)}")
    missing = [k for k in ("placement", "forward", "backward_input", "activation", "static")
               if k not in data]
    if missing:
        raise OptPipeError(f"a chunk profile needs {', '.join(missing)}")
    placement = data["placement"]
    if not isinstance(placement, list) or not all(isinstance(d, int) for d in placement):
        raise OptPipeError(f"a chunk profile's placement must list one device per stage, "
                           f"got {placement!r}")
    n = len(placement)

    def stage_list(key: str, parse: Any, default: Any = None) -> list:
        value = data.get(key, default)
        if not isinstance(value, list) or len(value) != n:
            raise OptPipeError(f"chunk profile of placement {placement}: '{key}' must list "
                               f"{n} values")
        return [parse(v, key) for v in value]

    def seconds(v: Any, key: str) -> float:
        return float(v) if isinstance(v, (int, float)) else parse_seconds(v, key)

    def count(v: Any, key: str) -> int:
        return int(v) if isinstance(v, (int, float)) else parse_bytes(v, key)

    activation = stage_list("activation", count)
    freed_b = stage_list("freed_by_backward_input", count, [0] * n)
    freed_w = (stage_list("freed_by_backward_weight", count)
               if "freed_by_backward_weight" in data
               else [a - b for a, b in zip(activation, freed_b)])
    static = data["static"]
    if not isinstance(static, list):
        raise OptPipeError(f"chunk profile of placement {placement}: 'static' must list "
                           f"one value per device")
    return ChunkProfile(
        placement=tuple(placement), forward=tuple(stage_list("forward", seconds)),
        backward_input=tuple(stage_list("backward_input", seconds)),
        backward_weight=tuple(stage_list("backward_weight", seconds, [0] * n)),
        backward_fused=(tuple(stage_list("backward_fused", seconds))
                        if "backward_fused" in data else None),
        activation=tuple(activation), freed_by_b=tuple(freed_b), freed_by_w=tuple(freed_w),
        static=tuple(count(v, "static") for v in static),
        partition=_partition_of(data.get("partition"), n))


def _partition_of(value: Any, stages: int) -> tuple[int, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or len(value) != stages or not all(
            isinstance(b, int) and b >= 1 for b in value):
        raise OptPipeError(f"a chunk profile's partition must list {stages} block counts "
                           f"of at least 1, got {value!r}")
    return tuple(value)


def _per_stage(value: Any, count: int, parse: Any, key: str) -> list:
    if isinstance(value, list):
        if len(value) != count:
            raise OptPipeError(f"'{key}' lists {len(value)} values but there are {count} "
                               f"stages; give one value or exactly {count}")
        return [parse(v, key) for v in value]
    return [parse(value, key)] * count


def problem_from_dict(data: dict[str, Any], name: str = "problem") -> Problem:
    """Build a :class:`Problem` from the file schema (see the README) or from ``to_dict``.

    Accepts both the nested human schema (``[time]``, ``[memory]``, ``[offload]`` tables
    with units) and the flat form written by :meth:`Problem.to_dict`.
    """
    if "time" not in data and "forward" in data:  # flat form from to_dict / to_record
        flat = dict(data)
        try:
            flat["freed_by_b"] = flat.pop("freed_by_backward_input")
            flat["freed_by_w"] = flat.pop("freed_by_backward_weight")
            flat.setdefault("name", name)
            if flat.get("budget") is None:            # to_record leaves out "unlimited"
                flat["budget"] = (float("inf"),) * int(flat.get("devices", flat["stages"]))
            flat["chunk_profiles"] = tuple(_chunk_profile(c) for c in
                                           _tables(flat.get("chunk_profiles", [])))
            return Problem(**flat)
        except KeyError as exc:
            raise OptPipeError(f"problem data is not valid: it has no {exc}") from None
        except (TypeError, ValueError) as exc:
            raise OptPipeError(f"problem data is not valid: {exc}") from None
    known = {"stages", "microbatches", "devices", "name", "time", "memory", "offload",
             "chunked"}
    unknown = set(data) - known
    if unknown:
        raise OptPipeError(f"unknown problem key(s) {sorted(unknown)}; known keys: "
                           f"{sorted(known)}")
    for key in ("stages", "microbatches"):
        if not isinstance(data.get(key), int) or isinstance(data.get(key), bool):
            raise OptPipeError(f"the problem needs an integer '{key}', e.g. {key} = 8")
    stages, microbatches = data["stages"], data["microbatches"]
    devices = int(data.get("devices", stages))
    time = data.get("time", {})
    memory = data.get("memory", {})
    offload = data.get("offload", {})
    for table, keys in (("time", {"forward", "backward_input", "backward_weight",
                                  "backward_fused", "p2p"}),
                        ("memory", {"activation", "freed_by_backward_input",
                                    "freed_by_backward_weight", "static", "budget"}),
                        ("offload", {"d2h_bandwidth", "h2d_bandwidth"})):
        extra = set(locals()[table]) - keys
        if extra:
            raise OptPipeError(f"unknown key(s) {sorted(extra)} in [{table}]; known: "
                               f"{sorted(keys)}")
    for key in ("forward", "backward_input"):
        if key not in time:
            raise OptPipeError(f"the problem needs [time] {key}, e.g. {key} = \"18.5ms\"")
    if "activation" not in memory:
        raise OptPipeError("the problem needs [memory] activation, e.g. activation = \"10MiB\"")
    forward = _per_stage(time["forward"], stages, parse_seconds, "forward")
    backward_input = _per_stage(time["backward_input"], stages, parse_seconds, "backward_input")
    backward_weight = _per_stage(time.get("backward_weight", 0), stages, parse_seconds,
                                 "backward_weight")
    backward_fused = (None if "backward_fused" not in time else
                      _per_stage(time["backward_fused"], stages, parse_seconds,
                                 "backward_fused"))
    activation = _per_stage(memory["activation"], stages, parse_bytes, "activation")
    freed_b = _per_stage(memory.get("freed_by_backward_input", 0), stages, parse_bytes,
                         "freed_by_backward_input")
    if "freed_by_backward_weight" in memory:
        freed_w = _per_stage(memory["freed_by_backward_weight"], stages, parse_bytes,
                             "freed_by_backward_weight")
    else:
        freed_w = [a - b for a, b in zip(activation, freed_b)]
    static = _per_stage(memory.get("static", 0), devices, parse_bytes, "static")
    budget_raw = memory.get("budget", "inf")
    if budget_raw in ("inf", "none", None):
        budget = [float("inf")] * devices
    else:
        budget = [float(b) for b in _per_stage(budget_raw, devices, parse_bytes, "budget")]
    return Problem(
        stages=stages, microbatches=microbatches, devices=devices,
        forward=tuple(forward), backward_input=tuple(backward_input),
        backward_weight=tuple(backward_weight),
        backward_fused=None if backward_fused is None else tuple(backward_fused),
        activation=tuple(activation), freed_by_b=tuple(freed_b), freed_by_w=tuple(freed_w),
        static=tuple(static),
        budget=tuple(budget), p2p=parse_seconds(time.get("p2p", 0), "p2p"),
        d2h_bandwidth=parse_bandwidth(offload.get("d2h_bandwidth", "25GB/s"), "d2h_bandwidth"),
        h2d_bandwidth=parse_bandwidth(offload.get("h2d_bandwidth", "25GB/s"), "h2d_bandwidth"),
        name=str(data.get("name", name)),
        chunk_profiles=tuple(_chunk_profile(c) for c in _tables(data.get("chunked", []))),
    )


def _tables(value: Any) -> list:
    if isinstance(value, dict):
        return [value]
    if not isinstance(value, list):
        raise OptPipeError("'chunked' must be a list of tables ([[chunked]] in TOML)")
    return value


def load_problem(path: str | Path) -> Problem:
    """Read a problem file (``.toml`` or ``.json``); errors name the file and the key."""
    path = Path(path)
    if not path.is_file():
        raise OptPipeError(f"problem file {str(path)!r} does not exist")
    try:
        if path.suffix.lower() == ".json":
            data = json.loads(path.read_text())
        else:
            data = tomllib.loads(path.read_text())
    except (json.JSONDecodeError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise OptPipeError(f"problem file {str(path)!r} is not valid "
                           f"{'JSON' if path.suffix.lower() == '.json' else 'TOML'}: {exc}") from None
    if not isinstance(data, dict):
        raise OptPipeError(f"problem file {str(path)!r} must hold a table/object at top level")
    try:
        return problem_from_dict(data, name=path.stem)
    except OptPipeError as exc:
        raise OptPipeError(f"{path}: {exc}") from None


def problem_to_toml(problem: Problem) -> str:
    """Write a problem in the human file schema (exact values, per-stage lists)."""
    def seconds(values: Sequence[float]) -> str:
        return "[" + ", ".join(f'"{v * 1e3:.6g}ms"' for v in values) + "]"

    def ints(values: Sequence[float]) -> str:
        return "[" + ", ".join(str(int(v)) if v != float("inf") else '"inf"'
                               for v in values) + "]"

    budget = ('"inf"' if all(b == float("inf") for b in problem.budget)
              else ints(problem.budget))
    fused = ([] if problem.backward_fused is None
             else [f"backward_fused = {seconds(problem.backward_fused)}"])
    return "\n".join([
        f'name = "{problem.name}"',
        f"stages = {problem.stages}",
        f"microbatches = {problem.microbatches}",
        f"devices = {problem.devices}",
        "",
        "[time]",
        f"forward = {seconds(problem.forward)}",
        f"backward_input = {seconds(problem.backward_input)}",
        f"backward_weight = {seconds(problem.backward_weight)}",
        *fused,
        f'p2p = "{problem.p2p * 1e3:.6g}ms"',
        "",
        "[memory]",
        f"activation = {ints(problem.activation)}",
        f"freed_by_backward_input = {ints(problem.freed_by_b)}",
        f"freed_by_backward_weight = {ints(problem.freed_by_w)}",
        f"static = {ints(problem.static)}",
        f"budget = {budget}",
        "",
        "[offload]",
        f"d2h_bandwidth = {problem.d2h_bandwidth:.6g}",
        f"h2d_bandwidth = {problem.h2d_bandwidth:.6g}",
        "",
        *[line for c in problem.chunk_profiles for line in (
            "[[chunked]]   # every chunk of this placement measured (optpipe profile)",
            f"placement = [{', '.join(str(d) for d in c.placement)}]",
            f"forward = {seconds(c.forward)}",
            f"backward_input = {seconds(c.backward_input)}",
            f"backward_weight = {seconds(c.backward_weight)}",
            *([] if c.backward_fused is None
              else [f"backward_fused = {seconds(c.backward_fused)}"]),
            f"activation = {ints(c.activation)}",
            f"freed_by_backward_input = {ints(c.freed_by_b)}",
            f"freed_by_backward_weight = {ints(c.freed_by_w)}",
            f"static = {ints(c.static)}",
            *([] if c.partition is None
              else [f"partition = [{', '.join(str(b) for b in c.partition)}]"]),
            "")],
    ])


def uniform_problem(stages: int, microbatches: int, forward: float = 1.0,
                    backward_input: float = 1.0, backward_weight: float = 1.0,
                    p2p: float = 0.0, activation: int = 1000, freed_by_b: int | None = None,
                    static: int = 0, budget: float = float("inf"),
                    d2h_bandwidth: float = 25e9, h2d_bandwidth: float = 25e9,
                    name: str = "uniform", backward_fused: float | None = None) -> Problem:
    """A problem whose stages are all alike: the workhorse of tests and benchmarks.

    ``backward_fused`` (seconds of a fused BW; None: B + W) is the same on every stage.
    """
    freed_b = activation // 2 if freed_by_b is None else freed_by_b
    return Problem(
        stages=stages, microbatches=microbatches,
        forward=(forward,) * stages, backward_input=(backward_input,) * stages,
        backward_weight=(backward_weight,) * stages, activation=(activation,) * stages,
        freed_by_b=(freed_b,) * stages, freed_by_w=(activation - freed_b,) * stages,
        static=(static,) * stages, budget=(budget,) * stages, p2p=p2p,
        d2h_bandwidth=d2h_bandwidth, h2d_bandwidth=h2d_bandwidth, name=name,
        backward_fused=None if backward_fused is None else (backward_fused,) * stages)
