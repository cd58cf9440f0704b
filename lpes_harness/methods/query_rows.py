"""Which queries a rival changes, and what the attention kernel it replaces lets each query see.

Positional hidden-state scaling and Found-in-the-Middle change the attention of the queries that
predict the answer only: the prompt's last token and every token after it. In a forward over a
whole sequence that is column ``query_start`` on (one per row, set by the lm-eval model for
``loglikelihood``, where the answer is teacher-forced after the prompt); without it, the last
column of a forward with an empty cache (a prompt, as ``generate`` sends it) and every column of
a forward on a filled cache (the decoding steps). So cached decoding and one forward over the
whole sequence with ``query_start`` at the prompt's last token are the same computation.
"""

from __future__ import annotations

import torch


def answer_rows(query_start: torch.Tensor | None, batch: int, q_len: int, past: int, device) -> torch.Tensor:
    """``(B, q_len)`` bool: the queries of this forward that predict answer tokens (see the module)."""
    if query_start is not None:
        if past:
            raise RuntimeError(
                "an explicit first answer position is for one forward over the whole sequence; this forward "
                f"continues a cache of {past} tokens"
            )
        columns = torch.arange(q_len, device=device)
        return columns[None, :] >= query_start.to(device)[:, None]
    rows = torch.ones(batch, q_len, dtype=torch.bool, device=device)
    if past == 0:
        rows[:, :-1] = False
    return rows


def first_answer_column(rows: torch.Tensor) -> int:
    """The first column where any row of ``rows (B, q_len)`` (from :func:`answer_rows`, with at least one
    True) has an answer query: the rivals compute their changed attention from there on only."""
    return int(rows.any(0).nonzero().min())


def visible_keys(attention_mask: torch.Tensor | None, q_len: int, kv_len: int, device) -> torch.Tensor:
    """``(B or 1, 1, q_len, kv_len)`` bool: which keys each query may attend to, from the mask the
    layer was handed (boolean for sdpa, additive 0 / large negative for eager), or the causal rule
    when it got none (sdpa's ``is_causal`` path: query row ``a`` sees keys ``<= a + kv_len - q_len``)."""
    if attention_mask is None:
        return (relative_distance(q_len, kv_len, device) >= 0)[None, None]
    mask = attention_mask if attention_mask.dim() == 4 else attention_mask[:, None]
    mask = mask[..., -q_len:, -kv_len:]
    return mask if mask.dtype == torch.bool else mask == 0


def relative_distance(q_len: int, kv_len: int, device) -> torch.Tensor:
    """``(q_len, kv_len)``: query column minus key column, the new queries being the last ``q_len`` of
    the ``kv_len`` keys (a sliding-window cache that dropped old keys keeps this alignment)."""
    queries = torch.arange(q_len, device=device)[:, None] + (kv_len - q_len)
    return queries - torch.arange(kv_len, device=device)[None, :]


def masked_softmax(scores: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    """Softmax in float32 over the visible keys; a row with none (a padding query) comes out uniform,
    as eager attention's large-negative mask makes it, instead of NaN."""
    scores = scores.float().masked_fill(~visible, torch.finfo(torch.float32).min)
    return torch.softmax(scores, dim=-1)
