"""`python -m lpes_harness.commands.transfer`: curves on conditions no search saw, one table."""

import json

import pytest
from tiny_models import save_tiny_checkpoint

from lpes_harness.evaluation import transfer
from lpes_harness.evaluation.conditions import parse_condition
from lpes_harness.commands import transfer as transfer_command


def test_a_condition_is_a_name_and_task_options():
    assert parse_condition('2x length={"num_sentences": 120}') == ("2x length", {"num_sentences": 120})
    for bad, message in [("nothing", "expected NAME="), ("x={oops", "not valid JSON"), ("x=[1]", "JSON object"), ("x=\"str\"", "JSON object"),
                         ('x={"chat_template": "maybe"}', "on, off or auto")]:
        with pytest.raises(ValueError, match=message):
            parse_condition(bad)


def test_the_condition_becomes_a_paired_command_line(tmp_path):
    argv = transfer.paired_argv({"task": "needle", "chat_template": "off", "num_sentences": 10}, ["a=s.json"],
                                num_samples=5, seed=7, dtype="bfloat16", pretrained=None, output=tmp_path)
    assert argv[argv.index("--task") + 1] == "needle" and argv[argv.index("--chat-template") + 1] == "off"
    assert json.loads(argv[argv.index("--metadata") + 1]) == {"num_sentences": 10, "seed": 7}
    assert "--no-pi" in argv and argv[argv.index("--scales") + 1] == "a=s.json"
    assert "--batch-size" not in argv  # paired's own default, one prompt a forward
    argv = transfer.paired_argv({"num_sentences": 10}, ["a=s.json"], num_samples=5, seed=None, dtype=None,
                                pretrained=None, output=tmp_path, batch_size="10")
    assert argv[argv.index("--batch-size") + 1] == "10" and "--baseline" not in argv
    argv = transfer.paired_argv({}, ["a=s.json"], num_samples=5, seed=None, dtype=None, pretrained=None,
                                output=tmp_path, baselines=["B=buckets_hf:bases=0.5;1.0", "mspoe_hf"])
    assert [argv[i + 1] for i, arg in enumerate(argv) if arg == "--baseline"] == ["B=buckets_hf:bases=0.5;1.0", "mspoe_hf"]


def heldout(vanilla, lpes):
    """A hand-made heldout.json: per-sample scores of two methods at two positions."""
    from lpes_harness.evaluation.paired_table import paired_table

    scored = {"task": "needle", "split": "heldout", "num_samples": 4, "mode": "generate", "chat_template": False,
              "metadata": {}, "methods": {"vanilla": [1.0], "LPES a": [1.5]},
              "scores": {"vanilla": vanilla, "LPES a": lpes}, "scales_files": {}, "dtype": "float32"}
    return {"table": paired_table(scored), "scored": scored}


def test_a_row_pairs_the_curve_with_vanilla_on_the_same_samples():
    row, = transfer.rows("2x", heldout({"0": [1, 1, 1, 1], "50": [0, 0, 0, 1]}, {"0": [1, 1, 1, 0], "50": [1, 1, 1, 1]}))
    assert (row["gained"], row["lost"], row["n"]) == (3, 1, 8) and row["difference"] == pytest.approx(0.25)
    assert row["difference_interval"][0] < 0.25 < row["difference_interval"][1]
    assert (row["worst_position"], row["worst_vanilla"], row["worst_method"]) == (50, 0.25, 1.0)
    assert "| 2x | LPES a | 8 |" in transfer.format_rows([row]) and "+25.0 [" in transfer.format_rows([row])


def test_transfer_runs_each_condition_on_a_tiny_model(tmp_path):
    checkpoint = save_tiny_checkpoint(tmp_path, "llama")
    scales = tmp_path / "s.json"
    scales.write_text(json.dumps([1.0, 1.5, 2.0, 2.0]))
    out = tmp_path / "transfer"
    transfer_command.main(["--scales", f"a={scales}", "--pretrained", str(checkpoint), "--num-samples", "1", "--seed", "3",
                   "--baseline", "Buckets=buckets_hf:bases=0.5;1.0",
                   "--condition", 'short={"task": "needle", "num_sentences": 4}',
                   "--condition", 'longer={"task": "needle", "num_sentences": 8}', "--output", str(out)])
    table = json.loads((out / "transfer.json").read_text())
    assert [(r["condition"], r["method"], r["n"]) for r in table] == [
        ("short", "LPES a", 5), ("short", "Buckets", 5), ("longer", "LPES a", 5), ("longer", "Buckets", 5)]
    assert table[2]["metadata"] == {"num_sentences": 8, "seed": 3}
    assert (out / "transfer.png").stat().st_size > 0 and (out / "longer" / "heldout.json").exists()
    pooled, buckets = json.loads((out / "pooled.json").read_text())["results"]
    assert (pooled["row"], pooled["against"], pooled["n"]) == ("LPES a", "vanilla", 10) and buckets["row"] == "Buckets"
    assert pooled["gained"] - pooled["lost"] == sum(round(r["difference"] * r["n"]) for r in table if r["method"] == "LPES a")


@pytest.mark.parametrize("baselines, message", [
    (["no_such_model"], "not a registered lm-eval model"),
    (["B=buckets_hf", "B=mspoe_hf"], "same name"),
])
def test_a_bad_baseline_stops_before_any_condition_is_scored(tmp_path, capsys, baselines, message):
    out = tmp_path / "transfer"
    with pytest.raises(SystemExit) as stopped:
        transfer_command.main(["--scales", "a=s.json", "--condition", 'fine={"num_sentences": 10}', "--output", str(out),
                       *[arg for spec in baselines for arg in ("--baseline", spec)]])
    assert stopped.value.code == 2 and message in capsys.readouterr().err and not out.exists()


@pytest.mark.parametrize("condition, message", [
    ('bad={"num_sentence": 120}', "did you mean 'num_sentences'"),
    ('bad={"task": "no_such_task"}', "unknown position task"),
    # The command scores the held-out split itself: a split here would be dropped without a word.
    ('bad={"split": "validation"}', "'split' is set by this command"),
    ('bad={"num_samples": 5}', "'num_samples' is set by this command"),
])
def test_a_bad_condition_stops_before_any_condition_is_scored(tmp_path, capsys, condition, message):
    out = tmp_path / "transfer"
    with pytest.raises(SystemExit) as stopped:
        transfer_command.main(["--scales", "a=s.json", "--condition", 'fine={"num_sentences": 10}', "--condition", condition,
                       "--output", str(out)])
    assert stopped.value.code == 2 and message in capsys.readouterr().err and not out.exists()


def test_a_bad_batch_size_is_refused_before_any_condition(capsys, tmp_path):
    with pytest.raises(SystemExit) as stop:
        transfer_command.main(["--scales", "a=s.json", "--condition", 'x={"num_sentences": 10}', "--batch-size", "0",
                       "--output", str(tmp_path / "out")])
    assert stop.value.code == 2 and "a positive integer or 'auto'" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
