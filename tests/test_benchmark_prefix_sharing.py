"""benchmarks/prefix_sharing.py: a held-out sample's five prompts, each alone and sharing their text, side by side."""

import json

import pytest
from conftest import load_benchmark as load


def test_refuses_no_samples(capsys):
    with pytest.raises(SystemExit):
        load("prefix_sharing").parse_args(["--samples", "0"])
    assert "--samples and --repeats must be at least 1" in capsys.readouterr().err


def test_both_paths_agree_and_sharing_runs_fewer_tokens(tmp_path, capsys, tiny_model_with_the_bundled_tokenizer):
    # multi_needle's held-out prompts tokenized as SmolLM2 does, on a tiny model, through a per-layer curve
    # (the scaled rotary path on cached tokens too)
    out = tmp_path / "bench.json"
    assert load("prefix_sharing").main(["--pretrained", tiny_model_with_the_bundled_tokenizer, "--scales", "0.7;1.6",
                                        "--samples", "1", "--repeats", "1", "--json", str(out)]) == 0
    found = json.loads(out.read_text())
    assert found["agreement"] == {"is_greedy_same": 5, "prompts": 5, "max_abs_dlogprob": found["agreement"]["max_abs_dlogprob"]}
    assert found["agreement"]["max_abs_dlogprob"] < 1e-4  # float32
    assert found["methods"]["shared"]["tokens"] < 0.8 * found["methods"]["each alone"]["tokens"]
    assert found["scales"] == "0.7;1.6" and "shared / each alone" in capsys.readouterr().out
