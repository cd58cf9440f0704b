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

Backtracking (full batch, the default): Adam's step is about ``lr`` in every direction whatever the slope, so
where the loss is sharp a step overshoots and the moments carry it further (on SmolLM2, seed 4's first two steps
from vanilla raised the margin loss 0.571 -> 0.652 -> 0.871). A step whose loss is above the lowest so far is
marked ``rejected``: the factors go back to the lowest point, with its gradient and Adam's moments, and its step
is taken again at half the rate, a backtracking line search along Adam's direction; a step that lowers the loss
lengthens the next by 1.5 (a trust region's rule, so that one overshoot does not slow every later step). The
rejected step's forwards count.

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
    return loss_from(answer_log_probs(model, sample), sample, loss)


def loss_from(log_probs: torch.Tensor, sample: TokenSample, loss: str = "gold_logprob") -> torch.Tensor:
    """:func:`sample_loss` from the answer's log-probabilities (:func:`answer_log_probs`), already computed."""
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
    # Full batch only (the losses of two steps are then on the same samples): a step whose loss is above the
    # lowest so far is undone, and Adam's step from that lowest point is taken again at half the rate.
    backtrack: bool = True

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
    lr: float | None = None  # the rate of the update that followed (halved after a rejected step)
    rejected: bool = False  # a loss above the lowest so far: the search went back to the lowest one's factors


@dataclass
class GradientResult:
    factors: list[float]  # the best factors seen, the scaling's flat list
    loss: float  # their loss
    forwards: int  # all forwards spent, a backward counted as two
    history: list[GradientStep] = field(default_factory=list)


def gradient_search(model: nn.Module, samples: Sequence[TokenSample], family,
                    config: GradientConfig = GradientConfig(), start: torch.Tensor | None = None,
                    on_step: Callable[[GradientStep], None] | None = None,
                    resume: dict | None = None,
                    on_checkpoint: Callable[[dict], None] | None = None,
                    stop_before_step: Callable[[int], bool] | None = None) -> GradientResult:
    """Adam on ``family``'s log-parameters (``start``, default ``family.initial()``) to lower the loss over ``samples``;
    after each step they are projected onto the family's bounds (:mod:`~lpes_harness.search.factor_families`).

    Stops before a step that would pass ``config.budget_forwards``. The model's weights are frozen while it runs
    (only the factors get gradients) and their ``requires_grad`` flags are restored after.

    ``on_checkpoint(state)`` gets, after every step, a JSON-able state (the parameters, Adam's moments, the
    history); ``resume=state`` continues from it, and the run then ends as the uninterrupted one would have
    (the same mini-batches, the same steps): Lightning's ``state_dict`` / ``load_state_dict`` in one dict.
    ``stop_before_step(k)``: True ends the search before step k (a deadline); the steps so far are the result."""
    if not samples:
        raise ValueError("the gradient search needs at least one sample")
    batch_size = min(config.batch_size or len(samples), len(samples))
    step_cost = batch_size * FORWARDS_PER_SAMPLE_STEP
    params = (family.initial() if start is None else start.detach().clone()).to(torch.float32)
    family.project(params)  # a start outside the bounds begins at their edge
    params.requires_grad_(True)
    optimizer = torch.optim.Adam([params], lr=config.lr, betas=config.betas)
    batches = _batches(len(samples), batch_size, config.seed)
    backtrack = config.backtrack and batch_size == len(samples)
    history: list[GradientStep] = []
    forwards, lr, anchor = 0, config.lr, None
    if resume is not None:
        params, history, forwards, lr, anchor = _load_state(resume, params, optimizer, config.lr)
        for _ in history:  # the mini-batches the steps before the checkpoint took
            next(batches)
    with _frozen(model), DifferentiableRoPE(model, family.scaling) as path:
        while forwards + step_cost <= config.budget_forwards:
            if stop_before_step is not None and history and stop_before_step(len(history)):
                break
            optimizer.zero_grad()
            batch = next(batches)
            total = 0.0
            for index in batch:  # one backward a sample: the activations of one prompt at a time
                path.factors = family.factors(params)
                value = sample_loss(model, samples[index], config.loss) / len(batch)
                value.backward()
                total += float(value.detach())
            forwards += step_cost
            scored = family.factors(params).detach().tolist()  # where this loss was measured
            rejected = backtrack and anchor is not None and total > anchor["loss"]
            if rejected:
                # Adam's step is about lr in every direction whatever the slope: where the loss is sharp (a
                # uniform position factor of 1.1 already costs SmolLM2 points) it overshoots, and the moments
                # would carry it further. Back to the lowest point, its own gradient and moments, half the rate.
                lr *= 0.5
                _restore(anchor, params, optimizer)
            elif backtrack:
                if anchor is not None:  # the last step lowered the loss: a longer one next (a trust region's rule)
                    lr *= 1.5
                anchor = _snapshot(params, optimizer, total)
            record = GradientStep(len(history), total, scored, forwards, lr, rejected)
            history.append(record)
            if forwards + step_cost <= config.budget_forwards:  # a last update no step would score is skipped
                for group in optimizer.param_groups:
                    group["lr"] = lr
                optimizer.step()
                family.project(params)
            path.factors = None
            if on_step is not None:
                on_step(record)
            if on_checkpoint is not None:
                on_checkpoint(_state(params, optimizer, history, forwards, lr, anchor))
    if not history:
        raise ValueError(f"budget_forwards={config.budget_forwards} holds no step: one step of {batch_size} "
                         f"sample(s) costs {step_cost} forwards (a backward counts as {FORWARDS_PER_BACKWARD})")
    best = min(history, key=lambda s: s.loss)
    return GradientResult(best.factors, best.loss, forwards, history)


def _moments(optimizer: torch.optim.Optimizer) -> dict:
    """Adam's state for the one parameter tensor, as plain lists (JSON)."""
    state = optimizer.state_dict()["state"].get(0, {})
    return {key: (value.tolist() if torch.is_tensor(value) else value) for key, value in state.items()}


def _set_moments(optimizer: torch.optim.Optimizer, moments: dict) -> None:
    saved = optimizer.state_dict()
    saved["state"] = {0: {key: torch.tensor(value, dtype=torch.float32) for key, value in moments.items()}} if moments else {}
    optimizer.load_state_dict(saved)


def _snapshot(params: torch.Tensor, optimizer: torch.optim.Optimizer, loss: float) -> dict:
    """The lowest point so far, as a rejected step goes back to it: its factors, gradient, Adam's moments before
    its update, its loss."""
    return {"params": params.detach().tolist(), "grad": params.grad.detach().tolist(), "adam": _moments(optimizer),
            "loss": loss}


def _restore(anchor: dict, params: torch.Tensor, optimizer: torch.optim.Optimizer) -> None:
    with torch.no_grad():
        params.copy_(torch.tensor(anchor["params"], dtype=params.dtype))
    params.grad = torch.tensor(anchor["grad"], dtype=params.dtype)
    _set_moments(optimizer, anchor["adam"])


def _state(params: torch.Tensor, optimizer: torch.optim.Optimizer, history: Sequence[GradientStep],
           forwards: int, lr: float, anchor: dict | None) -> dict:
    """The search's state after a step, as JSON: floats round-trip exactly through ``repr``."""
    return {"params": params.detach().tolist(), "forwards": forwards, "lr": lr, "anchor": anchor,
            "adam": _moments(optimizer), "history": [vars(step) for step in history]}


def _load_state(state: dict, params: torch.Tensor, optimizer: torch.optim.Optimizer, lr: float):
    restored = torch.tensor(state["params"], dtype=params.dtype)
    if restored.shape != params.shape:
        raise ValueError(f"the saved state has {restored.numel()} parameters; this family has {params.numel()}")
    with torch.no_grad():
        params.copy_(restored)
    _set_moments(optimizer, state.get("adam") or {})
    history = [GradientStep(**step) for step in state["history"]]
    return params, history, int(state["forwards"]), float(state.get("lr", lr)), state.get("anchor")


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
