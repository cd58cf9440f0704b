"""The validity check tells a task that measures retrieval from one a model passes by copying."""

import json
import re

import pytest
from lm_eval.api.model import LM
from tiny_models import save_tiny_checkpoint

from lpes_harness.evaluation.validity import check_task, format_report

NUMBER = re.compile(r"special magic number for (\w+) is (\d+)")


class Reader(LM):
    """Answers the asked city's number if it is in the context (a model that retrieves)."""

    tokenizer = None

    def generate_until(self, requests, disable_tqdm=False):
        out = []
        for request in requests:
            context = request.arguments[0]
            city = re.search(r"number for (\w+)\?", context).group(1)
            found = dict(NUMBER.findall(context.split("\n\nWhat is")[0]))
            out.append(f" {found.get(city, 'unknown')}.")
        return out

    def loglikelihood(self, requests, disable_tqdm=False):
        raise NotImplementedError

    def loglikelihood_rolling(self, requests, disable_tqdm=False):
        raise NotImplementedError


class Copier(Reader):
    """Answers the first number of the context, whatever was asked (a model that copies)."""

    def generate_until(self, requests, disable_tqdm=False):
        return [f" {NUMBER.search(r.arguments[0]).group(2)}." for r in requests]


def test_a_reader_measures_retrieval():
    result = check_task(Reader(), "multi_needle", num_samples=6, metadata={"num_sentences": 20})
    assert all(cell["accuracy"] == 1.0 for cell in result["by_position"].values())
    assert result["gold_removed"]["accuracy"] == 0.0
    assert result["verdict"].startswith("measures retrieval")
    assert "gold removed" in format_report(result)


def test_a_copier_is_caught_by_the_copying_control():
    result = check_task(Copier(), "multi_needle", num_samples=6, metadata={"num_sentences": 20})
    assert result["by_position"]["0"]["accuracy"] == 1.0 and result["by_position"]["50"]["accuracy"] == 0.0
    fixed = result["wrong_answers"]["fixed_place"]  # the first needle, a distractor at every other position
    assert (fixed["side"], fixed["rank"], fixed["share"]) == ("first", 0, 1.0) and "copying" in result["verdict"]
    assert result["verdict"].startswith("does NOT measure retrieval")


class LastCopier(Reader):
    """Answers the last number of the context, whatever was asked (a recency bias at its extreme)."""

    def generate_until(self, requests, disable_tqdm=False):
        return [f" {NUMBER.findall(r.arguments[0])[-1][1]}." for r in requests]


def test_the_side_of_the_gold_item_the_wrong_answers_name_tells_recency_from_primacy():
    first = check_task(Copier(), "multi_needle", num_samples=4, metadata={"num_sentences": 20})["wrong_answers"]
    last_result = check_task(LastCopier(), "multi_needle", num_samples=4, metadata={"num_sentences": 20})
    last = last_result["wrong_answers"]
    assert first["middle_wrong"] == last["middle_wrong"] == 12  # 25, 50, 75 %: 4 samples each, all wrong
    assert (first["middle_other_item_before"], first["middle_other_item_after"]) == (12, 0)
    assert (last["middle_other_item_before"], last["middle_other_item_after"]) == (0, 12)
    assert "12 after the gold item, 0 before it" in format_report(last_result)


class RarelyRight(Reader):
    """Retrieves on its first request only: above the gold-removed 0, but at the floor (mdqa on SmolLM2)."""

    answered = 0

    def generate_until(self, requests, disable_tqdm=False):
        answers = super().generate_until(requests, disable_tqdm)
        out = [a if self.answered == 0 and i == 0 else " 0." for i, a in enumerate(answers)]
        self.answered += len(requests)
        return out


def test_a_task_at_the_floor_is_not_called_valid():
    result = check_task(RarelyRight(), "multi_needle", num_samples=6, metadata={"num_sentences": 20})
    assert result["average"]["accuracy"] == pytest.approx(1 / 30) and result["gold_removed"]["accuracy"] == 0.0
    assert result["verdict"].startswith("does NOT measure retrieval") and "not clearly better" in result["verdict"]
    # the reader, right everywhere, is still valid under the same rule (see above); the copier fails it too
    assert "not clearly better" not in check_task(Reader(), "multi_needle", num_samples=6,
                                                  metadata={"num_sentences": 20})["verdict"]


def test_check_runs_on_a_tiny_model(tmp_path):
    from lpes_harness.lmeval.lpes_lm import LPESLM

    lm = LPESLM(pretrained=save_tiny_checkpoint(tmp_path, "llama"), device="cpu")
    result = check_task(lm, "needle", num_samples=2, metadata={"num_sentences": 4})
    assert result["num_samples"] == 2 and set(result["by_position"]) == {"0", "25", "50", "75", "100"}
    assert len(result["gold_removed_answers"]) == 2


def test_calibration_grid_on_a_tiny_model(tmp_path, monkeypatch):
    """`lpes-check --grid`: one row per setting, one result file each, and a rerun reads them back."""
    from lpes_harness.commands import check as check_command

    checkpoint = str(save_tiny_checkpoint(tmp_path, "llama"))
    out = tmp_path / "calibration"
    argv = ["--task", "needle", "--pretrained", checkpoint, "--num-samples", "2", "--out", str(out),
            "--grid", '{"num_sentences": [4, 8]}']
    check_command.main(argv)
    rows = [line for line in (out / "calibration.md").read_text().splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert [row.split(" | ")[0] for row in rows] == ["| 4", "| 8"]
    tokens = [json.loads((out / f"num_sentences-{n}.json").read_text())["prompt_tokens"] for n in (4, 8)]
    assert tokens[0] < tokens[1]

    def must_not_run(*args, **kwargs):
        raise AssertionError("a setting with a result in --out was checked again")

    monkeypatch.setattr(check_command, "check_task", must_not_run)
    check_command.main(argv)  # resumed: both settings read back
    with pytest.raises(AssertionError, match="checked again"):
        check_command.main(argv[:-1] + ['{"num_sentences": [4, 12]}'])  # a new setting runs


@pytest.mark.parametrize("grid, message", [
    ("{not json", "--grid is not valid JSON"),
    ('{"num_sentences": 4}', "must map to a non-empty list"),
    ('{"num_sentence": [4]}', "did you mean 'num_sentences'"),
])
def test_a_bad_grid_stops_before_the_model_loads(grid, message, capsys):
    from lpes_harness.commands import check as check_command

    with pytest.raises(SystemExit) as stopped:
        # A model that is not there (an id in no cache, offline): a load would fail on it, not on the grid.
        check_command.main(["--task", "needle", "--pretrained", "lpes-test-no-such-org/no-such-model", "--grid", grid])
    assert stopped.value.code == 2 and message in capsys.readouterr().err
