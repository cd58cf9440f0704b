"""Where the answer starts in each row of HFLM's right-padded ``loglikelihood`` batches.

HFLM scores a ``(context, continuation)`` pair with one forward over
``(context + continuation)[-(max_length + 1):][:-1]``, right-padded with token
:data:`~lpes_harness.lmeval.hflm.LOGLIKELIHOOD_PAD_ID`, and reads the continuation's
log-probabilities at the row's last ``len(continuation)`` positions. A method that changes only
the queries predicting the answer (positional hidden-state scaling, Found-in-the-Middle) needs
the first of those positions, ``len(row) - len(continuation)``: the prompt's last token, as in
generation. :class:`AnswerStartsMixin` records every row HFLM will build with that position, then
finds each padded row of a batch among them, as :class:`~lpes_harness.lmeval.hflm.RightPaddingLengthsMixin`
finds lengths.
"""

from __future__ import annotations

import torch

from lpes_harness.lmeval.hflm import LOGLIKELIHOOD_PAD_ID


class AnswerStartsMixin:
    """``_answer_starts(inps)``: each row's first answer-predicting column, inside ``loglikelihood``."""

    # row length -> row tokens -> the first answer-predicting column(s) of the requests with that row
    _answer_start_rows: dict[int, dict[tuple[int, ...], set[int]]] | None = None

    def _loglikelihood_tokens(self, requests, *args, **kwargs):
        expected: dict[int, dict[tuple[int, ...], set[int]]] = {}
        for _, context_enc, continuation_enc in requests:
            row = (list(context_enc) + list(continuation_enc))[-(self.max_length + 1) :][:-1]
            start = max(len(row) - len(continuation_enc), 0)
            expected.setdefault(len(row), {}).setdefault(tuple(row), set()).add(start)
        self._answer_start_rows = expected
        try:
            return super()._loglikelihood_tokens(requests, *args, **kwargs)
        finally:
            self._answer_start_rows = None

    def _answer_starts(self, inps: torch.Tensor) -> torch.Tensor | None:
        """``(B,)`` first answer-predicting column of each row; None outside ``loglikelihood``.

        Two requests whose rows are the same tokens but split differently into context and
        continuation (lm-eval never builds them from one task) share the earlier start. A row
        that is no request's (HFLM's ``batch_size=auto`` probe, a batch of ones) gets its last
        column, what a bare forward changes.
        """
        expected = self._answer_start_rows
        if not expected:
            return None
        width = inps.shape[1]
        lengths = sorted((n for n in expected if n <= width), reverse=True)
        starts = []
        for row in inps.tolist():
            found = None
            for n in lengths:
                if all(t == LOGLIKELIHOOD_PAD_ID for t in row[n:]) and tuple(row[:n]) in expected[n]:
                    found = min(expected[n][tuple(row[:n])])
                    break
            starts.append(width - 1 if found is None else found)
        return torch.tensor(starts, dtype=torch.long, device=inps.device)
