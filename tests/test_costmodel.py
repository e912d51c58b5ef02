"""Tests of the cost model and presets: hand-checked numbers, units, stage asymmetry,
error messages, and that presets load whatever the working directory is."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from optpipe.costmodel import (DEFAULT_EFFICIENCY, DEFAULT_HARDWARE, DEFAULT_MICROBATCHES,
                               DEFAULT_MODEL, DEFAULT_SEQ_LEN, DEFAULT_STAGES,
                               DEFAULT_WORKSPACE_BYTES, build_problem, default_problem,
                               embedding_params, head_params, layer_activation,
                               layer_flops, layer_params, padded_vocab, split_layers)
from optpipe.errors import OptPipeError
from optpipe.presets import (list_hardware, list_models, load_hardware_preset,
                             load_model_preset, model_dirs)

REPO = Path(__file__).resolve().parents[1]

# GPT-3 XL as preset: h = 2048, a = 16, f = 4h, L = 24, V = 50257 (pads to 50304);
# s = 2048, b = 1. sbh = 2048 * 1 * 2048 = 4_194_304.
SBH = 4_194_304


def gpt13():
    return load_model_preset("gpt3-1.3b")


# ------------------------------------------------------------- hand-checked
def test_layer_flops_match_megatron_and_zero_bubble_by_hand():
    f, b, w = layer_flops(gpt13(), seq=2048, batch=1)
    # F = sbh(24h + 4s) = 4_194_304 * (49_152 + 8_192)
    assert f == 240_518_168_576
    # B = sbh(24h + 8s) = 4_194_304 * (49_152 + 16_384)
    assert b == 274_877_906_944
    # W = 24 s b h^2 = 4_194_304 * 49_152
    assert w == 206_158_430_208
    assert b + w == 2 * f


def test_layer_activation_bytes_by_hand():
    m = gpt13()
    flash = layer_activation(m, 2048, 1, tp=1, flash_attention=True)
    assert flash.kept == 34 * SBH == 142_606_336
    assert flash.w_needed == 32 * SBH == 134_217_728          # zero-bubble Table 1
    plain = layer_activation(m, 2048, 1, tp=1, flash_attention=False)
    # + 5 a s^2 b = 5 * 16 * 2048^2 = 335_544_320
    assert plain.kept == 142_606_336 + 335_544_320
    assert plain.w_needed == flash.w_needed                    # scores have no weights
    tp2 = layer_activation(m, 2048, 1, tp=2, flash_attention=True)
    assert tp2.kept == 34 * SBH // 2
    recompute = layer_activation(m, 2048, 1, tp=1, recompute=True)
    assert recompute.kept == 2 * SBH == 8_388_608


def test_swiglu_gqa_activation_terms():
    m = load_model_preset("llama2-70b")
    s, b, h, f, kv = 4096, 1, 8192, 28672, 8 * 128
    mem = layer_activation(m, s, b)
    # no dropout: norm in, QKV in, Q, out-proj in, norm in, MLP in = 12sbh; K, V = 4sbkv;
    # gate, up, product = 6sbf
    assert mem.kept == 12 * s * b * h + 4 * s * b * kv + 6 * s * b * f


def test_parameter_counts_match_published_totals():
    def total(name):
        m = load_model_preset(name)
        v = padded_vocab(m)
        return (m.layers * layer_params(m) + embedding_params(m, v, m.seq_len, 1)
                + head_params(m, v, 1, 1))
    assert total("llama2-7b") == 6_738_415_616      # HF meta-llama/Llama-2-7b-hf
    assert total("llama2-70b") == 68_976_648_192    # HF meta-llama/Llama-2-70b-hf
    assert abs(total("gpt3-1.3b") - 1.3e9) < 0.05e9


# ------------------------------------------------------------- the Problem
def test_problem_units_seconds_and_bytes():
    p = build_problem("gpt3-1.3b", "a100-40gb", 4, 8)
    assert p.meta["layers_per_stage"] == [6, 6, 6, 6]
    throughput = 312e12 * DEFAULT_EFFICIENCY
    assert p.forward[1] == pytest.approx(6 * 240_518_168_576 / throughput)   # ~9.25 ms
    assert p.backward_input[1] == pytest.approx(6 * 274_877_906_944 / throughput)
    assert p.backward_weight[1] == pytest.approx(6 * 206_158_430_208 / throughput)
    assert 5e-3 < p.forward[1] < 20e-3
    assert p.activation[1] == 6 * 34 * SBH and isinstance(p.activation[1], int)
    assert p.freed_by_w[1] == 6 * 32 * SBH
    assert p.p2p == pytest.approx(2 * SBH / 300e9 + 3e-6)
    assert p.budget == (40e9,) * 4
    assert p.d2h_bandwidth == p.h2d_bandwidth == 32e9
    params = 6 * layer_params(gpt13())
    assert p.static[1] == params * 16 + DEFAULT_WORKSPACE_BYTES
    for s in range(4):
        assert p.freed_by_b[s] + p.freed_by_w[s] == p.activation[s]


def test_first_and_last_stage_differ():
    p = build_problem("gpt3-1.3b", "a100-40gb", 4, 8)
    # embedding weights on stage 0, output layer (time, logits memory) on the last
    assert p.static[0] > p.static[1]
    assert p.static[3] > p.static[1]
    assert p.forward[3] > p.forward[1] == p.forward[2]
    assert p.activation[3] > p.activation[1]
    assert p.activation[0] == p.activation[1] + SBH       # embedding dropout mask


def test_meta_per_layer_bytes_add_up():
    p = build_problem("llama2-13b", "h100-80gb", 4, 8, tp=2)
    meta = p.meta
    assert sum(meta["layers_per_stage"]) == 40
    for s in range(p.stages):
        layers = meta["layer_activation_bytes"][s]
        assert len(layers) == meta["layers_per_stage"][s]
        assert sum(layers) + meta["extra_activation_bytes"][s] == p.activation[s]
    assert meta["model"] == "llama2-13b" and meta["config"]["tp"] == 2


def test_recompute_keeps_layer_inputs_and_reruns_forward():
    base = build_problem("gpt3-1.3b", "a100-40gb", 4, 8)
    p = build_problem("gpt3-1.3b", "a100-40gb", 4, 8, recompute=True)
    assert p.activation[1] == 6 * 2 * SBH
    assert p.backward_input[1] == pytest.approx(base.backward_input[1] + base.forward[1])
    assert p.meta["w_transient_bytes"][1] == 6 * 32 * SBH


def test_sharded_optimizer_divides_the_twelve_bytes():
    full = build_problem("gpt3-1.3b", "a100-40gb", 4, 8)
    zero = build_problem("gpt3-1.3b", "a100-40gb", 4, 8, sharded_optimizer=True, dp=4)
    params = full.meta["params_per_stage"][1]
    assert full.static[1] - zero.static[1] == params * (12 - 3)


def test_budget_argument_forms():
    assert build_problem("tiny-gpt", "h100-80gb", 2, 4).budget == (80e9, 80e9)
    assert build_problem("tiny-gpt", "h100-80gb", 2, 4, budget="1GiB").budget == (2**30,) * 2
    assert build_problem("tiny-gpt", "h100-80gb", 2, 4, budget=5e8).budget == (5e8, 5e8)


# ------------------------------------------------------------- layout, errors
def test_split_layers_even_and_remainders():
    assert split_layers(46, 8) == [5, 6, 6, 6, 6, 6, 6, 5]
    assert split_layers(10, 4) == [2, 3, 3, 2]
    assert split_layers(9, 4) == [2, 2, 3, 2]
    assert split_layers(7, 4) == [1, 2, 2, 2]
    assert split_layers(5, 1) == [5]
    with pytest.raises(OptPipeError):
        split_layers(4, 8)


def test_unknown_presets_name_the_known_ones():
    with pytest.raises(OptPipeError, match="known models: .*gpt3-1.3b.*llama2-70b"):
        load_model_preset("gpt5")
    with pytest.raises(OptPipeError, match="known hardwares: .*h100-80gb"):
        build_problem("tiny-gpt", "tpu-v9", 2, 4)


def test_bad_parallel_configs_are_user_errors():
    with pytest.raises(OptPipeError, match="tensor-parallel degree 3"):
        build_problem("tiny-gpt", "h100-80gb", 2, 4, tp=3)
    with pytest.raises(OptPipeError, match="efficiency"):
        build_problem("tiny-gpt", "h100-80gb", 2, 4, efficiency=0)
    with pytest.raises(OptPipeError, match="only 4 layers"):
        build_problem("tiny-gpt", "h100-80gb", 8, 4)
    with pytest.raises(OptPipeError, match="layer_split"):
        build_problem("tiny-gpt", "h100-80gb", 2, 4, layer_split=[1, 2])


def test_user_preset_files_by_path(tmp_path):
    model = tmp_path / "mine.toml"
    model.write_text('layers = 2\nhidden = 32\nheads = 2\nffn_hidden = 128\n'
                     'vocab = 100\nseq_len = 16\n')
    hw = tmp_path / "gpu.toml"
    hw.write_text('peak_bf16_tflops = 100\nmemory = "16GB"\nd2h_bandwidth = "10GB/s"\n'
                  'h2d_bandwidth = "10GB/s"\np2p_bandwidth = "50GB/s"\np2p_latency = "5us"\n')
    p = build_problem(str(model), str(hw), 2, 4)
    assert p.meta["model"] == "mine" and p.budget == (16e9, 16e9)
    bad = tmp_path / "bad.toml"
    bad.write_text("layers = 2\nwidth = 3\n")
    with pytest.raises(OptPipeError, match="bad.toml.*unknown key"):
        load_model_preset(str(bad))
    with pytest.raises(OptPipeError, match="does not exist"):
        load_model_preset(str(tmp_path / "nope.toml"))


def test_all_shipped_presets_load_and_cite_a_source():
    assert {"gpt3-1.3b", "gpt3-6.7b", "gpt3-13b", "gpt-14.6b", "llama2-7b", "llama2-13b",
            "llama2-70b", "tiny-gpt"} <= set(list_models())
    assert {"a100-40gb", "a100-80gb", "h100-80gb", "h200-141gb"} <= set(list_hardware())
    for name in list_models():
        assert load_model_preset(name).source
    for name in list_hardware():
        assert load_hardware_preset(name).source
    tiny = load_model_preset("tiny-gpt")
    assert (tiny.layers, tiny.hidden, tiny.heads, tiny.vocab, tiny.seq_len) == (4, 64, 4, 256, 32)
    assert load_model_preset("llama2-70b").kv_heads == 8


def test_presets_load_from_another_working_directory(tmp_path):
    assert model_dirs()[0].parts[-2:] == ("_data", "models")   # installed wheel first
    code = ("from optpipe.costmodel import list_models, list_hardware, build_problem;"
            "print(len(list_models()), len(list_hardware()));"
            "build_problem('tiny-gpt', 'a100-40gb', 2, 2)")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    models, hardware = map(int, out.stdout.split())
    assert models >= 8 and hardware >= 4


# ------------------------------------------------------------- the defaults
def test_defaults_make_an_80gb_budget_matter():
    p = default_problem(DEFAULT_STAGES, DEFAULT_MICROBATCHES, budget="80GB")
    # the CLI builds it without a sequence length: the preset's default must agree
    cli = build_problem(DEFAULT_MODEL, DEFAULT_HARDWARE, stages=DEFAULT_STAGES,
                        microbatches=DEFAULT_MICROBATCHES, seq_len=None, budget=80e9)
    assert cli.hash() == p.hash() and p.meta["config"]["seq_len"] == DEFAULT_SEQ_LEN
    S, M = p.stages, p.microbatches
    assert (S, M) == (8, 32)
    # 1F1B: stage s keeps min(S - s, M) microbatches in flight.
    for s in range(S):
        assert p.static[s] + min(S - s, M) * p.activation[s] <= p.budget[s]
    # ZB-H2 (zero-bubble paper, worker i = s + 1): (2p - 2i + 1) M_B + (2i - 2) M_W.
    zb_h2 = [p.static[s] + (2 * S - 2 * s - 1) * p.activation[s] + 2 * s * p.freed_by_w[s]
             for s in range(S)]
    assert all(need > p.budget[s] for s, need in enumerate(zb_h2))
    # GPipe keeps all M microbatches.
    assert all(p.static[s] + M * p.activation[s] > p.budget[s] for s in range(S))


def test_chunked_cuts_regroup_the_model_not_split_devices_evenly():
    """The V-shape and 2-interleaved-chunk cuts: the same model in 2 S stages (totals
    kept), the output layer where the placement puts the last stage (device 0 for the
    V), and a tied embedding stored once when its output layer shares the device."""
    from dataclasses import replace

    from optpipe.costmodel import build_problem
    from optpipe.schedule import interleaved_placement, v_placement

    p = build_problem("gpt3-1.3b", "h100-80gb", stages=4, microbatches=8)
    assert [list(c.placement) for c in p.chunk_profiles] == [v_placement(4),
                                                            interleaved_placement(4, 2)]
    eight = build_problem("gpt3-1.3b", "h100-80gb", stages=8, microbatches=8)
    tied = p.meta["vocab_padded"] * 2048 * 16          # bf16 weight+grad, fp32 Adam
    for c in p.chunk_profiles:
        assert c.partition == tuple(eight.meta["layers_per_stage"])
        assert sum(c.activation) == sum(p.activation)
        assert sum(c.forward) == pytest.approx(sum(p.forward))
        assert sum(c.backward_weight) == pytest.approx(sum(p.backward_weight))
        assert c.forward == eight.forward and c.activation == eight.activation
    v, inter = (p.split(c.placement) for c in p.chunk_profiles)
    even = replace(p, chunk_profiles=()).split(v_placement(4))
    # the output layer (the last stage's extra bytes) sits on device 0 in the V ...
    head = eight.meta["extra_activation_bytes"][-1]
    assert v.activation[-1] >= head and v.meta["per_chunk"]
    assert v.activation[-1] > even.activation[-1]
    # ... which then stores the tied embedding once
    assert sum(v.static) == sum(p.static) - tied
    assert sum(inter.static) == sum(p.static)


def test_short_models_and_explicit_splits_keep_the_even_split():
    from optpipe.costmodel import build_problem

    assert build_problem("gpt3-1.3b", "h100-80gb", stages=16, microbatches=8,
                         ).chunk_profiles == ()            # 24 layers < 32 chunks
    assert build_problem("gpt3-1.3b", "h100-80gb", stages=4, microbatches=8,
                         layer_split=[6, 6, 6, 6]).chunk_profiles == ()
