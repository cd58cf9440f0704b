"""The committed held-out tables the leaderboard ranks (:data:`BOARDS`), and how a missing row is scored.

A board is one model's held-out sample set: the records that hold its rows (read by
:mod:`.leaderboard_rows`), one sentence on how they were made, and the commands that would add a
row of a method the table of methods has and the board lacks. Those commands are written out in
full here, as the records' own READMEs write theirs, because each table was made its own way (a
paired comparison with a score cache on SmolLM2, plain ``lm_eval`` runs kept by ``lpes-report`` on
Gemma). Fields in braces are filled per method: ``{label}`` its label, ``{model}`` its lm-eval
model, ``{name}`` its key in the table, ``{colon_args}`` / ``{comma_args}`` the arguments it needs
on this model, ``{scales}`` a curve's scales file. No result number lives here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

_CPU = "a 2-core AMD EPYC CPU with avx512_bf16 and no AMX, nothing else running"


@dataclass(frozen=True)
class Board:
    """One model's held-out table: where its rows are, and how a missing method would be scored there.

    ``score``: a baseline's authors' and tuned rows on these samples (after ``tune``, the tuner on the
    search split; ``tune_args``: a method's tuner arguments beyond the table's, such as a grid rescaled to
    this board's prompts); ``score_curve``: an LPES curve's row; ``searches``: the command that makes a curve of
    an LPES scaling the board has none of, and the scales file it writes; ``needs``: arguments a method
    needs on this model (a setting file), made by ``prepare``; ``refused``: methods that refuse the model.
    """

    model: str
    sources: tuple[str, ...]
    about: str
    tune: str
    score: str
    score_curve: str
    searches: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    needs: Mapping[str, str] = field(default_factory=dict)
    prepare: Mapping[str, str] = field(default_factory=dict)
    tune_args: Mapping[str, str] = field(default_factory=dict)
    refused: Mapping[str, str] = field(default_factory=dict)
    latency: str = ""
    latency_where: str = ""
    latency_command: str = ""  # what wrote ``latency``, to which the page adds a --setting for each row timed at its defaults
    # A few words each for the picture's panel (:mod:`.leaderboard_figure`), where ``about`` would not fit.
    figure_setting: str = ""
    figure_machine: str = ""


_SMOLLM2_SAMPLES = ("--num-samples 200 --metadata '{\"seed\": 20261123}' --dtype bfloat16 \\\n"
                    "    --reuse-scores results/smollm2_multi_needle_tuned_baselines --output results/leaderboard_smollm2/{name}")
_GEMMA_RUN = ("lm_eval --model {model} --model_args \"pretrained=gemma3-270m,dtype=bfloat16{args}\" --batch_size 16 \\\n"
              "    --tasks multi_needle --metadata \"$M\" --log_samples --output_path /tmp/heldout/{name}{row}")
_GEMMA_SAMPLES = "M='{\"num_sentences\": 240, \"num_samples\": 200, \"seed\": 20261125}'"
_GEMMA_REPORT = ("lpes-report vanilla=results/gemma3_multi_needle_heldout200/results_vanilla.json {rows} \\\n"
                 "    --keep-samples --out results/leaderboard_gemma3/{name}")

BOARDS = (
    Board(
        model="SmolLM2-135M-Instruct (the bundled model)",
        sources=("results/smollm2_multi_needle_tuned_baselines/heldout.json",
                 "results/leaderboard_smollm2/poshidden/heldout.json", "results/leaderboard_smollm2/string/heldout.json",
                 "results/leaderboard_smollm2/lpes_both/heldout.json", "results/leaderboard_smollm2/lpes_base/heldout.json",
                 "results/leaderboard_smollm2/moice/heldout.json", "results/leaderboard_smollm2/fitm/heldout.json"),
        about="`multi_needle` held-out split at its defaults (60 sentences, 8 needles), chat template, bfloat16, "
              "2-core CPU (an AMD EPYC; the base-scaling curve and its uniform start on an Intel Xeon, both avx512_bf16 without AMX; "
              "tuned MoICE and Found in the Middle on an Intel Xeon with AMX, whose bfloat16 vanilla and reference curve matched the "
              "AMD's on the first 200 samples of this table): "
              "the reference table's samples, every row through `python -m lpes_harness.commands.paired` "
              "([its README](../results/smollm2_multi_needle_tuned_baselines/README.md) has the command; the rivals', "
              "the robust curve's and the base-scaling curve's rows: [results/leaderboard_smollm2](../results/leaderboard_smollm2/README.md)).",
        tune="python -m lpes_harness.commands.tune --baseline \"{label}={model}{colon_args}\" --dtype bfloat16 \\\n"
             "    --output results/tune/{name}{tune_args}",
        score="python -m lpes_harness.commands.paired --scales reference=results/smollm2_multi_needle_reference/scales.json "
              "--no-pi \\\n    --baseline \"{label}={model}{colon_args}\" --baseline \"$(cat results/tune/{name}/best.txt)\" \\\n    "
              + _SMOLLM2_SAMPLES,
        score_curve="python -m lpes_harness.commands.paired --scales {name}={scales} --no-pi \\\n    " + _SMOLLM2_SAMPLES,
        searches={"lpes_base": ("lpes-search --profile cpu-bf16 --scaling base --y-min 0.25 --y-max 4 --sweep 1,0.75,2 "
                                "--heldout-samples 0 --seed 1 --output results/smollm2_base_search",
                                "results/smollm2_base_search/scales.json"),
                  "lpes_both": ("", "results/robust_smollm2_seed1/scales.json")},
        needs={"poshidden": "setting=results/poshidden/smollm2_multi_needle.json",
               "moice": "gates=results/moice/smollm2.gates.pt"},
        latency="results/leaderboard_smollm2/latency.json",
        latency_where="SmolLM2-135M-Instruct on a 2-core Intel Xeon (family 6 model 85: AVX-512 without AVX512-BF16, no AMX), "
                      "nothing else running, every method in one run ([its README](../results/leaderboard_smollm2/README.md))",
        latency_command="python benchmarks/latency.py --samples 1 --repeats 10 --new-tokens 16 --threads 2 \\\n"
                        "    --lpes-scales results/smollm2_multi_needle_bf16_seed3/scales.json --moice-gates "
                        "results/moice/smollm2.gates.pt \\\n"
                        "    --poshidden-setting results/poshidden/smollm2_multi_needle.json "
                        "--json results/leaderboard_smollm2/latency.json",
        figure_setting="multi_needle held-out, 60 sentences, 8 needles, chat template, bfloat16",
        figure_machine="2-core CPUs (AMD EPYC; some rows Intel Xeon)",
    ),
    Board(
        model="Gemma-3-270M",
        sources=("results/gemma3_multi_needle_heldout200", "results/gemma3_base_multi_needle_heldout200",
                 "results/leaderboard_gemma3/poshidden", "results/leaderboard_gemma3/string",
                 "results/leaderboard_gemma3/fitm"),
        about="`multi_needle` held-out split at 240 sentences (~2.3k tokens, where it shows the U-curve), no chat "
              "template, bfloat16, one H200: every row one plain `lm_eval --log_samples` run, kept by `lpes-report "
              "--keep-samples` ([position rows and baselines](../results/gemma3_multi_needle_heldout200/README.md), "
              "[base-scaling rows](../results/gemma3_base_multi_needle_heldout200/README.md)); tuned positional "
              "hidden-state scaling, tuned STRING and tuned Found in the Middle on a 2-core Intel Xeon with AMX, paired with the H200's vanilla, which that CPU's "
              "bfloat16 matched on the 20 samples checked ([its README](../results/leaderboard_gemma3/README.md)).",
        tune="python -m lpes_harness.commands.tune --baseline \"{label}={model}{colon_args}\" --pretrained gemma3-270m \\\n"
             "    --metadata '{\"num_sentences\": 240}' --num-samples 16 --dtype bfloat16 --chat-template off \\\n"
             "    --output results/tuned_baselines_gemma3/{name}{tune_args}",
        score="\n".join((_GEMMA_SAMPLES,
                         _GEMMA_RUN.replace("{args}", "{comma_args}").replace("{row}", "_authors"),
                         _GEMMA_RUN.replace("{args}", ",$(cut -d: -f2- results/tuned_baselines_gemma3/{name}/best.txt)")
                         .replace("{row}", "_tuned"),
                         _GEMMA_REPORT.replace("{rows}", "\"{label} authors=/tmp/heldout/{name}_authors\" "
                                                         "\"{label} tuned=/tmp/heldout/{name}_tuned\""))),
        score_curve="\n".join((_GEMMA_SAMPLES, _GEMMA_RUN.replace("{model}", "lpes_hf").replace("{args}", ",scales={scales}")
                               .replace("{row}", ""),
                               _GEMMA_REPORT.replace("{rows}", "\"{label}=/tmp/heldout/{name}\""))),
        # Both scalings, the position curve on the global layers only: the space the held-out rows point to
        # (results/robust_gemma3_heldout: base scaling fixes 240 sentences, a global-layer position curve 480).
        searches={"lpes_both": ("lpes-search --pretrained gemma3-270m --scaling both --position-layer-type full_attention \\\n"
                                "    --y-min 1 --y-max 6 --y-step 0.25 --my 1 --base-y-min 0.5 --base-y-max 8 "
                                "--base-y-step 0.25 --my-base 1 \\\n    --sweep 1,2 --base-sweep 2,4 --seed 1 "
                                "--output results/robust_gemma3_both_seed1",
                                "results/robust_gemma3_both_seed1/scales.json")},
        needs={"poshidden": "setting=results/poshidden/gemma3.json"},
        # The table's STRING grid (S 128-512) was made for SmolLM2's ~1k-token prompts; these are ~2.3k.
        tune_args={"string": "--grid '{\"shifted_offset\": [256, 512, 768, 1024], \"local_window\": [64, 128]}'"},
        prepare={"poshidden": "python -m lpes_harness.commands.poshidden_channel --pretrained gemma3-270m --select-task "
                              "multi_needle \\\n    --metadata '{\"num_sentences\": 240}' --out results/poshidden/gemma3.json"},
        refused={"moice": "`moice_hf` refuses Gemma-3 at install: its routers are trained for one set of bases "
                          "relative to one θ, and Gemma-3 has a RoPE per layer type ([baselines.md](baselines.md#moice))"},
        latency="results/leaderboard_gemma3/latency.json",
        latency_where=f"Gemma-3-270M on {_CPU}, not on the H200 that scored the rows "
                      "([its README](../results/leaderboard_gemma3/README.md))",
        latency_command="python benchmarks/latency.py --pretrained gemma3-270m --samples 1 --repeats 10 --new-tokens 16 "
                        "--threads 2 \\\n    --json results/leaderboard_gemma3/latency.json",
        figure_setting="multi_needle held-out, 240 sentences, no chat template, bfloat16",
        figure_machine="one H200 (three tuned rivals on a 2-core Intel Xeon)",
    ),
)


@dataclass(frozen=True)
class CompareBoard:
    """One model's ``lpes-compare`` board: the committed ``--output`` folder whose ``leaderboard.json`` the page shows
    as that command wrote it (its README says what the run cost and on which CPU)."""

    model: str
    folder: str


# The boards the page opens with (issue #97): each made by one command, which it shows.
COMPARES = (
    CompareBoard("SmolLM2-135M-Instruct (the bundled model)", "results/compare_smollm2_30m"),
    CompareBoard("Gemma-3-270M", "results/compare_gemma3_240"),
)


def fill(template: str, **values: str) -> str:
    """``template`` with each ``{key}`` of ``values`` replaced; other braces (JSON metadata) are left alone."""
    for key, value in values.items():
        template = template.replace("{" + key + "}", value)
    return template
