"""One forward pass per prompt, many prompts per forward, with logits only where a gold answer is read.

lm-eval's ``loglikelihood`` gives the same ``(log-prob, is_greedy)`` pairs, but it computes the
full-vocabulary logits (and their log-softmax) at every prompt position and keeps only the
answer's few; for a 600-token prompt and a 49k vocabulary that output layer is about a fifth of
the model's FLOPs. And it runs the whole prompt again for every acceptable answer (a KV value
with and without quotes, MDQA's several answers).

Here each distinct prompt runs once through the decoder, keeping its KV cache; its answers then
cost one batched forward over their own few tokens on that cache, and the output layer runs
only at the answer positions. At batch size 1, prompts that begin with the same tokens also
share those: a position task's prompts of one sample differ only from where the gold item
sits, and run in lexicographic order on one KV cache cut back to what the next prompt shares
(:func:`_score_sharing_prefixes`; ~0.7x the tokens and time on multi_needle's five positions).

``batch_size`` is how many prompts (samples) go into one forward. With 1, each prompt has
its own forwards (``logits_to_keep`` picks the answer positions). With more, prompts are
sorted by length and right-padded (an attention mask hides the padding, ``position_ids``
count each row from 0, so LPES's rotary hooks see the true positions); the decoder's hidden
states are gathered at each row's own answer positions and only those go through the output
layer (``logits_to_keep`` is one slice for the whole batch, so it cannot do this per row).
Prompts with one answer go in one forward over prompt + answer; prompts with several answers
first run the prompt (all rows in one forward, keeping the cache), then every answer of every
row in a second forward on a copy of its row's cache. In float32 the batched scores equal the
per-prompt ones to rounding (tests/test_lmeval_answer_logits_batched.py).

:func:`score_token_pairs` is lm-eval's ``loglikelihood`` itself, one row per distinct row of
lm-eval's (a multiple-choice letter's four answers share one, as lm-eval's logits cache shares
it) and no KV cache split, with the output layer only at the answers, for a model that supplies its own logits at
given positions (Attention Buckets, through :class:`lpes_harness.lmeval.hflm.AnswerLogitsLoglikelihoodMixin`).

Tokenisation is lm-eval's own (:func:`lpes_harness.lmeval.requests.encode_pair`, which moves the context's trailing spaces
into the continuation). A sequence longer than the model's window is truncated from the left
and scored alone, exactly as lm-eval does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F

from lpes_harness.core import arg_values
from lpes_harness.core.models import cache_keyword, output_layer

# ``batch_size="auto"`` on a CPU: one prompt per forward. On a CPU a ~750-token prompt is
# compute-bound already at batch 1, so a batch costs about the sum of its rows; measured on
# the bundled SmolLM2, multi_needle, float32, 1 thread (benchmarks/batched_fitness.py, on a
# busy 2-core machine): batch 4 ran at 0.96x the per-prompt speed, i.e. no faster. An integer
# batch_size still batches on a CPU (same scores).
CPU_AUTO_BATCH = 1
# ``batch_size="auto"`` on a GPU starts here and halves on out-of-memory.
GPU_AUTO_BATCH_START = 128


@dataclass(frozen=True)
class AnswerScore:
    logprob: float  # sum of the answer tokens' log-probabilities (lm-eval's first value)
    is_greedy: bool  # every answer token is the argmax: greedy decoding writes the answer
    num_tokens: int


def score_answers(lm, pairs: Sequence[tuple[str, str]], batch_size: int | str = 1,
                  share_prefixes: bool = True) -> list[AnswerScore]:
    """Score each ``(context, continuation)``; pairs that share a context share its forward pass.

    ``lm`` is an lm-eval HFLM (``lpes_hf`` included): its tokenizer, ``max_length`` and
    device are used as its own ``loglikelihood`` would use them. ``batch_size``: prompts
    per forward, an integer >= 1 or ``"auto"`` (see :func:`resolve_batch_size`). At batch
    size 1, ``share_prefixes`` also runs the tokens that different contexts begin with once
    (:func:`_score_sharing_prefixes`); off, each context runs whole.
    """
    from lpes_harness.lmeval.requests import encode_pair

    encoded = [encode_pair(lm, context, continuation) for context, continuation in pairs]
    for (context, continuation), (_, answer) in zip(pairs, encoded):
        if not answer:
            raise ValueError(f"the answer {continuation!r} encodes to no tokens (context ends {context[-40:]!r})")
    by_context: dict[tuple[int, ...], list[int]] = {}
    for index, (context, answer) in enumerate(encoded):
        by_context.setdefault(tuple(context), []).append(index)
    results: list[AnswerScore | None] = [None] * len(pairs)
    groups = [(list(context), indices, [encoded[i][1] for i in indices]) for context, indices in by_context.items()]
    size = resolve_batch_size(lm, batch_size)
    cache = prefix_cache(lm) if size == 1 and share_prefixes else None
    if cache is not None:
        for (_, indices, _), scores in zip(groups, _score_sharing_prefixes(lm, [(c, a) for c, _, a in groups], cache)):
            for i, score in zip(indices, scores):
                results[i] = score
        return results
    batchable = []
    for context, indices, answers in groups:
        if size == 1 or not _fits_shared(lm, context, answers):
            for i, score in zip(indices, _score_context(lm, context, answers)):
                results[i] = score
        else:
            batchable.append((context, indices, answers))
    # One-answer prompts and several-answer prompts take different forwards; within each,
    # longest first (similar lengths share a batch, and the first batch is the largest).
    for several in (False, True):
        rows = [g for g in batchable if (len(g[2]) > 1) == several]
        rows.sort(key=lambda g: len(g[0]) + max(len(a) for a in g[2]), reverse=True)
        def score_batch(batch, several=several):
            return _score_batch(lm, [(g[0], g[2]) for g in batch], several)

        for group, scores in _in_batches(lm, rows, size, score_batch, auto=batch_size == "auto"):
            for i, score in zip(group[1], scores):
                results[i] = score
    return results


def score_token_pairs(lm, encoded: Sequence[tuple[list[int], list[int]]], batch_size: int | str,
                      logits_at, done=None) -> list[AnswerScore]:
    """lm-eval's ``loglikelihood`` on tokenised ``(context, answer)`` pairs, with logits only at the answers.

    Each pair is the row lm-eval feeds, ``(context + answer)[-(max_length + 1):][:-1]``, whose
    last ``len(answer)`` positions predict the answer. Rows go longest first, ``batch_size``
    per forward (as :func:`resolve_batch_size`), right-padded with token 0 and no mask, as
    lm-eval pads them (no real token of a causal model sees the padding after it).
    ``logits_at(input_ids, rows, columns)`` runs the model and returns the logits ``(n, V)``
    at those ``n`` positions only. Unlike :func:`score_answers`, no prompt is shared between
    pairs whose rows differ (no KV cache is split), so a model whose forward is not the plain
    decoder (Attention Buckets' K copies) only has to supply ``logits_at``; pairs whose rows are
    the same tokens share their row. ``done()``, if given, is called once per pair scored (a
    progress bar).
    """
    # Pairs whose rows are the same tokens share one forward, as lm-eval's logits cache lets
    # them: a multiple-choice letter (C-Eval's "A".."D", MMLU's letter form) is a one-token
    # answer after the same prompt, so its four choices cost one row, not four.
    pairs_of_row: dict[tuple[int, ...], list[int]] = {}
    for index, (context, answer) in enumerate(encoded):
        if not context or not answer:
            raise ValueError(f"loglikelihood needs a context and an answer of at least one token; got {len(context)} "
                             f"and {len(answer)} tokens")
        row = tuple((list(context) + list(answer))[-(lm.max_length + 1) :][:-1])
        pairs_of_row.setdefault(row, []).append(index)
    order = sorted(pairs_of_row, key=len, reverse=True)

    def score_batch(batch):
        return _score_rows(batch, [[encoded[i][1] for i in pairs_of_row[row]] for row in batch], lm.device, logits_at)

    results: list[AnswerScore | None] = [None] * len(encoded)
    size = resolve_batch_size(lm, batch_size)
    for row, scores in _in_batches(lm, order, size, score_batch, auto=batch_size == "auto"):
        for index, score in zip(pairs_of_row[row], scores):
            results[index] = score
            if done is not None:
                done()
    return results


@torch.inference_mode()
def _score_rows(rows: list[tuple[int, ...]], answers: list[list[list[int]]], device, logits_at) -> list[list[AnswerScore]]:
    """Each row's answers (every one read at the row's last ``len(answer)`` positions), all rows in one forward."""
    ids = torch.zeros(len(rows), max(len(row) for row in rows), dtype=torch.long)
    for index, row in enumerate(rows):
        ids[index, : len(row)] = torch.tensor(row, dtype=torch.long)
    reads = [(index, len(row) - len(answer), answer) for index, row in enumerate(rows) for answer in answers[index]]
    scores = iter(_read_answers(lambda r, c: logits_at(ids.to(device), r.to(device), c.to(device)), reads))
    return [[next(scores) for _ in row_answers] for row_answers in answers]


def resolve_batch_size(lm, batch_size: int | str) -> int:
    """``batch_size`` as an int: ``"auto"`` is :data:`CPU_AUTO_BATCH` on a CPU and, on a GPU, the
    largest size that has fitted so far (starting at :data:`GPU_AUTO_BATCH_START`, halved on
    each out-of-memory error)."""
    batch_size = arg_values.batch_size(batch_size)
    if batch_size == "auto":
        if torch.device(lm.device).type == "cpu":
            return CPU_AUTO_BATCH
        return getattr(lm, "_lpes_score_batch", GPU_AUTO_BATCH_START)
    return batch_size


def _fits_shared(lm, context: list[int], answers: list[list[int]]) -> bool:
    # Too long for the window: lm-eval's left truncation, scored alone.
    return len(context) >= 2 and len(context) + max(len(a) for a in answers) <= lm.max_length + 1


def _in_batches(lm, items, size: int, score, auto: bool = False):
    """Yield ``(item, result)``, ``score(batch)`` on ``size`` items at a time; ``auto``: halve on
    out-of-memory (and remember the size that fits on ``lm`` for the next call)."""
    start = 0
    while start < len(items):
        batch = items[start : start + size]
        try:
            scores = score(batch)
        except torch.OutOfMemoryError:
            if not auto or size == 1:
                raise
            size //= 2
            lm._lpes_score_batch = size
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            continue
        yield from zip(batch, scores)
        start += len(batch)


@torch.inference_mode()
def _score_batch(lm, groups: list[tuple[list[int], list[list[int]]]], several: bool) -> list[list[AnswerScore]]:
    """Scores of every answer of every ``(context, answers)``, all rows in one (or two) forwards."""
    model, device = lm.model, lm.device
    decoder = model.get_decoder()
    if not several:
        # One forward over context + answer[:-1]; the answer is read at the row's last len(answer) positions.
        rows = [context + answers[0][:-1] for context, answers in groups]
        ids, mask, positions = _right_padded(rows, device)
        hidden = decoder(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False).last_hidden_state
        reads = [(row, len(context) - 1, answers[0]) for row, (context, answers) in enumerate(groups)]
        return [[score] for score in _read_answers(_hidden_reader(model, hidden), reads)]
    from transformers import DynamicCache

    # The contexts but their last token, once per row, keeping the cache ...
    ids, mask, positions = _right_padded([context[:-1] for context, _ in groups], device)
    cache = DynamicCache(config=model.config)
    cached = {cache_keyword(decoder): cache}
    decoder(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, **cached)
    # ... then each answer on a copy of its row's cache: [last context token] + answer[:-1].
    owner = [row for row, (_, answers) in enumerate(groups) for _ in answers]
    cache.batch_select_indices(torch.tensor(owner, dtype=torch.long, device=device))
    steps = [[context[-1], *answer[:-1]] for context, answers in groups for answer in answers]
    step_ids, step_mask, step_positions = _right_padded(steps, device)
    offsets = torch.tensor([len(groups[row][0]) - 1 for row in owner], dtype=torch.long, device=device)
    hidden = decoder(
        input_ids=step_ids,
        attention_mask=torch.cat([mask[owner], step_mask], dim=1),
        position_ids=step_positions + offsets[:, None],
        use_cache=True,
        **cached,
    ).last_hidden_state
    answers = [answer for _, group_answers in groups for answer in group_answers]
    reads = [(row, 0, answer) for row, answer in enumerate(answers)]
    scores = iter(_read_answers(_hidden_reader(model, hidden), reads))
    return [[next(scores) for _ in group_answers] for _, group_answers in groups]


def _right_padded(rows: list[list[int]], device):
    width = max(len(row) for row in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for index, row in enumerate(rows):
        ids[index, : len(row)] = torch.tensor(row, dtype=torch.long)
        mask[index, : len(row)] = 1
    # Every row counts its positions from 0; the padding after a row's end is masked out.
    positions = torch.arange(width, dtype=torch.long).expand(len(rows), width)
    return ids.to(device), mask.to(device), positions.to(device)


def _hidden_reader(model, hidden: torch.Tensor):
    """``(rows, columns) -> logits`` of the decoder's ``hidden`` states at those positions only."""
    return lambda rows, columns: output_layer(model, hidden[rows.to(hidden.device), columns.to(hidden.device)])


def _read_answers(logits_at, reads: list[tuple[int, int, list[int]]]) -> list[AnswerScore]:
    """``reads``: (row, first position, answer); ``logits_at(rows, columns)`` gives the logits at those positions."""
    rows = torch.tensor([row for row, _, answer in reads for _ in answer], dtype=torch.long)
    columns = torch.tensor([first + k for _, first, answer in reads for k in range(len(answer))], dtype=torch.long)
    logits = logits_at(rows, columns)
    scores, start = [], 0
    for _, _, answer in reads:
        scores.append(_judge(logits[start : start + len(answer)], answer))
        start += len(answer)
    return scores


@torch.inference_mode()
def _score_context(lm, context: list[int], answers: list[list[int]]) -> list[AnswerScore]:
    # One answer: a single forward over prompt + answer is cheapest (splitting it in two costs
    # an extra read of the weights, measured ~10 % on a CPU). Too long: lm-eval's truncation.
    if len(answers) == 1 or not _fits_shared(lm, context, answers):
        return [_score_alone(lm, context, answer) for answer in answers]
    from transformers import DynamicCache

    # Everything but the context's last token is shared; each answer then reads
    # [last context token] + answer[:-1], whose logits predict the answer's tokens.
    prefix = torch.tensor([context[:-1]], dtype=torch.long, device=lm.device)
    cache = DynamicCache(config=lm.model.config)
    decoder = lm.model.get_decoder()
    decoder(prefix, use_cache=True, **{cache_keyword(decoder): cache})  # no output layer: nothing to read
    # All answers in one batch on copies of that cache: on a CPU a forward over a few tokens
    # costs about one read of the weights, so one batched forward beats one per answer.
    return _answers_on_cache(lm, cache, context[-1], answers)


def _answers_on_cache(lm, cache, last_token: int, answers: list[list[int]]) -> list[AnswerScore]:
    """Each answer read on a copy of ``cache`` (a context but its last token), all in one forward.

    A row is [``last_token``] + answer[:-1], whose logits predict the answer's tokens. Rows are
    right-padded: under the causal mask no real token sees the padding after it. The cache is
    left with one row per answer, each ``max(len(answer))`` tokens longer."""
    width = max(len(answer) for answer in answers)
    cache.batch_repeat_interleave(len(answers))
    rows = [[last_token, *answer[:-1]] + [last_token] * (width - len(answer)) for answer in answers]
    steps = torch.tensor(rows, dtype=torch.long, device=lm.device)
    logits = lm.model(steps, use_cache=True, logits_to_keep=width, **{cache_keyword(lm.model): cache}).logits
    return [_judge(logits[row, : len(answer)], answer) for row, answer in enumerate(answers)]


def prefix_cache(lm):
    """An empty KV cache that can be cut back to any length, or None where the model's cannot.

    Sliding-window layers (Gemma-3's) drop keys older than their window, so a cache cut back past
    the window could not be extended again. Here every layer keeps all its keys (a ``DynamicCache``
    built without the config makes full layers): the window still holds, because the model masks
    a sliding layer's attention by absolute position whatever the cache keeps. It costs the memory
    of the keys a window would drop, as a model without windows keeps them (Gemma-3 270M, 18 layers
    of one 256-wide key and value head: about 37 MB a 1,000 tokens in float32). transformers gives
    chunked-attention layers (Llama-4's) the same cache class, masked by absolute position too; they
    are not tested here. Other layer kinds give None: linear-attention and hybrid layers (a recurrent
    state, not keys), indexed attention (a second key cache this does not cut) and shared-KV layers."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

    layers = DynamicCache(config=lm.model.config).layers
    if not layers or not all(type(layer) in (DynamicLayer, DynamicSlidingWindowLayer) for layer in layers):
        return None
    return DynamicCache()  # full layers, made as each layer first writes


def shared_token_fraction(lm, contexts: Sequence[str]) -> float:
    """The share of the contexts' tokens that :func:`score_answers` runs at batch size 1, counted
    without a forward: 1 where the model's cache cannot be cut back (each context then runs whole)."""
    if prefix_cache(lm) is None:
        return 1.0
    encoded = sorted({tuple(lm.tok_encode(context)) for context in contexts})
    run, previous = 0, ()
    for tokens in encoded:
        run += len(tokens) - min(_common_prefix(previous, tokens), len(tokens) - 1)
        previous = tokens
    return run / max(1, sum(map(len, encoded)))


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    length = 0
    for x, y in zip(a, b):
        if x != y:
            break
        length += 1
    return length


def cut_back(cache, previous: Sequence[int], context: Sequence[int]) -> int:
    """Cut ``cache`` (holding ``previous`` and perhaps more) back to what ``context`` can reuse; its new length.

    At most what the cache holds (after several answers, all of the previous context but its last
    token), and never all of ``context``: its last token runs, so there are logits to read."""
    keep = min(_common_prefix(previous, context), len(context) - 1, cache.get_seq_length())
    if cache.get_seq_length() > keep:
        cache.crop(keep - cache.get_seq_length())  # a negative count: the tokens to drop
    return keep


@torch.inference_mode()
def _score_sharing_prefixes(lm, groups: list[tuple[list[int], list[list[int]]]], cache) -> list[list[AnswerScore]]:
    """Every ``(context, answers)`` at batch size 1, the tokens a context shares with the one before it run once
    (``cache``: an empty :func:`prefix_cache`).

    A position task's prompts of one sample are the same text but where the gold item sits, so
    the prompt with the gold item at 75 % shares its first three quarters with the one at 100 %.
    Contexts go in lexicographic order of their tokens: each then shares with the one before it
    the longest prefix it shares with any earlier one, and the KV cache, cut back to that prefix,
    serves it. On multi_needle's five positions that runs ~70 % of the tokens (benchmarks/
    prefix_sharing.py). Positions continue from the cache's length, so a scaled layer rotates
    the new tokens exactly as in one forward over the whole prompt (the cached-generation test
    of tests/test_rope.py); the scores equal :func:`_score_context`'s to float rounding.
    """
    previous = []
    keyword = cache_keyword(lm.model)
    results: list[list[AnswerScore] | None] = [None] * len(groups)
    for index in sorted(range(len(groups)), key=lambda i: groups[i][0]):
        context, answers = groups[index]
        if not _fits_shared(lm, context, answers):
            results[index] = _score_context(lm, context, answers)  # lm-eval's left truncation, scored alone
            continue
        keep = cut_back(cache, previous, context)
        previous = context
        if len(answers) == 1:  # the rest of the context and the answer in one forward, as _score_alone
            answer = answers[0]
            ids = torch.tensor([context[keep:] + answer[:-1]], dtype=torch.long, device=lm.device)
            logits = lm.model(ids, use_cache=True, logits_to_keep=len(answer), **{keyword: cache}).logits[0]
            results[index] = [_judge(logits, answer)]  # the answer's tokens in the cache go at the next cut
            continue
        if keep < len(context) - 1:  # the context but its last token ...
            rest = torch.tensor([context[keep:-1]], dtype=torch.long, device=lm.device)
            decoder = lm.model.get_decoder()
            decoder(rest, use_cache=True, **{cache_keyword(decoder): cache})
        # ... then all its answers in one batch on copies of that cache, as _score_context; the
        # first copy, cut back to the context, is the cache again.
        results[index] = _answers_on_cache(lm, cache, context[-1], answers)
        cache.batch_select_indices(torch.tensor([0], device=lm.device))
        cache.crop(-max(len(answer) for answer in answers))
    return results


@torch.inference_mode()
def _score_alone(lm, context: list[int], answer: list[int]) -> AnswerScore:
    # lm-eval feeds (context + answer)[:-1], keeping the last max_length tokens.
    tokens = (context + answer)[-(lm.max_length + 1) :][:-1]
    inputs = torch.tensor([tokens], dtype=torch.long, device=lm.device)
    logits = lm.model(inputs, use_cache=False, logits_to_keep=len(answer)).logits[0]
    return _judge(logits, answer)


def _judge(logits: torch.Tensor, answer: list[int]) -> AnswerScore:
    logprobs = F.log_softmax(logits[-len(answer) :].float(), dim=-1)
    target = torch.tensor(answer, dtype=torch.long, device=logprobs.device)
    return AnswerScore(
        logprob=float(logprobs.gather(1, target[:, None]).sum()),
        is_greedy=bool((logprobs.argmax(dim=-1) == target).all()),
        num_tokens=len(answer),
    )
