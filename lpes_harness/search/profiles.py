"""The search's profiles: named sets of settings sized for a model and a machine (``--profile``).

A profile changes some settings; every other keeps its flag's default, and the command line and a
``--config`` file override a profile's values. ``auto`` (the default) picks one from the model and
the device (:func:`auto_profile`).
"""

from __future__ import annotations

import math
from pathlib import Path

from lpes_harness.core.models import PACKAGED_MODELS, choose_dtype, packaged_model

# Settings a profile changes; everything else keeps its flag's default. The argparse
# defaults are the paper's (kv_retrieval, population 32 / 20 generations / 200 samples per
# position, y in [1, 2] from 1.5): for 7B models, days on a 2-core CPU.
#
# The `cpu` profile is the bundled SmolLM2-135M on a 2-core CPU within about an hour, on the
# task it can do (multi_needle; kv_retrieval measures copying on it). The arithmetic: a
# ~750-token multi_needle prompt is one float32 forward of ~2.1 s on 2 threads, measured in
# the search itself (this CPU has no native bfloat16, which runs 3x slower here; `--dtype
# auto` picks it only where native and faster). 12 samples at each of the 5 positions is 60 forwards,
# ~2 min per individual; a 3-point sweep (raced) plus 8 + 3 x 5 individuals (and at most one
# more crossover child per generation) is at most 29 individuals, about an hour worst case,
# less with racing. The range is wide, [0.25, 2.5]: curves that help rise to 1.5-1.85 in
# late layers although uniform 1.2 wrecks the model, so the sweep picks the start and the
# range stays open; the y step of a mutation grows with the range (0.4).
PROFILES = {
    "paper": {},
    "cpu": {
        "task": "multi_needle", "fitness": "greedy", "num_samples": 12, "chunk_size": 6,
        "population": 8, "parents": 3, "mutants": 4, "crossovers": 1, "generations": 3,
        "y_min": 0.25, "y_max": 2.5, "y_step": 0.05, "initial_y": 1.0, "my": 0.4, "mx": 3.0,
        "sweep": "1,0.8,1.2", "heldout_samples": 40,
    },
    # The cpu search on a CPU that runs bfloat16 natively (avx512_bf16 / AMX), which `auto`
    # picks there: a ~950-token prompt is one bfloat16 forward of ~0.26 s on 2 threads
    # (float32 0.73 s on the same CPU). 20 samples at each of the 5 positions is 100 forwards,
    # ~26 s per individual; a 3-point sweep plus 12 + 4 x (6 + 2) individuals is at most 47,
    # ~21 min worst case; then 200 held-out samples per position for vanilla, PI, the best
    # curve and the sweep's best uniform scale (4,000 forwards, ~18 min). 20 samples per
    # position and ~40 individuals is the size at which every GPU search in #18 found the gain.
    "cpu-bf16": {
        "task": "multi_needle", "fitness": "greedy", "num_samples": 20, "chunk_size": 10,
        "population": 12, "parents": 5, "mutants": 6, "crossovers": 1, "generations": 4,
        "y_min": 0.25, "y_max": 2.5, "y_step": 0.05, "initial_y": 1.0, "my": 0.4, "mx": 3.0,
        "sweep": "1,0.8,1.2", "heldout_samples": 200,
    },
    # Gemma-3-270M (`--pretrained gemma3-270m`), which `auto` picks for it on a CPU. At the
    # default haystack it scores 1.00 everywhere; at 240 sentences (~2.3k tokens, past its
    # 512-token sliding window) lpes-check finds the U-curve with room, .95/.375/.525/.575/1.00
    # with nothing right once the gold needle is removed (results/calibration_gemma3_multi_needle).
    # A ~2.3k-token prompt is a bfloat16 forward of ~1 s on 2 threads, ~4x a SmolLM2 sample: 16
    # samples per position is 80 forwards, ~80 s per individual; a 3-point sweep plus 10 + 3 x
    # (5 + 1) individuals is at most 31, ~45 min worst case (racing cuts it); then 200 held-out
    # samples per position for vanilla, PI, the best curve and the best uniform scale (4,000
    # forwards, about an hour; a later seed can reuse vanilla's scores, see results/).
    # Only the 3 global layers (5, 11, 17) move (--layer-type full_attention): scaling the
    # sliding-window layers breaks Gemma (1.5 there alone: -45 points; uniform 0.8: 0 at the end
    # position), and in the paper's range [1, 2] over all layers a first search's mutants were
    # all within a point of vanilla. On the global layers alone 2 to 8 lift the 25 and 50 %
    # positions by 19-31 points, but from 5 up they cost the end position 31-56 points, and
    # below 1 nothing helps (results/gemma3_layer_type_probe, 16 samples per position), so y
    # spans [1, 6] in steps of 0.25 with My 1, and the sweep tries 2 and 4 as starts.
    "gemma3-cpu": {
        "task": "multi_needle", "metadata": {"num_sentences": 240}, "fitness": "greedy",
        "num_samples": 16, "chunk_size": 8, "population": 10, "parents": 4, "mutants": 5, "crossovers": 1,
        "generations": 3, "layer_type": "full_attention", "y_min": 1.0, "y_max": 6.0, "y_step": 0.25,
        "initial_y": 1.0, "my": 1.0, "mx": 2.0, "sweep": "1,2,4", "heldout_samples": 200,
    },
    # Gemma-3-270M with base scaling (--scaling base: layer h's RoPE base becomes s_h x theta, its
    # layer type's theta), which `auto` picks for it on any device (on one H200: 2.5 min a search). Position scales could not remove its
    # bias: the gemma3-cpu search found nothing on its own samples and its curve gained +3.6 on 1,000
    # held-out ones (results/gemma3_multi_needle_heldout200), while one base 2 x theta on every
    # layer answered 80 of 80 search samples as Attention Buckets' best did (.975 against vanilla's
    # .831; results/tuned_baselines_gemma3/buckets_single_base). So: every layer moves (a base
    # factor leaves the fast frequencies that the sliding-window layers live on nearly as they
    # are), the sweep tries the uniform factors 1, 2 and 4 as starts, and y spans [0.5, 8] in steps
    # of 0.25 with My 1. The same task, samples, GA sizes and held-out table as gemma3-cpu.
    "gemma3-base-cpu": {
        "task": "multi_needle", "metadata": {"num_sentences": 240}, "fitness": "greedy",
        "num_samples": 16, "chunk_size": 8, "population": 10, "parents": 4, "mutants": 5, "crossovers": 1,
        "generations": 3, "scaling": "base", "y_min": 0.5, "y_max": 8.0, "y_step": 0.25,
        "initial_y": 1.0, "my": 1.0, "mx": 2.0, "sweep": "1,2,4", "heldout_samples": 200,
    },
    # The same calibrated multi_needle search scaled up for one GPU: the paper's population and
    # generations (432 individuals at most), 100 samples per position in batches of up to 100
    # prompts (racing per batch), bfloat16 (auto). The target on one H100 is 15 minutes for
    # SmolLM2: ~216k samples at the ~240 samples/s a batched bfloat16 scorer reached there.
    # Not yet measured on a GPU by this project.
    "gpu": {
        "task": "multi_needle", "fitness": "greedy", "num_samples": 100, "chunk_size": 100,
        "y_min": 0.25, "y_max": 2.5, "y_step": 0.05, "initial_y": 1.0, "my": 0.4, "mx": 3.0,
        "sweep": "1,0.9,0.8,1.1,1.2", "heldout_samples": 200,
    },
    # One curve for the range of inputs a user sends (issue #44): the bundled SmolLM2 searched on three
    # conditions at once, the default haystack (60 sentences, 8 needles, ~1k tokens), four times its
    # length (240 sentences, ~4k tokens) and twice the needles (16), the mean of their fitnesses. 120
    # sentences is left to the held-out tables (with 180): a curve that holds at 60 and 240 is tested
    # between them, and the 240 condition already costs 70 % of a sample's time (bfloat16, 2 cores,
    # avx512_bf16 without AMX: 1.0 / 5 / 1.2 s a sample). Two curves in one genome (--scaling both):
    # position factors where SmolLM2's gain lives, base factors in a narrow range (no uniform base
    # factor helped at 240 sentences: results/smollm2_uniform_4x_probe). 6 samples per position per
    # condition is 90 forwards, ~3.6 min an individual there; 3 sweep points + at most 26 individuals
    # is ~1.7 h worst case (racing cuts it), the uniform factors as many forwards again, then 5
    # candidates on 6+ validation samples per position, then a 10-per-position held-out look per
    # condition (the tables that decide are commands.transfer's, 100 per position): ~3 h on that CPU,
    # about 45 min with AMX (estimates). Measured in float32 on 2 cores without avx512_bf16 (GA seed 2):
    # over 4 h of scoring before its validation; `lpes-search --estimate` says for the machine at hand.
    "robust-smollm2": {
        "task": "multi_needle", "fitness": "greedy", "num_samples": 6, "chunk_size": 3,
        "condition": ['60 sentences={"num_sentences": 60}', '240 sentences={"num_sentences": 240}',
                      '16 needles={"num_needles": 16}'],
        "condition_objective": "mean",
        "population": 8, "parents": 3, "mutants": 4, "crossovers": 1, "generations": 3,
        "scaling": "both", "y_min": 0.25, "y_max": 2.5, "y_step": 0.05, "initial_y": 1.0, "my": 0.4, "mx": 3.0,
        "base_y_min": 0.5, "base_y_max": 4.0, "base_y_step": 0.25, "my_base": 0.25,
        "sweep": "1,0.8", "base_sweep": "2",
        "validation_samples": 6, "select_top": 4, "uniform_tuning": True, "heldout_samples": 10,
    },
    # Gemma-3-270M over the two lengths where it shows position bias, 240 sentences (~2.3k tokens, the
    # U-curve) and 480 (~4.6k, only the recency end left): gemma3-base-cpu's base scaling (the gain
    # there is the base) with fewer samples per condition. A 480-sentence sample is ~2.5x a
    # 240-sentence one: ~20 s for the pair on 2 cores without AMX, so this fits 3 hours only on an AMX
    # CPU or a GPU (docs/search_profiles.md has the estimate for each).
    "robust-gemma3": {
        "task": "multi_needle", "metadata": {"num_sentences": 240}, "fitness": "greedy",
        "num_samples": 6, "chunk_size": 3,
        "condition": ['240 sentences={"num_sentences": 240}', '480 sentences={"num_sentences": 480}'],
        "condition_objective": "mean",
        "population": 8, "parents": 3, "mutants": 4, "crossovers": 1, "generations": 3,
        "scaling": "base", "y_min": 0.5, "y_max": 8.0, "y_step": 0.25, "initial_y": 1.0, "my": 1.0, "mx": 2.0,
        "sweep": "1,2,4", "validation_samples": 6, "select_top": 4, "uniform_tuning": True, "heldout_samples": 10,
    },
}  # fmt: skip

# The CPU profiles race in the hardest-first sample order: the same individuals are selected as in
# the roles order (the bound is exact in any order), with 29.5 % fewer forwards on the one search
# trajectory replayed both ways (benchmarks/sample_order.py; docs/search_profiles.md). On a GPU a
# racing chunk is one batch, and a chunk of the hardest order spans several positions (one batch
# each): not measured there, so the GPU profiles keep the roles order.
for _name in ("cpu", "cpu-bf16", "gemma3-cpu", "gemma3-base-cpu", "robust-smollm2", "robust-gemma3"):
    PROFILES[_name]["sample_order"] = "hardest"

# robust-smollm2 sized for one GPU (bfloat16, a racing chunk is one batch): 120 sentences joins the
# conditions (the CPU profile's curve gained nothing there, between its two searched lengths), 12
# samples per position of each (twice the CPU profile's), a population of 10. About 16k forwards a
# seed with uniform tuning and validation (6.5 min on an H200); far more than 3 hours on 2 cores.
PROFILES["robust-smollm2-gpu"] = {
    **PROFILES["robust-smollm2"],
    "num_samples": 12, "chunk_size": 12,
    "condition": ['60 sentences={"num_sentences": 60}', '120 sentences={"num_sentences": 120}',
                  '240 sentences={"num_sentences": 240}', '16 needles={"num_needles": 16}'],
    "population": 10, "parents": 4, "mutants": 5, "crossovers": 1,
    "validation_samples": 12, "heldout_samples": 0, "sample_order": "roles",
}  # fmt: skip

# The gradient search (issue #100) for the bundled SmolLM2 on a CPU: two straight lines over depth, position and
# base factors (4 numbers), moved by Adam (lr 0.05, backtracking: a step that raises the loss is undone and retaken
# at half the rate) on the margin loss over 16 samples whose lengths are drawn from 60 to 300 sentences (~0.75k to
# ~2.9k tokens), 8 full-batch steps (384 forwards, a backward counted as two). A step
# of 16 samples took about 3 min in float32 on 2 AVX2 cores (a forward and backward 3.7 / 10.4 / 21.6 s at 60 /
# 180 / 300 sentences). Then uniform.json on a quarter of those forwards, and the choice by accuracy on
# validation samples at 120 and 240 sentences (2 per position, doubling while tied) among the two lowest-loss
# steps, the start and the uniform factors. The loss steers; accuracy on samples it never saw chooses.
PROFILES["gradient-smollm2"] = {
    "task": "multi_needle", "fitness": "greedy", "num_samples": 2, "chunk_size": 2,
    "condition": ['120 sentences={"num_sentences": 120}', '240 sentences={"num_sentences": 240}'],
    "condition_objective": "mean", "scaling": "both", "y_min": 0.25, "y_max": 2.5, "y_step": 0.05, "initial_y": 1.0,
    "base_y_min": 0.5, "base_y_max": 4.0, "base_y_step": 0.25, "sweep": "none", "base_sweep": "none",
    "search_method": "gradient", "family": "lines", "loss": "margin", "lr": 0.05, "gradient_samples": 16,
    "gradient_forwards": 384, "draw_sentences": "60:300", "uniform_share": 0.25,
    "validation_samples": 2, "select_top": 2, "uniform_tuning": True, "heldout_samples": 0, "sample_order": "hardest",
}  # fmt: skip

# Random lines raced (issue #100, --search-method racing) for the bundled SmolLM2 on a CPU, what `auto` runs there:
# 31 pairs of lines over depth (each axis's first and last factor log-uniform in [0.5, 2], Latin-hypercube spread)
# and the plain model, raced by successive halving on 48 prompts drawn from 60 to 300 sentences, each asked about
# all 8 of its needles from one forward of their shared text (--every-item): 32 on 8, 16 on 16, 8 on 32 and 4 on 48
# prompts, 576 forwards; a prompt's score is the share of its questions right, the margin loss breaks ties. The
# race's winner is the curve (no validation stage). Then uniform.json on an eighth of the race's forwards, scored
# with the fitness of the profile's two conditions (120 and 240 sentences, the same samples for every seed).
# Measured in bfloat16 on 2 cores: 26 and 29 min (seeds 4, 5) with AMX, 36 and 41 min (seeds 4, 6) with avx512_bf16
# and no AMX (results/every_item_smollm2_seed*).
PROFILES["racing-smollm2"] = {
    **{k: v for k, v in PROFILES["gradient-smollm2"].items()
       if k not in ("lr", "gradient_samples", "gradient_forwards", "family")},
    "search_method": "racing", "y_min": 0.5, "y_max": 2.0, "base_y_min": 0.5, "base_y_max": 2.0,
    "racing_draws": 31, "racing_samples": 48, "racing_first": 8, "every_item": True,
    # The race's last rung (4 finalists on 48 prompts, 8 questions each: 384 paired questions) says more than
    # 80 validation prompts could, so the validation's forwards went to more draws (23 -> 31).
    "uniform_share": 0.125, "validation_samples": 0,
}  # fmt: skip

# The race for Gemma-3-270M, what `auto` runs for it (issue #100): its bias sits at 240 sentences (~2.3k tokens, a
# U-curve) and 480 (~4.6k), where base scaling alone gains at 240 and nothing at 480, and position factors on the
# three global layers gain at 480 (results/robust_gemma3_heldout); one point holding both, base 4.5 everywhere
# with the global layers' position factors, gained at each length (results/gemma3_both_probe). So the race draws a
# position line on the global layers (the sliding ones stay at 1: scaling them breaks Gemma) and a base line on
# every layer, each end in [1, 3] and [1, 8] (below 1 nothing helped), on 24 prompts drawn from 240 to 480
# sentences, every needle asked (24 on 4, 12 on 8, 6 on 16, 3 on 24 prompts: 216 forwards); uniform.json on an
# eighth of them. A prompt is ~4x a SmolLM2 one: 48 min 35 s in bfloat16 on 2 cores with avx512_bf16 and no AMX
# (results/gemma3_default; --estimate said 37). Its uniform.json budget (27 forwards) holds one uniform point (60).
PROFILES["racing-gemma3"] = {
    **{k: v for k, v in PROFILES["robust-gemma3"].items() if k not in ("y_min", "y_max", "y_step", "my", "sweep")},
    "search_method": "racing", "scaling": "both", "position_layer_type": "full_attention",
    "y_min": 1.0, "y_max": 3.0, "y_step": 0.1, "base_y_min": 1.0, "base_y_max": 8.0, "base_y_step": 0.25,
    "sweep": "none", "base_sweep": "none", "draw_sentences": "240:480",
    "racing_draws": 23, "racing_samples": 24, "racing_first": 4, "every_item": True,
    "uniform_share": 0.125, "validation_samples": 0, "heldout_samples": 0,
}  # fmt: skip

# The flag default of --num-samples (the paper's), for profiles that do not set it.
PAPER_NUM_SAMPLES = 200

EPILOG = """\
profiles (--profile; the command line and --config override a profile's values):
  paper  the paper's settings, for 7B models on kv_retrieval / mdqa: population 32,
         12 parents, 16 mutants + 4 crossovers, 20 generations, 200 samples per position,
         greedy fitness, y in [1, 2] from 1.5, Mx 2, My 0.2
  cpu    the bundled SmolLM2-135M on multi_needle on a 2-core CPU (under an hour):
         population 8, 3 parents, 4 mutants + 1 crossover, 3 generations, 12 samples at
         each of the 5 positions (middle = 25/50/75 %), greedy fitness, a uniform sweep
         1,0.8,1.2 picks the start, y in [0.25, 2.5] (step 0.05), Mx 3, My 0.4; then 40
         held-out samples per position, paired with vanilla and PI
  cpu-bf16  the cpu search sized for a CPU that runs bfloat16 natively (avx512_bf16 /
         AMX; ~0.26 s a sample against 0.73 s in float32): population 12, 5 parents,
         6 mutants + 1 crossover, 4 generations, 20 samples per position (racing in
         chunks of 10); then 200 held-out samples per position (under 45 min on 2 cores)
  gpu    the cpu profile's multi_needle search scaled up for one GPU: the paper's
         population 32 / 12 parents / 16 mutants + 4 crossovers / 20 generations,
         100 samples per position (chunks of 100 = the batch), sweep 1,0.9,0.8,1.1,1.2,
         200 held-out samples per position; bfloat16 by --dtype auto (not yet measured
         on a GPU by this project)
  gemma3-cpu  Gemma-3-270M (--pretrained gemma3-270m) on a 2-core CPU: multi_needle with
         num_sentences 240 (~2.3k tokens, where it shows the U-curve), population 10,
         4 parents, 5 mutants + 1 crossover, 3 generations, 16 samples per position;
         only the global layers move (--layer-type full_attention; scaling its
         sliding-window layers breaks it), y in [1, 6], My 1, Mx 2, sweep 1,2,4; then
         200 held-out samples per position (~45 min of search in bfloat16, then about an
         hour of held-out table)
  gemma3-base-cpu  gemma3-cpu's task, samples and sizes with --scaling base on every
         layer (each factor multiplies the layer's RoPE base): y in [0.5, 8], sweep 1,2,4.
         Position scales could not remove Gemma's bias; a larger base does
  robust-smollm2  one curve for a range of inputs: the bundled SmolLM2 on three conditions at
         once (60 and 240 sentences, 16 needles; mean fitness), --scaling both (position
         y in [0.25, 2.5], base y in [0.5, 4]), 6 samples per position per condition,
         population 8, 3 generations; then uniform.json (the best single factor, tuned on
         as many forwards as the search), the honest choice on validation samples
         (scales.json), and 10 held-out samples per position per condition (over 3 h
         on 2 cores without AMX; over 4 h in float32: --estimate says for this machine)
  robust-smollm2-gpu  robust-smollm2 sized for one GPU: 60, 120 and 240 sentences and 16
         needles, 12 samples per position of each, population 10, no held-out table (score
         the result with python -m lpes_harness.commands.transfer --batch-size 10)
  robust-gemma3  Gemma-3-270M on 240 and 480 sentences, base scaling, the same stages
  gradient-smollm2  the gradient search (--search-method gradient) for the bundled SmolLM2 on a
         CPU: a position line and a base line over depth (4 numbers), Adam on the margin
         loss over 16 samples drawn from 60 to 300 sentences, 8 steps (384 forwards);
         uniform.json on a quarter of them; the choice on validation samples at 120 and 240
         sentences (under an hour on 2 cores; --estimate says for this machine)
  racing-smollm2  random pairs of lines (--search-method racing) for the bundled SmolLM2 on a
         CPU, what auto runs there: 31 pairs (position and base, each end in [0.5, 2]) and
         the plain model raced by successive halving on 48 prompts drawn from 60 to 300
         sentences, each asked about all of its 8 needles from one forward of its text
         (--every-item; 576 forwards); the race's winner is the curve; uniform.json on an
         eighth of its forwards (under an hour on 2 cores; --estimate says for this machine)
  racing-gemma3  the race for Gemma-3-270M, what auto runs for it: a position line on its 3
         global layers (ends in [1, 3]; the sliding layers stay at 1) and a base line on
         every layer (ends in [1, 8]), 23 pairs and the plain model on 24 prompts drawn
         from 240 to 480 sentences, every needle asked (216 forwards); uniform.json on an
         eighth of them (49 min in bfloat16 on 2 cores without AMX)
  auto   (default) racing-smollm2 for the bundled SmolLM2 on a CPU, robust-smollm2-gpu on a
         GPU, and racing-gemma3 for --pretrained gemma3-270m (on any device); for other
         models gpu on a GPU, and on a CPU cpu-bf16 when --dtype resolves to bfloat16
         (auto does where it is native), else cpu

why the cpu range is wide: on SmolLM2 the curves that remove position bias go to 1.5-1.85
in late layers, while *uniform* 1.2 already wrecks the model. The sweep therefore only
picks the starting individual (the best uniform scale); it never narrows the range.

examples:
  lpes-search                                   # bundled SmolLM2, profile auto
  lpes-search --profile paper --device cuda     # the paper's settings
  lpes-search --generations 5 --num-samples 50 --y-min 0.6 --y-max 1.6
  lpes-search --resume --output results/my_run  # continue a stopped run
  lpes-search --status --output results/my_run  # where a run stands, stage by stage (reads only)
  lpes-search --config my_search.json           # settings from a file (keys = long flag names)
  accelerate launch --multi_gpu --num_processes 2 searches/ga.py ...  # split each evaluation's samples (gloo on CPU)
"""


def profile_heldout_samples(profile: str, num_samples) -> int:
    """The profile's held-out samples per position, scaled by the search's ``num_samples`` against the
    profile's own (rounded up): the table stays in proportion to the search it checks."""
    settings = PROFILES[profile]
    heldout = settings.get("heldout_samples", 0)
    searched = settings.get("num_samples", PAPER_NUM_SAMPLES)
    if not heldout or not isinstance(num_samples, int) or num_samples < 1 or num_samples == searched:
        return heldout  # a bad --num-samples is named by the checks
    return math.ceil(heldout * num_samples / searched)


def auto_profile(device, dtype, pretrained=None) -> str:
    """One curve over the range of inputs the packaged models' tables measure (issue #44): the race of lines for
    the bundled SmolLM2 on a CPU (issue #100: under an hour on 2 cores, where robust-smollm2 took 3.3-6.9 hours
    and its curve lost 6.6 points at 180 sentences) and for Gemma-3-270M anywhere; for any other model gpu on a
    GPU, and on a CPU cpu-bf16 where the search will run in bfloat16, else cpu.

    Gemma-3-270M needs its own task size (at multi_needle's default it has no position bias to
    remove, so the gpu profile would search for nothing), base scaling on every layer and position
    scaling on its global ones (robust-gemma3, base only, gained nothing at 480 sentences). The bundled
    SmolLM2's GPU profile is its CPU one at about 4x the forwards (a fourth condition, twice the samples):
    its curves held at 120 and 180 sentences, where the CPU profile's lost
    (results/robust_smollm2_gpu_heldout); 6 min a seed on an H200, hours on 2 cores. The two SmolLM2
    single-setting CPU profiles differ only in size: bfloat16 is ~2.8x faster than float32 where the
    CPU runs it natively, so the same hour holds a larger search there.
    """
    packaged = packaged_model(pretrained)
    if packaged is PACKAGED_MODELS["gemma3-270m"]:
        return "racing-gemma3"
    if packaged is PACKAGED_MODELS["smollm2"]:
        return "racing-smollm2" if runs_on_cpu(device) else "robust-smollm2-gpu"
    if not runs_on_cpu(device):
        return "gpu"
    return "cpu-bf16" if choose_dtype(dtype, "cpu") == "bfloat16" else "cpu"


def runs_on_cpu(device) -> bool:
    if device:
        return str(device).startswith("cpu")
    # An NVIDIA device node, without importing torch (seconds): bad flags must fail fast.
    return not any(Path("/dev").glob("nvidia[0-9]*"))


