"""One position task's samples scored one by one, through lm-eval's own task objects.

:class:`PositionScorer` builds each sample's prompt exactly as ``lm_eval`` does and scores it
with the current model; the search's fitness, the held-out tables of ``analysis/`` and
``lpes-check`` all score through it, so a sample means the same thing everywhere.

Four ways to score a sample (``mode``):

- ``greedy`` (default, one pass): one forward over prompt + gold answer; the sample is
  correct iff every gold token is the argmax (lm-eval's ``is_greedy``), i.e. greedy
  decoding would write the gold answer. With several gold answers (MDQA), any one suffices.
- ``generate``: the paper's path: lm-eval ``generate_until`` and the task's own metric.
- ``logprob``: the mean log-probability of the gold answer's tokens (a continuous,
  less noisy signal; ≤ 0).
- ``tiebreak``: greedy accuracy, with ties broken by confidence: a sample scores
  ``is_greedy + TIEBREAK_EPS * p``, ``p`` the geometric-mean probability of its gold tokens.
  ``TIEBREAK_EPS`` is so small that one sample more or less right always outweighs any
  confidence difference (the search's ``FitnessConfig`` checks it for the weights and sample
  counts given), so the order by accuracy is kept; among curves with the same accuracy, the
  surer one wins.

The one-pass modes have two interchangeable scorers (``scorer``): ``answer-logits``
(default, :mod:`lpes_harness.lmeval.answer_logits`: each prompt runs once for all its answers,
the output layer only at the answer positions) and ``lm-eval`` (the model's own lm-eval
``loglikelihood``, what ``lm_eval --model ...`` runs: one row per answer, for ``lpes_hf`` HFLM's
full-vocabulary logits at every position). They score the same tokens;
``tests/test_search_scoring.py`` checks they agree.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

MODES = ("greedy", "generate", "logprob", "tiebreak")
SCORERS = ("answer-logits", "lm-eval")
# The weight of confidence in ``tiebreak``: far below the smallest accuracy step of any search
# we size (λ_r / samples of role r; the gpu profile's pooled middle: 0.3 / 300 = 1e-3), so
# accuracy always decides first. The search's FitnessConfig refuses settings where it would not.
TIEBREAK_EPS = 1e-5


def max_sample_score(mode: str) -> float:
    """The most one sample can add: accuracy 1, log-probability 0, or 1 + the tie-break at certainty."""
    return {"logprob": 0.0, "tiebreak": 1.0 + TIEBREAK_EPS}.get(mode, 1.0)


class PositionScorer:
    """Per-sample scores of one position task's samples, through lm-eval's task objects.

    Loads the subtasks of ``percents`` (one lm-eval task each) for ``split`` and scores any
    of their samples with the current model (``lm``, an lpes_hf whose scales may change in
    between): ``scores(percent, indices)`` returns one number per sample, in ``mode``.
    The prompt is exactly what ``lm_eval`` builds (``fewshot_context``: the task's answer
    prefix, and the chat template when ``chat_template``).
    """

    def __init__(self, lm, task: str, percents, *, metadata=None, split="search", num_samples=200,
                 mode="greedy", scorer="answer-logits", chat_template=None, task_manager=None, batch_size=1):
        from lm_eval.tasks import TaskManager

        from lpes_harness.tasks import TASKS_DIR
        from lpes_harness.tasks.position import resolve_task

        self.lm, self.mode, self.scorer, self.batch_size = lm, mode, scorer, batch_size
        position_task = resolve_task(task)
        if chat_template is None:
            chat_template = position_task.chat_template and has_chat_template(lm)
        self.chat_template = bool(chat_template)
        metadata = {**(metadata or {}), "split": split, "num_samples": num_samples}
        # Our task folder alone: every position task's YAML is there, and indexing lm-eval's ~14,000
        # task files as well costs 10-20 s each time a search, a held-out table or a tuning starts.
        self.task_manager = task_manager or TaskManager(include_path=str(TASKS_DIR), include_defaults=False,
                                                        metadata=metadata)
        names = {percent: position_task.subtask_name(percent) for percent in sorted(set(percents))}
        unknown = [name for name in names.values() if name not in self.task_manager.all_tasks]
        if unknown:
            raise ValueError(f"unknown position subtask(s) {unknown}; is the task name {task!r} right?")
        # TaskManager.load returns every leaf task in a flat {name: task} dict.
        task_dict = self.task_manager.load(sorted(names.values()))["tasks"]
        self.tasks = {percent: task_dict[name] for percent, name in names.items()}
        self.docs = {percent: list(t.eval_docs) for percent, t in self.tasks.items()}

    def prompt(self, task, doc) -> str:
        """The context lm-eval gives the model for ``doc`` (zero-shot)."""
        return task.fewshot_context(
            doc,
            num_fewshot=0,
            apply_chat_template=self.chat_template,
            chat_template=self.lm.apply_chat_template if self.chat_template else None,
            gen_prefix=task.doc_to_prefix(doc),
        )

    def scores(self, percent: int, indices: Sequence[int]) -> list[float]:
        return self.scores_at({percent: indices})[percent]

    def scores_at(self, requests: Mapping[int, Sequence[int]]) -> dict[int, list[float]]:
        """``{percent: indices}`` -> ``{percent: scores}``, every position's samples in one call.

        A sample's prompts at the different gold positions are the same text but where the gold
        item sits, so in the one-pass modes they go to the scorer together, which runs the text
        they share once (:func:`lpes_harness.lmeval.answer_logits.score_answers`).
        """
        requests = {percent: list(indices) for percent, indices in requests.items()}
        docs = {percent: [self.docs[percent][i] for i in indices] for percent, indices in requests.items()}
        if self.mode == "generate":
            return {percent: self._score_generate(self.tasks[percent], docs[percent]) if docs[percent] else []
                    for percent in requests}
        return self._score_loglikelihood(docs)

    def generate(self, task, docs) -> list[str]:
        """The model's answers to ``docs`` of ``task``: lm-eval ``generate_until`` on these prompts."""
        from lpes_harness.lmeval.requests import generate_requests

        requests = generate_requests([(doc, self.prompt(task, doc)) for doc in docs], task.config.generation_kwargs)
        return list(self.lm.generate_until(requests, disable_tqdm=True))

    def _score_generate(self, task, docs) -> list[float]:
        scores = []
        for doc, output in zip(docs, self.generate(task, docs)):
            metrics = task.process_results(doc, [output])
            scores.append(float(next(iter(metrics.values()))))
        return scores

    def answer_pairs(self, task, docs) -> tuple[list[tuple[str, str]], list[int]]:
        """The one-pass modes' ``(context, continuation)`` pairs, one per gold answer, and the doc of each."""
        delimiter = task.config.target_delimiter
        pairs, owner = [], []
        for i, doc in enumerate(docs):
            context = self.prompt(task, doc)
            for answer in gold_answers(task, doc):
                pairs.append((context, delimiter + answer))
                owner.append(i)
        return pairs, owner

    def _score_loglikelihood(self, docs: Mapping[int, list]) -> dict[int, list[float]]:
        pairs, owner = [], []
        for percent, percent_docs in docs.items():
            percent_pairs, percent_owner = self.answer_pairs(self.tasks[percent], percent_docs)
            pairs += percent_pairs
            owner += [(percent, i) for i in percent_owner]
        results = self._one_pass(pairs) if pairs else []
        correct = {p: [0.0] * len(d) for p, d in docs.items()}  # greedy: any gold answer is what greedy decoding writes
        logprob = {p: [-math.inf] * len(d) for p, d in docs.items()}  # mean per gold token, best over the gold answers
        for (percent, i), result in zip(owner, results):
            correct[percent][i] = max(correct[percent][i], 1.0 if result.is_greedy else 0.0)
            logprob[percent][i] = max(logprob[percent][i], result.logprob / result.num_tokens)
        if self.mode == "greedy":
            return correct
        if self.mode == "tiebreak":  # accuracy first, then the (geometric-mean) gold-token probability
            return {p: [c + TIEBREAK_EPS * math.exp(lp) for c, lp in zip(correct[p], logprob[p])] for p in docs}
        return logprob

    def _one_pass(self, pairs):
        from lpes_harness.lmeval.answer_logits import AnswerScore, score_answers

        if self.scorer == "answer-logits":
            return score_answers(self.lm, pairs, batch_size=self.batch_size)
        from lpes_harness.lmeval.requests import answer_token_count, loglikelihood_requests

        results = self.lm.loglikelihood(loglikelihood_requests(pairs), disable_tqdm=True)
        return [
            AnswerScore(logprob, is_greedy, answer_token_count(self.lm, *pair))
            for pair, (logprob, is_greedy) in zip(pairs, results)
        ]


def has_chat_template(lm) -> bool:
    tokenizer = getattr(lm, "tokenizer", None)
    return bool(getattr(tokenizer, "chat_template", None))


def gold_answers(task, doc) -> list[str]:
    """Every acceptable answer of a doc, as greedy decoding may write it.

    A position task's ``greedy_answers`` (its answers plus other written forms, e.g. a KV
    value in quotes), else its ``answers`` (MDQA has several), else the task's target.
    """
    if isinstance(doc, Mapping):
        for key in ("greedy_answers", "answers"):
            if doc.get(key):
                return [str(a) for a in doc[key]]
    return [str(task.doc_to_target(doc))]
