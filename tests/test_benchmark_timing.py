"""The latency benchmarks state a median and a 10-90 % spread of at least 10 interleaved repeats."""

import pytest
from conftest import load_benchmark as load


@pytest.mark.parametrize("name", ["overhead", "latency"])
def test_spread_is_the_median_and_the_10_and_90_percent_quantiles(name):
    spread = load(name).spread
    assert spread(list(range(11))) == {"median": 5, "p10": 1.0, "p90": 9.0}
    shuffled = spread([3.0, 1.0, 2.0, 5.0, 4.0, 10.0, 7.0, 6.0, 9.0, 8.0])
    assert shuffled["median"] == 5.5 and shuffled["p10"] == pytest.approx(1.9) and shuffled["p90"] == pytest.approx(9.1)


def test_fewer_than_ten_repeats_are_refused(monkeypatch, capsys):
    with pytest.raises(SystemExit):
        load("latency").main(["--repeats", "3"])
    assert "--repeats 3: give at least 10" in capsys.readouterr().err
    monkeypatch.setattr("sys.argv", ["overhead.py", "--repeats", "5"])
    with pytest.raises(SystemExit):
        load("overhead").parse_args()
    assert "--repeats 5: give at least 10" in capsys.readouterr().err


def test_batched_fitness_refuses_a_bad_batch_size(capsys):
    with pytest.raises(SystemExit):
        load("batched_fitness").parse_args(["--batch-size", "zero"])
    assert "--batch-size 'zero'" in capsys.readouterr().err


def test_latency_times_every_method_of_the_table_by_its_label():
    """Each method the table runs with position scaling or none has a row, named as the leaderboard reads it."""
    from lpes_harness.evaluation.leaderboard import latency_label
    from lpes_harness.methods import METHODS

    latency = load("latency")
    timed = {m.label for m in METHODS.values()} | {latency_label("PI", scaling) for scaling in ("base", "both")}
    assert timed == set(latency.METHODS) - {"vanilla"}
    assert {"LPES base", "LPES both", "PI base", "PI both"} <= timed
    assert latency.method_names("vanilla, poshidden,fitm,STRING") == [
        "vanilla", "Positional hidden-state scaling", "Found in the Middle", "STRING"]


def test_a_method_that_refuses_the_model_is_left_out_with_its_reason(tmp_path):
    """MoICE refuses Gemma-3: the run times the others and its --json names the refusal."""
    import json

    from tiny_models import tiny_gemma3, tiny_tokenizer

    tiny_gemma3().save_pretrained(tmp_path / "gemma3")
    tiny_tokenizer().save_pretrained(tmp_path / "gemma3")
    out = tmp_path / "latency.json"
    assert load("latency").main(["--pretrained", str(tmp_path / "gemma3"), "--samples", "1", "--num-docs", "1",
                                 "--repeats", "10", "--new-tokens", "1", "--methods", "vanilla,LPES base,MoICE",
                                 "--json", str(out)]) == 0
    written = json.loads(out.read_text())
    assert set(written["summary"]) == {"vanilla", "LPES base"} and "gemma3" in written["refused"]["MoICE"]
    assert written["dtype"] == "float32"


def test_a_setting_is_timed_under_its_own_name_and_bad_ones_are_refused_before_the_model_loads(tmp_path, capsys):
    """--setting METHOD:ARGS times the method as a row ran it (here Buckets with 2 bases instead of 7); the
    --json file says what it ran, for the leaderboard."""
    import json

    from tiny_models import tiny_model, tiny_tokenizer

    latency = load("latency")
    assert latency.parse_setting("fitm:spans_per_copy=10,strength=0.5") == (
        "Found in the Middle (spans_per_copy=10,strength=0.5)", "Found in the Middle",
        {"spans_per_copy": 10, "strength": 0.5})
    for bad in ("fitm", "LPES:scales=2", "nothing:a=1", "buckets:"):
        with pytest.raises(SystemExit):
            latency.main(["--pretrained", "no-such-model", "--setting", bad])
        assert f"--setting {bad!r}: give METHOD:KEY=VALUE" in capsys.readouterr().err
    # A misspelt name, and a value the method's own check refuses: named before the model loads (no such model
    # here), not a TypeError at install, nor "refuses this model".
    for bad, says in (("buckets:basis=1.0;2.0", "--setting 'Buckets': Buckets takes no basis; its arguments: bases"),
                      ("poshidden:factr=0", "takes no factr; its arguments: setting, channels, factor, layers"),
                      ("string:shifted_offset=32,local_window=64", "shifted_offset=32 is below local_window=64"),
                      ("mspoe:min_ratio=x", "--setting 'Ms-PoE': mspoe_hf: min_ratio='x' is not a number"),
                      ("fitm:spans_per_copy=0",
                       "--setting 'Found in the Middle': fitm_hf: spans_per_copy=0 is out of range")):
        with pytest.raises(SystemExit):
            latency.main(["--pretrained", "no-such-model", "--setting", bad])
        assert says in capsys.readouterr().err
    tiny_model("llama").save_pretrained(tmp_path / "llama")
    tiny_tokenizer().save_pretrained(tmp_path / "llama")
    out = tmp_path / "latency.json"
    assert latency.main(["--pretrained", str(tmp_path / "llama"), "--samples", "1", "--num-docs", "1", "--repeats", "10",
                         "--new-tokens", "1", "--methods", "vanilla,Buckets", "--setting", "buckets:bases=1.0;2.0",
                         "--json", str(out)]) == 0
    written = json.loads(out.read_text())
    assert set(written["summary"]) == {"vanilla", "Buckets", "Buckets (bases=1.0;2.0)"}
    assert written["settings"] == {"Buckets (bases=1.0;2.0)": {"method": "Buckets", "args": "bases=1.0;2.0"}}


def test_every_timed_method_runs_and_leaves_the_model_as_it_was():
    """latency.py's install / next_logits / remove on a tiny model: each method changes the next-token
    logits (else it timed the plain model) and its removal gives vanilla's back."""
    import torch
    from tiny_models import random_ids, tiny_model, tiny_tokenizer

    latency = load("latency")
    model, ids = tiny_model("llama"), random_ids(160)
    settings = ("fitm:spans_per_copy=10", "buckets:bases=1.0;2.0", "string:shifted_offset=64,local_window=16")
    methods = latency.make_methods(model, tiny_tokenizer(), [1.0, 1.5, 2.0, 2.5], None, None, string_offset=128,
                                   settings=settings)
    named = [latency.parse_setting(text)[0] for text in settings]
    assert set(methods) == set(latency.METHODS) | set(named)

    def next_logits(name):
        from transformers import DynamicCache

        install, remove, step = methods[name]
        install()
        try:
            with torch.no_grad():
                return step(ids, torch.ones_like(ids), torch.arange(ids.shape[1])[None], DynamicCache(config=model.config))
        finally:
            remove()

    plain = next_logits("vanilla")
    for name in (*latency.METHODS[1:], *named):
        assert not torch.allclose(next_logits(name), plain), f"{name} timed the plain model"
        assert torch.equal(next_logits("vanilla"), plain), f"{name} was not removed"
    for name, label in zip(named, ("Found in the Middle", "Buckets", "STRING")):  # not its method at its defaults
        assert not torch.allclose(next_logits(name), next_logits(label)), f"{name} timed {label} at its defaults"


def test_string_blocks_times_three_ways_and_finds_one_block_and_blocks_agree(tmp_path, capsys, monkeypatch):
    """On a tiny Gemma-3 with blocks of 16 queries: more than one block, keys shifted (S = 16 < the prompt)."""
    from tiny_models import tiny_gemma3, tiny_tokenizer

    from lpes_harness.methods import string_shift

    tiny_gemma3().save_pretrained(tmp_path / "gemma3")
    tiny_tokenizer().save_pretrained(tmp_path / "gemma3")
    monkeypatch.setattr(string_shift, "QUERY_BLOCK", 16)
    assert load("string_blocks").main(["--pretrained", str(tmp_path / "gemma3"), "--num-docs", "1", "--repeats", "10",
                                       "--shifted-offset", "16", "--local-window", "4"]) == 0
    captured = capsys.readouterr()
    difference = float(captured.err.split("one block against blocks: ")[1].split()[0])
    assert difference < 1e-4 and "blocks of 16 queries" in captured.err
    rows = [line for line in captured.out.splitlines() if line.startswith("| STRING") or line.startswith("| plain")]
    assert [row.split(" | ")[0] for row in rows] == ["| plain model", "| STRING, one block", "| STRING, blocks"]
    assert string_shift.QUERY_BLOCK == 16
