"""The register-a-position-task recipe, end to end on its worked example (needle in a haystack).

Two stand-in readers replace a model so the test is fast and its outcome is known: one reads
the whole prompt, one only its first 60 %. Through lm-eval, the second must score 1 where the
needle sits early and 0 where it sits late: scores really are per gold position.
"""

import re

import lm_eval
from lm_eval.api.model import LM
from lm_eval.tasks import TaskManager

from lpes_harness.lmeval.tasks import build_group, position_scores, write_task_yaml
from lpes_harness.tasks import TASKS_DIR
from lpes_harness.tasks.needle import NEEDLE

NEEDLE_PATTERN = re.compile(r"special magic number for \w+ is (\d+)")


class PrefixReader(LM):
    """Answers with the magic number if it occurs in the first ``fraction`` of the prompt."""

    def __init__(self, fraction):
        super().__init__()
        self.fraction = fraction

    def generate_until(self, requests, disable_tqdm=False):
        answers = []
        for request in requests:
            context = request.arguments[0]
            found = NEEDLE_PATTERN.search(context[: int(len(context) * self.fraction)])
            answers.append(f" {found.group(1)}." if found else " I do not know.")
        return answers

    def loglikelihood(self, requests, disable_tqdm=False):
        raise NotImplementedError

    def loglikelihood_rolling(self, requests, disable_tqdm=False):
        raise NotImplementedError


METADATA = {"split": "search", "num_samples": 6, "num_sentences": 30}


def evaluate(reader, tasks, manager=None):
    # An empty TaskManager: without one, lm-eval indexes its thousands of built-in tasks (seconds).
    manager = manager or TaskManager(include_path=None, include_defaults=False)
    return lm_eval.simple_evaluate(model=reader, tasks=tasks, task_manager=manager)


def test_python_api_group_scores_each_position():
    group = build_group(NEEDLE, METADATA)
    assert group.name == "needle"

    perfect = evaluate(PrefixReader(1.0), [group])
    assert position_scores(perfect, NEEDLE) == {0: 1.0, 25: 1.0, 50: 1.0, 75: 1.0, 100: 1.0}

    early_only = position_scores(evaluate(PrefixReader(0.6), [build_group(NEEDLE, METADATA)]), NEEDLE)
    assert early_only[0] == early_only[25] == 1.0
    assert early_only[75] == early_only[100] == 0.0


def test_yaml_written_by_the_recipe_runs_through_lm_eval_and_agrees_with_the_python_api(tmp_path):
    write_task_yaml(NEEDLE, tmp_path, "lpes_harness.tasks.needle:NEEDLE")
    manager = TaskManager(include_path=str(tmp_path), include_defaults=False, metadata=METADATA)
    from_yaml = evaluate(PrefixReader(0.6), ["needle"], manager)
    from_python = evaluate(PrefixReader(0.6), [build_group(NEEDLE, METADATA)])
    assert position_scores(from_yaml, NEEDLE) == position_scores(from_python, NEEDLE)
    assert from_yaml["results"]["needle"]["acc,none"] == sum(position_scores(from_yaml, NEEDLE).values()) / 5


def test_needle_is_also_shipped_in_tasks_dir():
    assert (TASKS_DIR / "needle" / "needle.yaml").is_file()
