"""benchmarks/race_every_item.py: a race prompt's questions, each its own forward and sharing the text, side by side."""

import json

import pytest
from conftest import load_benchmark as load


def test_refuses_no_repeats(capsys):
    with pytest.raises(SystemExit):
        load("race_every_item").parse_args(["--repeats", "0"])
    assert "--samples and --repeats must be at least 1" in capsys.readouterr().err


def test_shared_agrees_with_each_question_alone(tmp_path, capsys, tiny_model_with_the_bundled_tokenizer):
    # multi_needle's search prompts tokenized as SmolLM2 does, on a tiny model, through a per-layer curve
    # (the scaled rotary path on cached tokens too), in float32
    out = tmp_path / "bench.json"
    assert load("race_every_item").main(["--pretrained", tiny_model_with_the_bundled_tokenizer, "--scales", "0.7;1.6",
                                         "--dtype", "float32", "--samples", "1", "--repeats", "1",
                                         "--json", str(out)]) == 0
    found = json.loads(out.read_text())
    assert found["questions"] == 8  # the prompt asked about each of its 8 needles
    assert found["max_abs_gold_logprob_difference"] < 1e-4
    assert set(found["methods"]) == {"each alone", "shared", "prefix, every logit", "prefix, last logit"}
    assert "the shared text's forward with every logit / with the last" in capsys.readouterr().out
