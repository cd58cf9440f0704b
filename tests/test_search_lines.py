"""--lines: straight lines over depth scored right after the start, before any mutant or draw."""

import math

import pytest

from lpes_harness.search import Callback, GeneticSearch, GenomeSpec, SearchConfig
from lpes_harness.commands.search_cli import parse_args
from lpes_harness.search.genome import ramp_genome
from lpes_harness.search.sweep import parse_lines

SPEC = GenomeSpec(num_layers=30, num_points=4, y_min=0.25, y_max=2.5, y_step=0.05)
RANDOM = SearchConfig(population=6, parents=1, mutants=5, crossovers=0, generations=0, seed=3, initial="random")


class Calls(Callback):
    def __init__(self):
        self.records = []

    def on_individual(self, search, record):
        self.records.append(record)


def rising(scales, threshold=None):
    """A fitness that rewards a rise over depth; it records the threshold each call was raced against."""
    rising.thresholds.append(threshold)
    return scales[-1] - scales[0], {"raced": False}


def run(lines=(), config=RANDOM):
    rising.thresholds = []
    calls = Calls()
    GeneticSearch(SPEC.starting_at(0.8), rising, config, [calls],
                  lines=[ramp_genome(SPEC, a, b) for a, b in lines]).run()
    return calls.records, rising.thresholds


def test_lines_parse_in_the_order_given_and_bad_ones_say_how_to_write_them():
    assert parse_lines("0.6:1.4, 1:1.4,0.6:1.4") == [(0.6, 1.4), (1.0, 1.4)]
    assert parse_lines("none") == parse_lines("") == parse_lines(None) == []
    for bad in ("0.6", "0.6:1.4:2", "a:b", "0:1", "-1:1"):
        with pytest.raises(ValueError, match="FIRST:LAST"):
            parse_lines(bad)
    with pytest.raises(ValueError, match="1:1 is flat, a uniform scale: give it in --sweep"):
        parse_lines("1:1")


def test_the_lines_come_right_after_the_start_and_the_draws_after_them_are_the_same_draws():
    plain, _ = run()
    with_lines, thresholds = run([(0.6, 1.4), (1.4, 0.6)])
    assert [r["origin"] for r in with_lines] == ["initial", "line", "line", "random", "random", "random"]
    assert with_lines[1]["genome"] == [list(p) for p in ramp_genome(SPEC, 0.6, 1.4)]
    assert math.isclose(with_lines[1]["scales"][0], 0.6) and math.isclose(with_lines[1]["scales"][-1], 1.4)
    # The lines take the place of the last draws: the draws made are the first ones of the same seed.
    assert [r["genome"] for r in with_lines[3:]] == [r["genome"] for r in plain[1:4]]
    # Each is raced against the best so far: the first line against the start, the draws against the line.
    assert thresholds[1] == with_lines[0]["fitness"] and thresholds[3] == with_lines[1]["fitness"] > thresholds[1]


def test_lines_also_open_a_genetic_search_and_must_fit_its_population_and_spec():
    ga = SearchConfig(population=5, parents=2, mutants=2, crossovers=1, generations=1, seed=1)
    records, _ = run([(0.6, 1.4)], ga)
    assert [r["origin"] for r in records[:5]] == ["initial", "line", "mutant", "mutant", "mutant"]
    with pytest.raises(ValueError, match="6 lines do not fit in a population of 6"):
        run([(0.6, 1.4), (0.6, 1.0), (1.0, 1.4), (1.4, 1.0), (1.0, 0.6), (1.4, 0.6)])
    brute = GenomeSpec(num_layers=30, num_points=4, y_min=0.25, y_max=2.5, y_step=0.05, brute_force=True)
    with pytest.raises(ValueError, match="lines are Bézier genomes"):
        GeneticSearch(brute, rising, RANDOM, lines=[ramp_genome(SPEC, 0.6, 1.4)])
    with pytest.raises(ValueError, match="the line genome is not valid"):
        GeneticSearch(SPEC, rising, RANDOM, lines=[[(0.0, 1.0), (0.0, 1.2), (10.0, 1.0), (29.0, 1.0)]])


@pytest.mark.parametrize("flags, message", [
    (["--lines", "0.6:3"], r"--lines 0.6:3: the ends must lie in \[--y-min, --y-max\] = \[0.25, 2.5\]"),
    (["--lines", "0.6:1.4", "--brute-force"], "which --brute-force cannot hold"),
    (["--lines", "0.6:1.4", "--curve", "step"], "which --curve step cannot hold"),
    (["--lines", "0.6:1.4,1:1.4", "--population", "2", "--parents", "1", "--mutants", "1", "--crossovers", "0"],
     "2 lines need a --population of at least 3"),
    (["--lines", "1.4"], "FIRST:LAST"),
])
def test_lines_a_search_cannot_hold_are_one_line_before_anything_loads(flags, message, capsys):
    with pytest.raises(SystemExit) as stop:
        parse_args(["--device", "cpu", "--scaling", "position", "--y-min", "0.25", "--y-max", "2.5", *flags])
    assert stop.value.code == 2 and re_search(message, capsys.readouterr().err)


def re_search(pattern, text):
    import re

    return re.search(pattern, text) is not None


def test_the_lines_are_part_of_the_fingerprint_and_absent_when_none():
    from lpes_harness.search.fingerprint import fingerprint, mismatches

    settings = {"task": "multi_needle", "pretrained": None, "dtype": "float32", "population": 8}
    saved = fingerprint({**settings, "line_values": []})
    assert "lines" not in saved.get("search", {})  # older checkpoints resume
    assert mismatches(saved, fingerprint({**settings, "line_values": [(0.6, 1.4)]})) == [
        "search.lines: saved (absent), now [[0.6, 1.4]]"]


def test_the_demo_scores_its_rising_line_after_its_uniform_start():
    from pathlib import Path

    demo = parse_args(["--device", "cpu", "--config",
                       str(Path(__file__).resolve().parents[1] / "searches" / "configs" / "smollm2_demo.json")])
    assert demo.sweep_values == [0.8] and demo.line_values == [(0.6, 1.4)] and demo.initial == "random"


def test_a_budget_plans_the_lines_as_whole_evaluations_beside_the_draws():
    from lpes_harness.search.budget import RANDOM_DRAW_SAVING, BudgetTooSmall, plan

    common = dict(positions=5, search_samples=8, overhead_seconds=25, initial="random", chunk_size=4,
                  racing_saving=RANDOM_DRAW_SAVING["hardest"], heldout_share=0.79)
    two_points = plan(600, 1.0, sweep_points=2, **common)
    point_and_line = plan(600, 1.0, sweep_points=1, lines=1, **common)
    assert point_and_line.expected_individuals == two_points.expected_individuals  # the line costs a sweep point
    assert point_and_line.search_deadline_seconds == two_points.search_deadline_seconds
    # The start, the line and the draws: a valid random search whose draws are the population's rest.
    assert point_and_line.population == point_and_line.mutants + 1 and point_and_line.lines == 1
    SearchConfig(population=point_and_line.population, parents=1, mutants=point_and_line.mutants, crossovers=0,
                 generations=0, initial="random")
    assert "search of 1 sweep points + 1 line + random draws" in point_and_line.describe(5)
    # The smallest search counts its line among its 6 candidates: where the forwards hold 5 draws beside the
    # line it is a search, and the same forwards spent on a second sweep point hold 5 draws and no line.
    seconds = next(s / 100 for s in range(100, 200)
                   if plan(600, s / 100, sweep_points=1, lines=1, **common).expected_individuals == 5)
    with pytest.raises(BudgetTooSmall, match="give at least"):
        plan(600, seconds, sweep_points=2, **common)
