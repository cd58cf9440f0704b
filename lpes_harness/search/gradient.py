"""Gradient search of the per-layer RoPE factors: Adam in log-space, projected onto the bounds.

The paper's Appendix E reports that gradient descent "failed to converge" at learning rate 1e-5
(batch 32, 30 epochs). In the factors themselves a step of 1e-5 moves a factor near 1 by a
hundred-thousandth, far below what changes a retrieval answer; here Adam steps the *logarithms*
of the factors (or of a family's few numbers: :mod:`lpes_harness.search.factor_families`), so the
learning rate is a relative step (0.05: about 5 % a step, whatever the gradient's scale), and after
every step the logarithms are clamped into the search's bounds.

The loss is over (prompt, gold answer) token samples, one per drawn condition
(:mod:`lpes_harness.search.drawn_conditions`), through the differentiable RoPE of
:mod:`lpes_harness.core.rope_grad`:

- ``gold_logprob``: minus the log-probability of the gold answer's tokens (teacher forcing), as
  lm-eval's ``loglikelihood`` scores it;
- ``margin``: where a sample carries the other needles' values, the answer must beat the value it
  would be confused with. At the first token where another value leaves the gold answer, both have the
  same context (the gold tokens before it), so one forward over prompt + gold gives both log-probabilities;
  the loss is ``softplus(-(gold - best other))`` at the worst of those tokens: about the gap while the
  gold loses, near 0 once it wins clearly. Samples without other values fall back to ``gold_logprob``.

Cost, in forwards (the unit of every budget and table): each sample of a step is one forward and one
backward, and a backward counts as two forwards (:data:`FORWARDS_PER_SAMPLE_STEP`). Each step scores
the factors it starts from, so its loss and factors go in the history together; the best factors are
those of the lowest loss seen. With a full batch (``batch_size`` None) the losses of the steps are on the
same samples and comparable; with mini-batches the best is that of a noisy estimate, and the choice
among histories belongs to held-out accuracy (the issue: judge the loss by held-out accuracy, not by itself).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from lpes_harness.core.rope_grad import DifferentiableRoPE

LOSSES = ("gold_logprob", "margin")
FORWARDS_PER_BACKWARD = 2
FORWARDS_PER_SAMPLE_STEP = 1 + FORWARDS_PER_BACKWARD


@dataclass(frozen=True)
class TokenSample:
    """One fitness sample: the prompt's tokens, the gold answer's, the other needles' values (tokenised as
    the answer would be after the same prompt), and the condition it was drawn under (for the history)."""

    prompt: tuple[int, ...]
    answer: tuple[int, ...]
    others: tuple[tuple[int, ...], ...] = ()
    condition: dict | None = None

    def __post_init__(self):
        if not self.prompt or not self.answer:
            raise ValueError("a sample needs at least one prompt token and one answer token")


def token_samples(lm, rows: Sequence[tuple]) -> list[TokenSample]:
    """Samples from text, tokenised as lm-eval's ``loglikelihood`` tokenises them (``lm``: an HFLM).

    ``rows``: ``(context, gold, others, condition)`` tuples, ``others`` the other needles' values as strings.
    Building those rows from a task's documents (the prompt, the gold value, the distractors' values) is the
    task wiring this module leaves to its caller."""
    from lpes_harness.lmeval.requests import loglikelihood_tokens

    samples = []
    for context, gold, others, condition in rows:
        prompt, answer = loglikelihood_tokens(lm, context, gold)
        other_tokens = tuple(tuple(loglikelihood_tokens(lm, context, o)[1]) for o in others if o != gold)
        samples.append(TokenSample(tuple(prompt), tuple(answer), other_tokens, condition))
    return samples


def answer_log_probs(model: nn.Module, sample: TokenSample) -> torch.Tensor:
    """(answer length, vocabulary) log-probabilities at the answer's positions, in float32 or wider."""
    ids = torch.tensor([sample.prompt + sample.answer], device=_device(model))
    # The output layer only where the answer is read: the last len(answer) + 1 positions, less the last.
    logits = model(ids, logits_to_keep=len(sample.answer) + 1, use_cache=False).logits[0, :-1]
    return torch.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)


def sample_loss(model: nn.Module, sample: TokenSample, loss: str = "gold_logprob") -> torch.Tensor:
    """The loss of one sample under the model's current RoPE (see the module's docstring)."""
    if loss not in LOSSES:
        raise ValueError(f"loss={loss!r} is not one of {', '.join(LOSSES)}")
    log_probs = answer_log_probs(model, sample)
    answer = torch.tensor(sample.answer, device=log_probs.device)
    gold = log_probs.gather(-1, answer[:, None])[:, 0]
    margins = [gold[t] - log_probs[t, other[t]] for other in sample.others
               if (t := _first_difference(sample.answer, other)) is not None]
    if loss == "gold_logprob" or not margins:
        return -gold.sum()
    return F.softplus(-torch.stack(margins).min())


def _first_difference(answer: Sequence[int], other: Sequence[int]) -> int | None:
    """The first index where ``other`` leaves ``answer``, within the answer; None if it never does there."""
    return next((t for t, (a, o) in enumerate(zip(answer, other)) if a != o), None)


@dataclass(frozen=True)
class GradientConfig:
    """The gradient search's knobs. ``lr`` is in log-factor units: 0.05 is a step of about 5 %."""

    lr: float = 0.05
    budget_forwards: int = 300
    batch_size: int | None = None  # samples a step; None: all of them (full batch, comparable losses)
    loss: str = "gold_logprob"
    betas: tuple[float, float] = (0.9, 0.999)
    seed: int = 0  # the order of the mini-batches

    def __post_init__(self):
        if self.loss not in LOSSES:
            raise ValueError(f"loss={self.loss!r} is not one of {', '.join(LOSSES)}")
        if not self.lr > 0 or self.budget_forwards < 0 or (self.batch_size is not None and self.batch_size < 1):
            raise ValueError(f"need lr > 0, budget_forwards >= 0, batch_size >= 1 or None; got {self}")


@dataclass
class GradientStep:
    """One step: the mean loss of its batch at the factors it started from, and the forwards spent so far."""

    step: int
    loss: float
    factors: list[float]
    forwards: int


@dataclass
class GradientResult:
    factors: list[float]  # the best factors seen, the scaling's flat list
    loss: float  # their loss
    forwards: int  # all forwards spent, a backward counted as two
    history: list[GradientStep] = field(default_factory=list)


def gradient_search(model: nn.Module, samples: Sequence[TokenSample], family,
                    config: GradientConfig = GradientConfig(), start: torch.Tensor | None = None,
                    on_step: Callable[[GradientStep], None] | None = None) -> GradientResult:
    """Adam on ``family``'s log-parameters (``start``, default ``family.initial()``) to lower the loss over ``samples``;
    after each step they are projected onto the family's bounds (:mod:`~lpes_harness.search.factor_families`).

    Stops before a step that would pass ``config.budget_forwards``. The model's weights are frozen while it runs
    (only the factors get gradients) and their ``requires_grad`` flags are restored after."""
    if not samples:
        raise ValueError("the gradient search needs at least one sample")
    batch_size = min(config.batch_size or len(samples), len(samples))
    step_cost = batch_size * FORWARDS_PER_SAMPLE_STEP
    params = (family.initial() if start is None else start.detach().clone()).to(torch.float32)
    family.project(params)  # a start outside the bounds begins at their edge
    params.requires_grad_(True)
    optimizer = torch.optim.Adam([params], lr=config.lr, betas=config.betas)
    batches = _batches(len(samples), batch_size, config.seed)
    history: list[GradientStep] = []
    forwards = 0
    with _frozen(model), DifferentiableRoPE(model, family.scaling) as path:
        while forwards + step_cost <= config.budget_forwards:
            optimizer.zero_grad()
            batch = next(batches)
            total = 0.0
            for index in batch:  # one backward a sample: the activations of one prompt at a time
                path.factors = family.factors(params)
                value = sample_loss(model, samples[index], config.loss) / len(batch)
                value.backward()
                total += float(value.detach())
            forwards += step_cost
            record = GradientStep(len(history), total, family.factors(params).detach().tolist(), forwards)
            history.append(record)
            if on_step is not None:
                on_step(record)
            if forwards + step_cost <= config.budget_forwards:  # a last update no step would score is skipped
                optimizer.step()
                family.project(params)
            path.factors = None
    if not history:
        raise ValueError(f"budget_forwards={config.budget_forwards} holds no step: one step of {batch_size} "
                         f"sample(s) costs {step_cost} forwards (a backward counts as {FORWARDS_PER_BACKWARD})")
    best = min(history, key=lambda s: s.loss)
    return GradientResult(best.factors, best.loss, forwards, history)


def _batches(count: int, batch_size: int, seed: int):
    """Mini-batches of sample indices without repeats within an epoch, reshuffled each epoch from ``seed``."""
    rng = random.Random(seed)
    order: list[int] = []
    while True:
        if len(order) < batch_size:
            fresh = list(range(count))
            rng.shuffle(fresh)
            order += [i for i in fresh if i not in order]  # no sample twice in one batch
        yield order[:batch_size]
        order = order[batch_size:]


class _frozen:
    """The model's parameters without gradients for a while (the factors are what is searched), then as they were."""

    def __init__(self, model: nn.Module):
        self.model = model

    def __enter__(self):
        self.flags = [(p, p.requires_grad) for p in self.model.parameters()]
        for p, _ in self.flags:
            p.requires_grad_(False)
        return self

    def __exit__(self, *exc):
        for p, flag in self.flags:
            p.requires_grad_(flag)


def _device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device
