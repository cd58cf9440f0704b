"""lm-eval's greedy ``generate_until`` at batch size 1, the tokens prompts begin with run once.

L-Eval asks 5 to 50 questions of each long document, and every question's prompt repeats the
document (about 3,500 tokens) before its own few dozen: HFLM runs each prompt whole, so nearly all
of a question's forward is spent again on the same document. Here prompts go in lexicographic
order of their tokens, so each shares with the one before it the longest prefix it shares with
any earlier one, and one KV cache, cut back to that prefix, serves it; ``model.generate`` then
runs only the rest of the prompt (transformers continues from a cache it is given). Positions
continue from the cache's length, so a scaled layer rotates the new tokens as in one forward over
the whole prompt (the cached-generation test of tests/test_rope.py).

Everything else is HFLM's, called as HFLM calls it: the stop sequences with the end-of-text token,
the left truncation to ``max_length - max_gen_toks``, the tokenisation (``tok_batch_encode`` of one
prompt, so no padding), ``_model_generate`` (stopping criteria, autocast, greedy flags), the
decoding and stop-sequence post-processing, the cache hook. The continuations equal HFLM's at
batch size 1 to float rounding of the shorter forwards, not bit for bit, hence opt-in
(``lpes_hf``'s ``prefix_cache=true``).

Where sharing cannot apply, :func:`why_not_shared` says why and the caller keeps HFLM's path:
sampling or beams, a thinking model (HFLM strips its end token), a seq2seq model, or a model whose
KV cache cannot be cut back (a layer keeps a recurrent state, a key index or another layer's keys).
Sliding-window layers share: the cache keeps their old keys and the mask keeps their window
(:func:`prefix_cache`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from lm_eval.models.utils import handle_stop_sequences, normalize_gen_kwargs, postprocess_generated_text
from tqdm import tqdm

from lpes_harness.lmeval.answer_logits import cut_back, prefix_cache
from lpes_harness.core.models import cache_keyword


def _greedy(kwargs: dict) -> bool:
    # HFLM decodes greedily when do_sample is unset or false and temperature is 0 (its default)
    return not kwargs.get("do_sample") and not kwargs.get("temperature") and kwargs.get("num_beams", 1) == 1


def _prepared(lm, context: str, gen_kwargs: dict, eos: str) -> tuple[torch.Tensor, list[str], int, dict]:
    """HFLM's per-batch preparation for one prompt: its tokens, stop sequences, max new tokens, the rest."""
    kwargs = normalize_gen_kwargs(gen_kwargs, lm.max_gen_toks)
    until = handle_stop_sequences(kwargs.pop("until", None), eos=eos)
    max_gen_toks = kwargs.pop("max_gen_toks")
    if lm.max_length - max_gen_toks <= 0:
        raise ValueError(f"max_gen_toks ({max_gen_toks}) must be less than the model's max_length ({lm.max_length})")
    ids, _ = lm.tok_batch_encode([context], left_truncate_len=lm.max_length - max_gen_toks, truncation=lm.truncation)
    return ids, until, max_gen_toks, kwargs


def why_not_shared(lm, requests: Sequence) -> str | None:
    """Why these requests cannot share prefixes on this model (HFLM's path then runs them), or None."""
    if lm.backend != "causal":
        return "a seq2seq model"
    if lm.think_end_token is not None:
        return "a thinking model (HFLM strips its end token)"
    if not all(_greedy(normalize_gen_kwargs(dict(request.args[1]), lm.max_gen_toks)) for request in requests):
        return "sampling or beam search (only greedy decoding is shared)"
    if prefix_cache(lm) is None:
        return ("this model's KV cache cannot be cut back "
                "(a layer keeps a recurrent state, a key index or another layer's keys)")
    return None


def _prepared_all(lm, arguments: Sequence[tuple]) -> list[tuple]:
    eos = lm.tok_decode(lm.eot_token_id, skip_special_tokens=False)
    return [_prepared(lm, context, dict(gen_kwargs), eos) for context, gen_kwargs in arguments]


def _sharing_order(tokens: Sequence[Sequence[int]]) -> list[int]:
    """Lexicographic order of the prompts' tokens: each then shares with the one before it the longest
    prefix it shares with any earlier one."""
    return sorted(range(len(tokens)), key=lambda i: tokens[i])


class _CacheLength:
    """A stand-in for the KV cache that keeps only its length, for :func:`cut_back` to count with."""

    def __init__(self):
        self.length = 0

    def get_seq_length(self) -> int:
        return self.length

    def crop(self, count: int) -> None:
        self.length += count  # count < 0: the tokens dropped


def prompt_tokens_run(lm, requests: Sequence) -> tuple[int, int]:
    """(the requests' prompt tokens, those :func:`generate_sharing_prefixes` runs), counted without a
    forward: the same tokens, order and cut-back rule. A cache after a generation holds at least its
    prompt, so the count holds whatever was generated."""
    tokens = [ids[0].tolist() for ids, *_ in _prepared_all(lm, [tuple(request.args) for request in requests])]
    cache, previous, run = _CacheLength(), [], 0
    for index in _sharing_order(tokens):
        run += len(tokens[index]) - cut_back(cache, previous, tokens[index])
        cache.length, previous = len(tokens[index]), tokens[index]
    return sum(map(len, tokens)), run


def generate_sharing_prefixes(lm, requests: Sequence, disable_tqdm: bool = False) -> list[str]:
    """``lm.generate_until(requests)``, prompt prefixes shared on one KV cache (check :func:`why_not_shared` first)."""
    arguments = [tuple(request.args) for request in requests]
    cache = prefix_cache(lm)
    prepared = _prepared_all(lm, arguments)
    tokens = [ids[0].tolist() for ids, *_ in prepared]
    results: list[str | None] = [None] * len(arguments)
    previous: list[int] = []
    with tqdm(total=len(arguments), desc="Running generate_until requests (shared prefixes)",
              disable=disable_tqdm or lm.rank != 0) as bar:
        for index in _sharing_order(tokens):
            ids, until, max_gen_toks, kwargs = prepared[index]
            context = tokens[index]
            cut_back(cache, previous, context)  # generate then runs only the rest of the prompt
            previous = context
            ids, kwargs = ids.to(lm.device), dict(kwargs)
            max_length = kwargs.pop("max_length", ids.shape[1] + max_gen_toks)  # HFLM's: a given one wins
            out = lm._model_generate(context=ids, attention_mask=torch.ones_like(ids), stop=until, max_length=max_length,
                                     **{cache_keyword(lm.model): cache}, **kwargs)
            text = postprocess_generated_text(generation=lm.tok_decode(out[0, ids.shape[1]:].tolist()), stop=until,
                                              think_end_token=None)
            results[index] = text
            lm.cache_hook.add_partial("generate_until", arguments[index], text)
            bar.update(1)
    return results
