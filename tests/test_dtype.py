"""--dtype: bfloat16 only where it is native; RoPE positions stay float32; greedy decisions survive bfloat16."""

import torch
from tiny_models import random_ids, tiny_model

from lpes_harness.core import models, rope
from lpes_harness.core.models import choose_dtype, cpu_has_native_bf16

AVX2 = "processor : 0\nflags : fpu sse sse2 avx avx2 fma\n"
AVX512_BF16 = "processor : 0\nflags : fpu avx2 avx512f avx512_bf16\n"
AMX = "processor : 0\nflags : fpu avx2 amx_bf16 amx_tile\n"


def test_auto_picks_bfloat16_only_where_it_is_native(monkeypatch):
    assert not cpu_has_native_bf16(AVX2)
    assert cpu_has_native_bf16(AVX512_BF16) and cpu_has_native_bf16(AMX)
    monkeypatch.setattr("lpes_harness.core.models.cpu_has_native_bf16", lambda cpuinfo=None: False)
    assert choose_dtype("auto", "cpu") == "float32"
    assert choose_dtype("auto", "cuda") == "bfloat16"
    assert choose_dtype("float16", "cpu") == "float16"
    monkeypatch.setattr("lpes_harness.core.models.cpu_has_native_bf16", lambda cpuinfo=None: True)
    monkeypatch.setattr("lpes_harness.core.models.cpu_bf16_speedup", lambda: 2.0)
    assert choose_dtype("auto", "cpu") == "bfloat16"


def test_native_bfloat16_is_chosen_only_where_it_is_timed_faster_than_float32(monkeypatch):
    """An Intel Xeon with AVX512-BF16 but its AMX hidden ran bfloat16 1.6-1.75x slower than float32: the flag
    alone would have picked the slower dtype. Without the flag nothing is timed."""
    def never_timed():
        raise AssertionError("timed on a CPU without native bfloat16")

    monkeypatch.setattr(models, "cpu_has_native_bf16", lambda cpuinfo=None: False)
    monkeypatch.setattr(models, "cpu_bf16_speedup", never_timed)
    assert models.auto_dtype("cpu")[0] == "float32"
    monkeypatch.setattr(models, "cpu_has_native_bf16", lambda cpuinfo=None: True)
    for speedup, prefers in ((0.6, False), (1.05, False), (models.BF16_MIN_SPEEDUP, True), (3.7, True)):
        monkeypatch.setattr(models, "cpu_bf16_speedup", lambda speedup=speedup: speedup)
        assert (models.auto_dtype("cpu")[0] == "bfloat16") is prefers
        assert choose_dtype("auto", "cpu") == ("bfloat16" if prefers else "float32")


def test_the_bfloat16_timing_runs_once_a_process():
    models.cpu_bf16_speedup.cache_clear()
    first = models.cpu_bf16_speedup()
    assert first > 0 and models.cpu_bf16_speedup() == first and models.cpu_bf16_speedup.cache_info().hits == 1


def test_scaled_rope_positions_are_computed_in_float32_in_a_bfloat16_model():
    model = tiny_model("llama").to(torch.bfloat16)
    length, scale = 300, 1.3
    rope.install(model, [scale] + [1.0] * (len(model.model.layers) - 1))
    received = {}
    hook = model.model.layers[0].self_attn.register_forward_pre_hook(
        lambda module, args, kwargs: received.update(kwargs), with_kwargs=True)
    ids = random_ids(length)
    with torch.no_grad():
        model(ids)
        hidden = torch.zeros(1, length, model.config.hidden_size, dtype=torch.bfloat16)
        exact = model.model.rotary_emb(hidden, (torch.arange(length, dtype=torch.float32) / scale)[None])
        rounded = model.model.rotary_emb(hidden, (torch.arange(length).to(torch.bfloat16) / scale)[None])
    hook.remove()
    cos, sin = received["position_embeddings"]
    assert cos.dtype == torch.bfloat16
    assert torch.equal(cos, exact[0]) and torch.equal(sin, exact[1])
    assert not torch.equal(cos, rounded[0])  # bfloat16 positions would be visibly off: the test can fail


def test_bfloat16_keeps_the_greedy_decision_where_the_margin_is_large():
    model32 = tiny_model("llama", seed=3)
    rope.install(model32, [0.8, 1.0, 1.3, 1.6])
    model16 = tiny_model("llama", seed=3).to(torch.bfloat16)
    rope.install(model16, [0.8, 1.0, 1.3, 1.6])
    ids = random_ids(64, batch=4)
    with torch.no_grad():
        logits32 = model32(ids).logits.float()
        logits16 = model16(ids).logits.float()
    top2 = logits32.topk(2, dim=-1).values
    clear = (top2[..., 0] - top2[..., 1]) > 0.1  # bfloat16 rounds logits by ~1e-2 here
    assert clear.sum() > 50
    assert torch.equal(logits32.argmax(-1)[clear], logits16.argmax(-1)[clear])


def test_the_agreement_benchmarks_statistics():
    from conftest import load_benchmark

    bench = load_benchmark("dtype_agreement")
    assert bench.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == 1.0
    assert bench.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == -1.0
    assert abs(bench.spearman([1, 2, 2, 3], [1, 2, 3, 4]) - 0.9487) < 1e-4  # average ranks for ties
    fit = [0.1, 0.5, 0.9, 0.3, 0.7, 0.2]
    assert bench.same_parents_rate(fit, fit, 4, 2, trials=50) == 1.0
    assert bench.same_parents_rate(fit, [-v for v in fit], 4, 2, trials=50) == 0.0


def test_a_run_says_why_auto_chose_its_dtype(monkeypatch):
    monkeypatch.setattr(models, "cpu_has_native_bf16", lambda cpuinfo=None: False)
    monkeypatch.setattr(models, "cpu_kind", lambda cpuinfo=None: "AVX2 only")
    assert models.auto_dtype("cpu") == ("float32", "no native bfloat16 on this CPU (AVX2 only)")
    assert models.auto_dtype("cuda:0") == ("bfloat16", "CUDA")
    monkeypatch.setattr(models, "cpu_has_native_bf16", lambda cpuinfo=None: True)
    monkeypatch.setattr(models, "cpu_bf16_speedup", lambda: 0.617)
    assert models.auto_dtype("cpu") == ("float32", "native bfloat16 timed at 0.62x float32's speed here")


AVX512_NO_BF16 = "processor : 0\nflags : fpu avx2 avx512f avx512bw avx512_vnni\n"


def test_each_cpu_kind_is_named_as_the_readme_times_it():
    assert [models.cpu_kind(info) for info in (AMX, AVX512_BF16, AVX512_NO_BF16, AVX2, "")] == [
        "AMX", "avx512_bf16 without AMX", "AVX-512 without avx512_bf16", "AVX2 only", "unknown CPU kind"]
    info = "processor\t: 0\nmodel name\t: Intel(R) Xeon(R)\ncpu family\t: 6\nmodel\t\t: 85\n" + AVX512_NO_BF16.split("\n", 1)[1]
    described = models.machine_description("cpu", info)
    assert described.startswith("Intel(R) Xeon(R), family 6 model 85, ")
    assert described.endswith(" cores, AVX-512 without avx512_bf16")


def test_a_dtype_hflm_cannot_load_with_is_refused_before_the_model_loads():
    """What HFLM takes (auto, a floating torch dtype or its name) passes; the rest is one ValueError, not
    torch's AttributeError after the config and tokenizer load."""
    import pytest

    for good in (None, "auto", "float32", "bfloat16", "float16", "half", torch.bfloat16):
        models.check_dtype(good)
    for bad in ("float64x", "int8", "bool", torch.int32, "__name__"):
        with pytest.raises(ValueError, match="is not a floating-point torch dtype"):
            models.check_dtype(bad)


def test_threads_must_be_a_positive_integer():
    import argparse

    import pytest

    assert models.positive_int("2") == 2
    for bad in ("0", "-1", "two", "1.5"):
        with pytest.raises(argparse.ArgumentTypeError, match=f"an integer >= 1, got '{bad}'"):
            models.positive_int(bad)
