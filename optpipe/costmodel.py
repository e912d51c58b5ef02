"""The analytical cost model: model preset + hardware preset + parallel config -> Problem.

Why it exists: schedules are only as good as the per-stage times and bytes they are
judged against, and before anything has been profiled those numbers must come from
somewhere that can be checked by hand. Every figure here is a published formula, cited
in ``docs/costmodel.md``:

* FLOPs of F, B (input gradient) and W (weight gradient) per transformer layer: the
  matmul count of Narayanan et al. 2021 (Megatron-LM), split as in Qi et al. 2023
  (zero bubble, Table 1): ``F = M + A``, ``B = M + 2A``, ``W = M`` where ``M`` is the
  FLOPs of the weight matmuls and ``A`` of the two attention-score matmuls, which have
  no weights, so their whole backward belongs to B.
* Activation bytes per layer per microbatch: Korthikanti et al. 2022 (``34sbh +
  5as²b`` for GPT), term by term so that GQA, SwiGLU, no-dropout and flash attention
  change exactly the terms they touch; divided by ``tp`` (tensor + sequence parallel).
* What W still needs after B: the inputs of the weight matmuls plus the gradients of
  their outputs (``32sbh`` for GPT, the zero-bubble paper's Table 1).
* Static bytes: mixed-precision Adam, 2 + 2 + 12 bytes per parameter (ZeRO paper),
  optimizer part divided by ``dp`` when sharded (ZeRO-1), plus a workspace allowance.

A profiled :class:`~optpipe.problem.Problem` is equally first-class; this module is
only one way to make one.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any, Sequence

from optpipe.errors import OptPipeError
from optpipe.presets import (HardwarePreset, ModelPreset, list_hardware, list_models,
                             load_hardware_preset, load_model_preset)
from optpipe.problem import ChunkProfile, Problem
from optpipe.units import parse_bytes

__all__ = [
    "DEFAULT_MODEL", "DEFAULT_HARDWARE", "DEFAULT_STAGES", "DEFAULT_MICROBATCHES",
    "DEFAULT_SEQ_LEN", "DEFAULT_MICRO_BATCH_SIZE", "DEFAULT_EFFICIENCY",
    "DEFAULT_WORKSPACE_BYTES", "ParallelConfig", "StageCost", "build_problem",
    "default_problem", "stage_costs", "split_layers", "padded_vocab", "layer_flops",
    "layer_activation", "layer_params", "list_models", "list_hardware",
    "load_model_preset", "load_hardware_preset",
]

# ------------------------------------------------------------------- defaults
# The headline `optpipe solve --stages 8 --mem 80GB` uses these. They are chosen so
# that an 80GB budget matters on 8 stages: 1F1B fits (stage 0 keeps 8 microbatches'
# activations, 59.4 GB with static), ZB-H2 (2S-1 = 15 on stage 0: 84.5 GB; 95 GB on
# stage 1) and GPipe (all 32) do not. The arithmetic is in docs/costmodel.md.
DEFAULT_MODEL = "gpt-14.6b"
DEFAULT_HARDWARE = "h100-80gb"
DEFAULT_STAGES = 8
DEFAULT_MICROBATCHES = 32
DEFAULT_SEQ_LEN = 4096
DEFAULT_MICRO_BATCH_SIZE = 1
# Narayanan et al. 2021 report 52% of peak per GPU for their largest Megatron-LM run;
# the efficiency also absorbs what the matmul count leaves out (norms, softmax,
# element-wise ops, tensor-parallel communication).
DEFAULT_EFFICIENCY = 0.5
# An allowance, not a measurement: CUDA context, cuBLAS workspaces, NCCL and p2p
# buffers, allocator slack. Replace it with a profile when one exists.
DEFAULT_WORKSPACE_BYTES = 1 << 30

_WEIGHT_BYTES = 2      # bf16 weights
_GRAD_BYTES = 2        # bf16 gradients
_OPTIMIZER_BYTES = 12  # fp32 master weights + Adam momentum + variance


# ---------------------------------------------------------------- configuration
@dataclass(frozen=True)
class ParallelConfig:
    """How the model is run: pipeline/tensor/data degrees, batch shape and switches.

    ``tp > 1`` implies Megatron sequence parallelism, so activations and p2p messages
    are split by ``tp`` as well. ``layer_split`` overrides the default placement of
    layers on stages (see :func:`split_layers`).
    """

    stages: int
    microbatches: int
    seq_len: int
    tp: int = 1
    dp: int = 1
    micro_batch_size: int = 1
    recompute: bool = False
    sharded_optimizer: bool = False
    flash_attention: bool = True
    efficiency: float = DEFAULT_EFFICIENCY
    workspace: int = DEFAULT_WORKSPACE_BYTES
    layer_split: tuple[int, ...] | None = None

    def check(self, model: ModelPreset) -> None:
        """Reject configurations the model cannot be split into, naming the field."""
        for key in ("stages", "microbatches", "seq_len", "tp", "dp", "micro_batch_size"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise OptPipeError(f"'{key}' must be a positive integer, got {value!r}")
        if not 0.0 < self.efficiency <= 1.0:
            raise OptPipeError(f"efficiency is a fraction of peak in (0, 1], got "
                               f"{self.efficiency!r}; e.g. 0.5")
        if self.workspace < 0:
            raise OptPipeError(f"workspace must not be negative, got {self.workspace}")
        if self.layer_split is None and self.stages > model.layers:
            raise OptPipeError(f"{self.stages} stages but model {model.name!r} has only "
                               f"{model.layers} layers; use at most {model.layers} stages")
        if self.layer_split is not None:
            split = list(self.layer_split)
            if len(split) != self.stages or sum(split) != model.layers or min(split) < 0:
                raise OptPipeError(f"layer_split {split} must give {self.stages} "
                                   f"non-negative counts adding up to {model.layers}")
        for what, count in (("heads", model.heads), ("kv_heads", model.kv_heads),
                            ("ffn_hidden", model.ffn_hidden)):
            if count % self.tp:
                raise OptPipeError(f"tensor-parallel degree {self.tp} must divide "
                                   f"{what} ({count}) of model {model.name!r}")


# ---------------------------------------------------------------- layer algebra
def split_layers(layers: int, stages: int) -> list[int]:
    """Transformer layers per stage, as even as possible.

    Each stage gets ``layers // stages``; the remainder goes one each to the middle
    stages from the last middle stage backwards (``S-2, S-3, …, 1``), then to the last
    stage, then to the first. Why: the first stage already carries the embedding and,
    in 1F1B-like schedules, the most microbatches in flight (stage ``s`` keeps about
    ``S - s``); the last carries the output layer. Later middle stages keep the fewest.
    """
    if stages < 1 or layers < stages:
        raise OptPipeError(f"cannot split {layers} layers over {stages} stages")
    base, extra = divmod(layers, stages)
    counts = [base] * stages
    order = list(range(stages - 2, 0, -1)) + ([stages - 1, 0] if stages > 1 else [0])
    for s in order[:extra]:
        counts[s] += 1
    return counts


def padded_vocab(model: ModelPreset, tp: int = 1) -> int:
    """Vocabulary rounded up to a multiple of ``vocab_pad_multiple x tp`` (Megatron-LM's
    ``--make-vocab-size-divisible-by``, default 128), so it splits evenly over ``tp``."""
    multiple = model.vocab_pad_multiple * tp
    return -(-model.vocab // multiple) * multiple


def layer_flops(model: ModelPreset, seq: int, batch: int) -> tuple[int, int, int]:
    """FLOPs of F, B and W for one transformer layer and one microbatch (all TP ranks).

    Matmuls count 2 FLOPs per multiply-add (Narayanan et al. 2021). ``M`` = weight
    matmuls: QKV ``2sbh(h + 2·kv)``, output ``2sbh²``, MLP ``2sbh·f`` per projection
    (2 projections, 3 when gated); ``A`` = scores ``QKᵀ`` and ``PV``, ``2bs²h`` each.
    Returns ``(M + A, M + 2A, M)``: for GPT ``sbh(24h+4s)``, ``sbh(24h+8s)``, ``24sbh²``
    (zero-bubble paper, Table 1).
    """
    s, b, h, f = seq, batch, model.hidden, model.ffn_hidden
    projections = 3 if model.gated_mlp else 2
    matmul = 2 * s * b * h * (h + 2 * model.kv_width) + 2 * s * b * h * h \
        + 2 * s * b * h * f * projections
    attention = 4 * b * s * s * h
    return matmul + attention, matmul + 2 * attention, matmul


def head_flops(model: ModelPreset, vocab: int, seq: int, batch: int) -> tuple[int, int, int]:
    """FLOPs of F, B, W of the output layer (logits ``2sbhV`` each; softmax ignored)."""
    logits = 2 * seq * batch * model.hidden * vocab
    return logits, logits, logits


@dataclass(frozen=True)
class LayerMemory:
    """Bytes one microbatch keeps for one block, per TP rank.

    ``kept``: what F allocates and keeps for the backward. ``w_needed``: what must stay
    from the end of B to the end of W: the inputs of the weight matmuls plus the
    gradients of their outputs (B makes those; the Problem books them against F).
    """

    kept: int
    w_needed: int


def _div(total: int, tp: int) -> int:
    if total % tp:  # cannot happen after ParallelConfig.check; guards the algebra
        raise AssertionError(f"{total} bytes do not split over tp={tp}")
    return total // tp


def layer_activation(model: ModelPreset, seq: int, batch: int, tp: int = 1,
                     flash_attention: bool = True, recompute: bool = False) -> LayerMemory:
    """Activation bytes of one transformer layer for one microbatch, per TP rank.

    Korthikanti et al. 2022, Sec. 4.1, term by term (2-byte activations, 1-byte dropout
    masks): norm inputs ``2sbh`` each; QKV input ``2sbh``; Q ``2sbh``, K and V
    ``2sb·kv`` each; without flash attention the softmax output ``2as²b`` (+ mask
    ``as²b`` and dropout output ``2as²b`` with dropout); output-projection input
    ``2sbh``; MLP input ``2sbh``; MLP intermediates ``2sbf`` each (activation input and
    output; gate, up and product when gated); dropout masks ``sbh`` after attention and
    MLP. GPT: ``34sbh + 5as²b``. With tensor + sequence parallelism all of it divides by
    ``tp``. With full recomputation only the layer input ``2sbh`` is kept.
    """
    s, b, h, f, a = seq, batch, model.hidden, model.ffn_hidden, model.heads
    sbh, sbf, skv = s * b * h, s * b * f, s * b * model.kv_width
    drop = model.dropout > 0
    if recompute:
        checkpoint = _div(2 * sbh, tp)
        return LayerMemory(kept=checkpoint, w_needed=checkpoint)
    kept = 2 * sbh + 2 * sbh + 2 * sbh + 4 * skv   # norm in, QKV in, Q, K, V
    if not flash_attention:
        kept += 2 * a * s * s * b + (3 * a * s * s * b if drop else 0)
    kept += 2 * sbh + (sbh if drop else 0)          # output-proj input, dropout mask
    kept += 2 * sbh + 2 * sbh                       # norm in, MLP input
    kept += (6 if model.gated_mlp else 4) * sbf     # MLP intermediates
    kept += sbh if drop else 0                      # MLP dropout mask
    inputs = 2 * sbh + 2 * sbh + 2 * sbh + 2 * sbf  # QKV, out-proj, MLP-in, MLP-out inputs
    grads = 2 * (sbh + 2 * skv) + 2 * sbh \
        + (4 if model.gated_mlp else 2) * sbf + 2 * sbh
    return LayerMemory(kept=_div(kept, tp), w_needed=_div(inputs + grads, tp))


def embedding_activation(model: ModelPreset, seq: int, batch: int, tp: int) -> LayerMemory:
    """First stage: the embedding dropout mask ``sbh`` (Korthikanti Sec. 4.3); W (the
    embedding gradient) needs the gradient of the embedding output, ``2sbh``."""
    sbh = seq * batch * model.hidden
    return LayerMemory(kept=_div(sbh if model.dropout > 0 else 0, tp),
                       w_needed=_div(2 * sbh, tp))


def head_activation(model: ModelPreset, vocab: int, seq: int, batch: int,
                    tp: int) -> LayerMemory:
    """Last stage (Korthikanti Sec. 4.3): final-norm input ``2sbh``, output-layer input
    ``2sbh``, fp32 logits for the loss ``4sbV``. W needs the output-layer input and
    the logits' gradient ``2sbV``."""
    sbh, sbv = seq * batch * model.hidden, seq * batch * vocab
    return LayerMemory(kept=_div(4 * sbh + 4 * sbv, tp), w_needed=_div(2 * sbh + 2 * sbv, tp))


def layer_params(model: ModelPreset, tp: int = 1) -> int:
    """Parameters of one transformer layer held by one TP rank.

    Column-parallel weights and biases (QKV, MLP in) and row-parallel weights (output,
    MLP out) split by ``tp``; row-parallel biases and norm weights are replicated.
    """
    h, f, kv = model.hidden, model.ffn_hidden, model.kv_width
    ins = 2 if model.gated_mlp else 1
    split = h * (h + 2 * kv) + h * h + ins * h * f + f * h
    replicated = 2 * (2 * h if model.norm == "layernorm" else h)
    if model.bias:
        split += (h + 2 * kv) + ins * f
        replicated += 2 * h
    return _div(split, tp) + replicated


def _norm_params(model: ModelPreset) -> int:
    return 2 * model.hidden if model.norm == "layernorm" else model.hidden


def embedding_params(model: ModelPreset, vocab: int, seq: int, tp: int) -> int:
    """Word embedding (vocab-parallel) plus, for learned positions, a replicated table
    of ``max(model seq_len, run seq_len)`` rows."""
    positions = max(model.seq_len, seq) * model.hidden if model.position == "learned" else 0
    return _div(vocab * model.hidden, tp) + positions


def head_params(model: ModelPreset, vocab: int, tp: int, stages: int) -> int:
    """Final norm plus the output layer. Tied embeddings share the embedding's tensor
    when one stage holds both; with ``stages > 1`` Megatron-LM keeps a copy on the last
    stage (gradients all-reduced with the first), which costs the same as untied."""
    shared = model.tied_embeddings and stages == 1
    return _norm_params(model) + (0 if shared else _div(vocab * model.hidden, tp))


def bytes_per_param(sharded_optimizer: bool, dp: int) -> float:
    """Mixed-precision Adam: 2 (bf16 weight) + 2 (bf16 grad) + 12 (fp32 master, m, v);
    ZeRO-1 shards the 12 over ``dp`` (Rajbhandari et al. 2020)."""
    optimizer = _OPTIMIZER_BYTES / dp if sharded_optimizer else _OPTIMIZER_BYTES
    return _WEIGHT_BYTES + _GRAD_BYTES + optimizer


# ---------------------------------------------------------------- stage costs
@dataclass(frozen=True)
class StageCost:
    """Everything the cost model works out for one stage (per TP rank)."""

    layers: int
    forward_flops: int
    backward_input_flops: int
    backward_weight_flops: int
    recompute_flops: int
    forward: float
    backward_input: float
    backward_weight: float
    activation: int
    freed_by_b: int
    freed_by_w: int
    layer_activation_bytes: tuple[int, ...]
    extra_activation_bytes: int
    params: int
    static: int
    w_transient: int = 0


def stage_costs(model: ModelPreset, hardware: HardwarePreset,
                config: ParallelConfig) -> list[StageCost]:
    """Per-stage FLOPs, seconds and bytes for ``model`` on ``hardware`` under ``config``."""
    config.check(model)
    S, t, s, b = config.stages, config.tp, config.seq_len, config.micro_batch_size
    vocab = padded_vocab(model, t)
    split = list(config.layer_split) if config.layer_split else split_layers(model.layers, S)
    throughput = hardware.peak_flops * config.efficiency * t
    lf, lb, lw = layer_flops(model, s, b)
    mem = layer_activation(model, s, b, t, config.flash_attention, config.recompute)
    plain = layer_activation(model, s, b, t, config.flash_attention, recompute=False)
    per_param = bytes_per_param(config.sharded_optimizer, config.dp)
    costs = []
    for stage, n in enumerate(split):
        f, bi, w = n * lf, n * lb, n * lw
        recompute = f if config.recompute else 0
        blocks = [mem] * n
        extra = 0
        params = n * layer_params(model, t)
        if stage == 0:
            emb = embedding_activation(model, s, b, t)
            blocks.append(emb)
            extra += emb.kept
            params += embedding_params(model, vocab, s, t)
        if stage == S - 1:
            hf, hb, hw = head_flops(model, vocab, s, b)
            f, bi, w = f + hf, bi + hb, w + hw
            head = head_activation(model, vocab, s, b, t)
            blocks.append(head)
            extra += head.kept
            params += head_params(model, vocab, t, S)
        activation = sum(x.kept for x in blocks)
        held = min(activation, sum(x.w_needed for x in blocks))
        costs.append(StageCost(
            layers=n,
            forward_flops=_div(f, t), backward_input_flops=_div(bi, t),
            backward_weight_flops=_div(w, t), recompute_flops=_div(recompute, t),
            forward=f / throughput, backward_input=(bi + recompute) / throughput,
            backward_weight=w / throughput,
            activation=activation, freed_by_b=activation - held, freed_by_w=held,
            layer_activation_bytes=(mem.kept,) * n, extra_activation_bytes=extra,
            params=params,
            static=int(round(params * per_param)) + config.workspace,
            w_transient=n * plain.w_needed if config.recompute else 0,
        ))
    return costs


# ---------------------------------------------------------------- the Problem
def _budget(budget: float | int | str | Sequence[float | str] | None,
            hardware: HardwarePreset, devices: int) -> tuple[float, ...]:
    """Budget per device: the device memory, one value for all, or one per device."""
    if budget is None:
        return (float(hardware.memory),) * devices

    def one(value: float | int | str) -> float:
        if isinstance(value, bool):
            raise OptPipeError(f"cannot read budget {value!r}; write it like '80GB'")
        number = float(parse_bytes(value, "budget")) if isinstance(value, str) \
            else float(value)
        if not number > 0:
            raise OptPipeError(f"budget must be positive, got {value!r}; e.g. '80GB'")
        return number

    if isinstance(budget, (str, int, float)):
        return (one(budget),) * devices
    values = [one(v) for v in budget]
    if len(values) != devices:
        raise OptPipeError(f"budget lists {len(values)} values for {devices} devices")
    return tuple(values)


def build_problem(model: str, hardware: str, stages: int, microbatches: int, *,
                  tp: int = 1, dp: int = 1, micro_batch_size: int = 1,
                  seq_len: int | None = None, recompute: bool = False,
                  sharded_optimizer: bool = False, flash_attention: bool = True,
                  efficiency: float | None = None,
                  budget: float | int | str | Sequence[float] | None = None,
                  workspace: int | str | None = None,
                  layer_split: Sequence[int] | None = None) -> Problem:
    """The :class:`Problem` of training ``model`` on ``stages`` pipeline stages of
    ``hardware``, one stage per device.

    ``model`` and ``hardware`` are preset names or paths to TOML files; ``seq_len``
    defaults to the model's, ``efficiency`` to :data:`DEFAULT_EFFICIENCY`, ``budget``
    to the device memory (bytes, or a string like ``"80GB"``), ``workspace`` to
    :data:`DEFAULT_WORKSPACE_BYTES`. ``meta`` carries the inputs and the per-stage
    breakdown: ``layers_per_stage``, ``layer_activation_bytes`` (one list per stage, one
    entry per transformer layer; with ``extra_activation_bytes`` for the embedding /
    output layer they add up to ``activation``), ``params_per_stage``, ``flops``.
    """
    m = load_model_preset(model)
    hw = load_hardware_preset(hardware)
    work = DEFAULT_WORKSPACE_BYTES if workspace is None else parse_bytes(workspace,
                                                                         "workspace")
    config = ParallelConfig(
        stages=stages, microbatches=microbatches,
        seq_len=m.seq_len if seq_len is None else seq_len, tp=tp, dp=dp,
        micro_batch_size=micro_batch_size, recompute=recompute,
        sharded_optimizer=sharded_optimizer, flash_attention=flash_attention,
        efficiency=DEFAULT_EFFICIENCY if efficiency is None else float(efficiency),
        workspace=work, layer_split=tuple(layer_split) if layer_split else None)
    costs = stage_costs(m, hw, config)
    message = _div(2 * config.seq_len * config.micro_batch_size * m.hidden, config.tp)
    meta: dict[str, Any] = {
        "source": "costmodel",
        "model": m.name,
        "hardware": hw.name,
        "config": {**asdict(config), "layer_split": [c.layers for c in costs]},
        "vocab_padded": padded_vocab(m, config.tp),
        "peak_flops": hw.peak_flops,
        "layers_per_stage": [c.layers for c in costs],
        "layer_activation_bytes": [list(c.layer_activation_bytes) for c in costs],
        "extra_activation_bytes": [c.extra_activation_bytes for c in costs],
        "params_per_stage": [c.params for c in costs],
        "flops": {"forward": [c.forward_flops for c in costs],
                  "backward_input": [c.backward_input_flops for c in costs],
                  "backward_weight": [c.backward_weight_flops for c in costs],
                  "recompute": [c.recompute_flops for c in costs]},
        "p2p_message_bytes": message,
    }
    if config.recompute:
        meta["w_transient_bytes"] = [c.w_transient for c in costs]
    profiles = chunk_profiles(m, hw, config, vocab=meta["vocab_padded"])
    return Problem(
        stages=stages, microbatches=microbatches,
        forward=tuple(c.forward for c in costs),
        backward_input=tuple(c.backward_input for c in costs),
        backward_weight=tuple(c.backward_weight for c in costs),
        # no backward_fused (BW = B + W): fusing saves no matmul FLOPs, the only thing counted
        activation=tuple(c.activation for c in costs),
        freed_by_b=tuple(c.freed_by_b for c in costs),
        freed_by_w=tuple(c.freed_by_w for c in costs),
        static=tuple(c.static for c in costs),
        budget=_budget(budget, hw, stages),
        p2p=message / hw.p2p_bandwidth + hw.p2p_latency,
        d2h_bandwidth=hw.d2h_bandwidth, h2d_bandwidth=hw.h2d_bandwidth,
        name=(f"{m.name} on {hw.name}: pp{stages} tp{tp} dp{dp} "
              f"mbs{micro_batch_size} seq{config.seq_len} M{microbatches}"),
        meta=meta,
        chunk_profiles=profiles,
    )


def chunk_profiles(model: ModelPreset, hardware: HardwarePreset, config: ParallelConfig,
                   vocab: int) -> tuple[ChunkProfile, ...]:
    """The V-shape and 2-interleaved-chunk cuts of the model, stage by stage.

    Why not :meth:`Problem.split`'s even shares: a chunked placement regroups the model.
    The V shape puts the last stage, with the output layer, on device 0 next to the
    embedding. The 2-chunk interleaving puts it on the last device next to a middle
    block. The even split instead kept the output layer's time and bytes where the
    one-stage-per-device cut had it. The model is cut into ``2 S`` stages as evenly as
    :func:`split_layers` cuts ``S``. Each device's static bytes count its stages'
    parameters once, so a tied embedding whose output layer lands on the same device
    (the V shape) is stored once, and one workspace per device. Models with fewer than
    ``2 S`` layers get no cut (an even split stays their estimate).
    """
    from optpipe.schedule import searched_placements

    S = config.stages
    if S < 2 or config.layer_split is not None or model.layers < 2 * S:
        return ()
    cut = replace(config, stages=2 * S, layer_split=None)
    costs = stage_costs(model, hardware, cut)
    per_param = bytes_per_param(config.sharded_optimizer, config.dp)
    tied = _div(vocab * model.hidden, config.tp) if model.tied_embeddings else 0
    profiles = []
    for name, placement in searched_placements(S).items():
        if name == "linear":                      # the base problem itself
            continue
        params = [0] * S
        for stage, c in enumerate(costs):
            params[placement[stage]] += c.params
        if placement[0] == placement[-1]:        # the output layer shares the embedding
            params[placement[0]] -= tied
        profiles.append(ChunkProfile(
            placement=tuple(placement), forward=tuple(c.forward for c in costs),
            backward_input=tuple(c.backward_input for c in costs),
            backward_weight=tuple(c.backward_weight for c in costs),
            activation=tuple(c.activation for c in costs),
            freed_by_b=tuple(c.freed_by_b for c in costs),
            freed_by_w=tuple(c.freed_by_w for c in costs),
            static=tuple(int(round(n * per_param)) + config.workspace for n in params),
            partition=tuple(c.layers for c in costs)))
    return tuple(profiles)


def default_problem(stages: int = DEFAULT_STAGES, microbatches: int = DEFAULT_MICROBATCHES,
                    *, budget: float | int | str | Sequence[float] | None = None,
                    **overrides: Any) -> Problem:
    """The headline problem: :data:`DEFAULT_MODEL` on :data:`DEFAULT_HARDWARE` at
    :data:`DEFAULT_SEQ_LEN` x :data:`DEFAULT_MICRO_BATCH_SIZE`; keywords as in
    :func:`build_problem` override any of it (``model=``, ``hardware=`` too)."""
    model = overrides.pop("model", DEFAULT_MODEL)
    hardware = overrides.pop("hardware", DEFAULT_HARDWARE)
    overrides.setdefault("seq_len", DEFAULT_SEQ_LEN)
    overrides.setdefault("micro_batch_size", DEFAULT_MICRO_BATCH_SIZE)
    return build_problem(model, hardware, stages, microbatches, budget=budget, **overrides)
