"""What our lm-eval models override of HFLM: its internals, and ``loglikelihood`` with logits only at the answers."""

from __future__ import annotations

import torch

# HFLM's loglikelihood batches are right-padded by lm_eval.models.utils_hf.pad_and_concat,
# which pads with torch.zeros: token id 0 (checked by lmeval.contract).
LOGLIKELIHOOD_PAD_ID = 0


class RightPaddedRowsMixin:
    """Each row's real length and answer start in HFLM's right-padded ``loglikelihood`` batches.

    HFLM scores a ``(context, continuation)`` pair with one forward over
    ``(context + continuation)[-(max_length + 1):][:-1]``, right-padded with token
    :data:`LOGLIKELIHOOD_PAD_ID`, with no attention mask, and reads the continuation's
    log-probabilities at the row's last ``len(continuation)`` positions. A causal model does not
    care about the padding, but a method that looks at a sample's *last* token (Ms-PoE's head
    statistic) or changes only the queries predicting the answer (positional hidden-state scaling,
    Found-in-the-Middle: the first of those positions, the prompt's last token as in generation)
    does. We record every row HFLM will build with its answer start, then match each padded row
    against them: the longest recorded row that it starts with, followed only by padding, is that
    row's real content.
    """

    # row length -> row tokens -> the first answer-predicting column(s) of the requests with that row
    _expected_rows: dict[int, dict[tuple[int, ...], set[int]]] | None = None

    def _loglikelihood_tokens(self, requests, *args, **kwargs):
        expected: dict[int, dict[tuple[int, ...], set[int]]] = {}
        for _, context_enc, continuation_enc in requests:
            row = (list(context_enc) + list(continuation_enc))[-(self.max_length + 1) :][:-1]
            start = max(len(row) - len(continuation_enc), 0)
            expected.setdefault(len(row), {}).setdefault(tuple(row), set()).add(start)
        self._expected_rows = expected
        try:
            return super()._loglikelihood_tokens(requests, *args, **kwargs)
        finally:
            self._expected_rows = None

    def _matched_rows(self, inps: torch.Tensor) -> list[tuple[int, int]] | None:
        """``(real length, answer start)`` of each row; None outside ``loglikelihood``.

        A row that is no request's (HFLM's ``batch_size=auto`` probe, a batch of ones) is all real
        and gets its last column, what a bare forward changes. Two requests whose rows are the same
        tokens but split differently into context and continuation (lm-eval never builds them from
        one task) share the earlier start.
        """
        expected = self._expected_rows
        if not expected:
            return None
        width = inps.shape[1]
        lengths = sorted((n for n in expected if n <= width), reverse=True)
        matched = []
        for row in inps.tolist():
            found = (width, width - 1)
            for n in lengths:
                if all(t == LOGLIKELIHOOD_PAD_ID for t in row[n:]) and tuple(row[:n]) in expected[n]:
                    found = (n, min(expected[n][tuple(row[:n])]))
                    break
            matched.append(found)
        return matched

    def _last_real_index(self, inps: torch.Tensor) -> torch.Tensor | None:
        """``(B,)`` index of each row's last real token; None outside ``loglikelihood``."""
        matched = self._matched_rows(inps)
        if matched is None:
            return None
        return torch.tensor([n - 1 for n, _ in matched], dtype=torch.long, device=inps.device)

    def _answer_starts(self, inps: torch.Tensor) -> torch.Tensor | None:
        """``(B,)`` first answer-predicting column of each row; None outside ``loglikelihood``."""
        matched = self._matched_rows(inps)
        if matched is None:
            return None
        return torch.tensor([start for _, start in matched], dtype=torch.long, device=inps.device)


class AnswerLogitsLoglikelihoodMixin:
    """lm-eval's ``loglikelihood``, with the logits computed only at the answer tokens.

    HFLM's ``loglikelihood`` runs the output layer (and a log-softmax) over the whole vocabulary
    at every position of every row, then keeps the answer's few. A subclass implements
    ``answer_logits(input_ids, rows, columns)`` (the logits ``(n, V)`` at those positions of
    the right-padded batch ``input_ids``) and gets the same ``(log-prob, is_greedy)`` pairs
    (:func:`lpes_harness.lmeval.answer_logits.score_token_pairs`): the same tokenisation, left
    truncation and ``batch_size``, results in the order of the requests, each handed to the
    cache hook as HFLM does. ``loglikelihood_rolling`` keeps HFLM's path.
    """

    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        from lpes_harness.lmeval.answer_logits import score_token_pairs
        from lpes_harness.lmeval.requests import loglikelihood_tokens

        if getattr(self, "enable_thinking", False):
            return super().loglikelihood(requests, disable_tqdm=disable_tqdm)  # HFLM refuses it, by name
        from tqdm import tqdm

        pairs = [tuple(request.args) for request in requests]
        encoded = [loglikelihood_tokens(self, context, continuation) for context, continuation in pairs]
        # HFLM's bar, under HFLM's name: a long MMLU run shows its progress as it did before
        with tqdm(total=len(pairs), desc="Running loglikelihood requests", disable=disable_tqdm or self.rank != 0) as bar:
            scores = score_token_pairs(self, encoded, self.batch_size, self.answer_logits, done=bar.update)
        results = [(score.logprob, score.is_greedy) for score in scores]
        for pair, result in zip(pairs, results):
            self.cache_hook.add_partial("loglikelihood", pair, result)
        return results
