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
