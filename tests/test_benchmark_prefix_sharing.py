"""benchmarks/prefix_sharing.py: a held-out sample's five prompts, each alone and sharing their text, side by side."""

import json

import pytest
from conftest import load_benchmark as load


def test_refuses_no_samples(capsys):
    with pytest.raises(SystemExit):
        load("prefix_sharing").parse_args(["--samples", "0"])
    assert "--samples and --repeats must be at least 1" in capsys.readouterr().err


@pytest.mark.slow
def test_both_paths_agree_and_sharing_runs_fewer_tokens_on_the_bundled_model(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert load("prefix_sharing").main(["--samples", "1", "--repeats", "1", "--json", str(out)]) == 0
    found = json.loads(out.read_text())
    assert found["agreement"] == {"is_greedy_same": 5, "prompts": 5, "max_abs_dlogprob": found["agreement"]["max_abs_dlogprob"]}
    assert found["agreement"]["max_abs_dlogprob"] < 1e-4  # float32
    assert found["methods"]["shared"]["tokens"] < 0.8 * found["methods"]["each alone"]["tokens"]
    assert "shared / each alone" in capsys.readouterr().out
