"""The gradient search (issue 100, item 1): a differentiable RoPE path, its families, drawn conditions, Adam.

Tiny random models built in code, CPU only, a few seconds in all.
"""

import math

import pytest
import torch
import torch.nn.functional as F

from lpes_harness.core import rope
from lpes_harness.core.rope_anatomy import LPESError
from lpes_harness.core.rope_grad import DifferentiableRoPE
from lpes_harness.core.scaling import SCALINGS
from lpes_harness.search.drawn_conditions import ConditionRange, draw_conditions
from lpes_harness.search.factor_families import Bounds, Lines, PerLayer
from lpes_harness.search.gradient import (
    FORWARDS_PER_SAMPLE_STEP,
    GradientConfig,
    TokenSample,
    answer_log_probs,
    gradient_search,
    sample_loss,
)
from tiny_models import logits, random_ids, tiny_gemma3, tiny_model

L = 4  # the tiny models' layers
BOUNDS = Bounds(0.25, 4.0)


def samples(count=4, length=24, answer=3, seed=10):
    out = []
    for k in range(count):
        ids = random_ids(length + answer, seed=seed + k)[0].tolist()
        out.append(TokenSample(tuple(ids[:length]), tuple(ids[length:]), condition={"sample": k}))
    return out


# A point away from the identity for each scaling, with one layer exactly at 1 (the identity's own path).
POINTS = {
    "position": [1.3, 1.0, 0.8, 1.6],
    "base": [2.0, 0.6, 1.0, 3.0],
    "both": [1.3, 1.0, 0.8, 1.6, 2.0, 0.6, 1.0, 3.0],
}


@pytest.fixture
def float64_rms_norm(monkeypatch):
    """transformers' LlamaRMSNorm normalises in float32 even in a float64 model: its rounding (~1e-7 relative,
    in every layer) divided by a finite difference's 2 eps would swamp the comparison (3.5 % off at eps 1e-5).
    The same norm in the model's own dtype makes the whole forward float64."""
    from transformers.models.llama import modeling_llama

    def forward(self, hidden_states):
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))

    monkeypatch.setattr(modeling_llama.LlamaRMSNorm, "forward", forward)


@pytest.mark.parametrize("scaling", list(SCALINGS))
def test_gradient_matches_central_finite_difference(scaling, float64_rms_norm):
    """d loss / d factor through the rotary angles is the loss's true slope, layer by layer.

    float64 throughout (weights, norms, angles), central differences at eps = 1e-5. Measured on this model:
    the truncation error, O(eps^2), is ~2e-6 relative at eps 1e-4 and so ~2e-8 at 1e-5; the rounding left
    is under 1e-6 relative (the layers at exactly 1 keep the model's own float32 RoPE, constant in both
    evaluations). rtol 1e-5 sits an order above both, and far below a wrong chain rule (a missed factor of
    p, ln theta or 2 is off at order 1; the same test in float32 norms is off by 3.5 %)."""
    model = tiny_model("llama").double()
    sample = samples(count=1)[0]
    point = torch.tensor(POINTS[scaling], dtype=torch.float64)
    with DifferentiableRoPE(model, scaling) as path:
        factors = point.clone().requires_grad_(True)
        path.factors = factors
        sample_loss(model, sample).backward()
        eps, slopes = 1e-5, []
        for k in range(len(point)):
            shift = torch.zeros_like(point)
            shift[k] = eps
            with torch.no_grad():
                path.factors = point + shift
                up = sample_loss(model, sample)
                path.factors = point - shift
                down = sample_loss(model, sample)
            slopes.append(float((up - down) / (2 * eps)))
    finite = torch.tensor(slopes, dtype=torch.float64)
    assert finite.abs().max() > 1e-3  # the factors matter: a test of zero against zero would prove nothing
    torch.testing.assert_close(factors.grad, finite, rtol=1e-5, atol=1e-9)


@pytest.mark.parametrize("scaling", list(SCALINGS))
@pytest.mark.parametrize("requires_grad", [False, True])
@pytest.mark.parametrize("build", [lambda: tiny_model("llama"), tiny_gemma3], ids=["llama", "gemma3"])
def test_all_factors_one_give_the_plain_models_logits_bit_exact(scaling, requires_grad, build):
    model = build()
    ids = random_ids(40)
    plain = logits(model, ids)
    family_ones = [PerLayer(scaling, L, BOUNDS), Lines(scaling, L, BOUNDS, held=[1])]
    with DifferentiableRoPE(model, scaling) as path:
        for factors in [path.identity()] + [family.factors(family.initial()) for family in family_ones]:
            assert factors.tolist() == [1.0] * (L * SCALINGS[scaling].per_layer)
            path.factors = factors.detach().requires_grad_(requires_grad)
            with torch.set_grad_enabled(requires_grad):
                out = model(ids).logits
            assert torch.equal(out, plain)
    assert torch.equal(logits(model, ids), plain)  # removed: the model as it was


@pytest.mark.parametrize("scaling", list(SCALINGS))
def test_differentiable_path_computes_the_model_rope_install_does(scaling):
    """Away from 1 the values are :mod:`rope`'s float path to float32 rounding (angles ~40 rad, logits < 1)."""
    model, ids = tiny_model("llama"), random_ids(40)
    with DifferentiableRoPE(model, scaling) as path:
        path.factors = torch.tensor(POINTS[scaling])
        ours = logits(model, ids)
    rope.install(model, POINTS[scaling], scaling)
    theirs = logits(model, ids)
    rope.remove(model)
    assert not torch.allclose(theirs, logits(model, ids), atol=1e-3)  # the point does change the model
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)


def test_the_two_hook_sets_refuse_to_stack():
    model = tiny_model("llama")
    rope.install(model, [1.2] * L)
    with pytest.raises(LPESError, match="rope.remove"):
        DifferentiableRoPE(model)


@pytest.mark.parametrize("family", [PerLayer("both", L, Bounds(0.5, 2.0)), Lines("both", L, Bounds(0.5, 2.0))],
                         ids=["per-layer", "lines"])
def test_projection_keeps_every_factor_inside_its_bounds_under_a_huge_learning_rate(family):
    model = tiny_model("llama")
    config = GradientConfig(lr=50.0, budget_forwards=6 * 2 * FORWARDS_PER_SAMPLE_STEP)
    result = gradient_search(model, samples(count=2), family, config)
    assert len(result.history) == 6
    seen = [f for step in result.history for f in step.factors] + result.factors
    assert all(0.5 <= f <= 2.0 for f in seen), seen
    # ... and the steps were large enough to press on the bounds: the projection had work to do.
    assert {0.5, 2.0} & set(seen)


@pytest.mark.parametrize("make", [PerLayer, Lines], ids=["per-layer", "lines"])
def test_each_axis_keeps_its_own_bounds(make):
    """``both`` with the search's two ranges: position factors in [0.5, 2], base factors in [0.8, 1.25]."""
    family = make("both", L, [Bounds(0.5, 2.0), Bounds(0.8, 1.25)])
    config = GradientConfig(lr=50.0, budget_forwards=4 * 2 * FORWARDS_PER_SAMPLE_STEP)
    result = gradient_search(tiny_model("llama"), samples(count=2), family, config)
    for step in result.history[1:]:
        positions, bases = step.factors[:L], step.factors[L:]
        assert all(0.5 <= f <= 2.0 for f in positions) and all(0.8 <= f <= 1.25 for f in bases)
    seen = {f for step in result.history for f in step.factors}
    assert seen & {0.5, 2.0} and seen & {0.8, 1.25}  # both ranges were pressed on
    with pytest.raises(ValueError, match="one per axis"):
        make("both", L, [Bounds(0.5, 2.0)])


def test_a_resumed_search_ends_as_the_uninterrupted_one(tmp_path):
    """The state after step 2 (as JSON, as a run folder keeps it), resumed: the same steps, losses and factors."""
    import json

    model = tiny_model("llama")
    family = Lines("both", L, [Bounds(0.5, 2.0), Bounds(0.5, 4.0)])
    config = GradientConfig(lr=0.2, budget_forwards=5 * 2 * FORWARDS_PER_SAMPLE_STEP, batch_size=2)
    states = []
    whole = gradient_search(model, samples(count=3), family, config, on_checkpoint=states.append)
    saved = json.loads(json.dumps(states[1]))  # after two of five steps
    assert len(saved["history"]) == 2
    resumed = gradient_search(model, samples(count=3), family, config, resume=saved)
    assert [vars(s) for s in resumed.history] == [vars(s) for s in whole.history]
    assert resumed.factors == whole.factors and resumed.forwards == whole.forwards
    # The steps did move the factors: a resume that restarted from the start would differ.
    assert whole.history[-1].factors != whole.history[0].factors


def test_lines_are_straight_over_depth_and_move_only_two_numbers_an_axis():
    family = Lines("both", 5, BOUNDS, held=[2])
    factors = family.factors(family.initial([(0.6, 1.6), (0.5, 1.0)])).tolist()
    expected_positions = [0.6, 0.85, 1.0, 1.35, 1.6]  # layer 2 held at 1 (off the line's 1.1)
    expected_bases = [0.5, 0.625, 1.0, 0.875, 1.0]
    assert factors == pytest.approx(expected_positions + expected_bases, abs=1e-6)
    assert family.initial().numel() == 4


def test_a_drawn_condition_set_is_reproducible_from_its_seed():
    space = ConditionRange(num_sentences=(60, 300), needles=(2, 16))
    first, again, other = draw_conditions(7, 50, space), draw_conditions(7, 50, space), draw_conditions(8, 50, space)
    assert first == again
    assert first != other
    assert [c["sample"] for c in first] == list(range(50))
    assert all(60 <= c["num_sentences"] <= 300 and 2 <= c["num_needles"] <= 16 for c in first)
    assert len({c["num_sentences"] for c in first}) > 10  # a range, not a few fixed points
    assert all("num_needles" not in c for c in draw_conditions(7, 5))  # needle count drawn only when asked
    assert {c["num_needles"] for c in draw_conditions(1, 40, ConditionRange(needles=[4, 16]))} == {4, 16}


def taught_samples(model, scaling, target, count=3, length=24, answer=3):
    """Prompts whose answers are the model's own greedy tokens at the factors ``target``: samples that some
    factors answer well, as a retrieval task's gold answers are what a well-scaled model reads back."""
    rope.install(model, target, scaling)
    out = []
    for k in range(count):
        ids = random_ids(length, seed=20 + k)
        for _ in range(answer):
            ids = torch.cat([ids, logits(model, ids)[:, -1].argmax(-1, keepdim=True)], dim=1)
        ids = ids[0].tolist()
        out.append(TokenSample(tuple(ids[:length]), tuple(ids[length:])))
    rope.remove(model)
    return out


@pytest.mark.parametrize("family, target", [
    (PerLayer("position", L, BOUNDS), [2.0] * L),
    (Lines("both", L, BOUNDS), [0.6, 0.9, 1.2, 1.5] + [2.0] * L),
], ids=["per-layer", "lines"])
def test_a_few_adam_steps_lower_the_loss_on_the_training_samples(family, target):
    """Ten plain Adam steps at lr 0.1 (about 10 % a step; backtracking has its own test): the tiny model's landscape is rough, so the steps' losses are
    not monotone, but the best is >= 10 % below the plain model's (measured: 21 % and 12 %) and the last below it."""
    model = tiny_model("llama")
    with torch.no_grad():
        model.lm_head.weight.mul_(20.0)  # peaked next-token distributions: the answers depend on the factors
    train = taught_samples(model, family.scaling, target)
    config = GradientConfig(lr=0.1, budget_forwards=10 * 3 * FORWARDS_PER_SAMPLE_STEP, backtrack=False)
    result = gradient_search(model, train, family, config)
    losses = [step.loss for step in result.history]
    assert len(losses) == 10 and result.forwards == 10 * 3 * FORWARDS_PER_SAMPLE_STEP
    with torch.no_grad():
        plain = sum(float(sample_loss(model, s)) for s in train) / 3
    assert losses[0] == pytest.approx(plain, rel=1e-5)  # the first step scores the start: the plain model
    assert result.loss <= 0.9 * losses[0] and losses[-1] < losses[0]
    assert result.loss == min(losses) and result.factors == result.history[losses.index(min(losses))].factors
    # The factors it returns give that loss on the plain float path.
    rope.install(model, result.factors, family.scaling)
    with torch.no_grad():
        assert sum(float(sample_loss(model, s)) for s in train) / 3 == pytest.approx(result.loss, rel=1e-4)
    rope.remove(model)
    assert all(p.requires_grad for p in model.parameters())  # the weights' flags are as they were


def test_a_step_that_raises_the_loss_is_undone_and_retaken_at_half_the_rate():
    """Samples the plain model answers itself (its own greedy tokens at factors 1), so moving away costs loss: the
    first step, e^±1 at lr 1, is rejected, and the next point is Adam's first step from the start at lr 0.5, the
    square root of the rejected factors (an Adam first step is lr times the gradient's sign)."""
    model = tiny_model("llama")
    with torch.no_grad():
        model.lm_head.weight.mul_(20.0)
    train = taught_samples(model, "position", [1.0] * L)
    family = PerLayer("position", L, BOUNDS)
    result = gradient_search(model, train, family, GradientConfig(lr=1.0, budget_forwards=4 * 3 * FORWARDS_PER_SAMPLE_STEP))
    first, second, third = result.history[:3]
    assert not first.rejected and first.factors == [1.0] * L
    assert second.rejected and second.loss > first.loss and second.lr == 0.5
    assert third.factors == pytest.approx([math.sqrt(f) for f in second.factors], rel=1e-6)
    # A step that lowers the loss lengthens the next by 1.5; one that raises it halves it.
    for before, after in zip(result.history[1:], result.history[2:]):
        assert after.lr == pytest.approx(before.lr * (0.5 if after.rejected else 1.5))
    assert result.loss == min(s.loss for s in result.history)
    # Without backtracking Adam goes on from the rejected point.
    plain = gradient_search(model, train, family, GradientConfig(lr=1.0, backtrack=False,
                                                                 budget_forwards=3 * 3 * FORWARDS_PER_SAMPLE_STEP))
    assert not any(s.rejected for s in plain.history) and plain.history[2].factors != third.factors


def test_the_budget_counts_a_backward_as_two_forwards():
    model = tiny_model("llama")
    config = GradientConfig(budget_forwards=2 * FORWARDS_PER_SAMPLE_STEP * 3 - 1, batch_size=2)
    result = gradient_search(model, samples(count=5), PerLayer("position", L, BOUNDS), config)
    assert FORWARDS_PER_SAMPLE_STEP == 3
    assert [step.forwards for step in result.history] == [6, 12]  # a third step (18) would pass 17
    with pytest.raises(ValueError, match="holds no step"):
        gradient_search(model, samples(count=2), PerLayer("position", L, BOUNDS), GradientConfig(budget_forwards=5))


def test_margin_loss_is_the_gold_tokens_lead_over_the_closest_other_needle():
    model = tiny_model("llama")
    base = samples(count=1)[0]
    gold = base.answer
    others = ((gold[0], (gold[1] + 1) % 96, 7), ((gold[0] + 5) % 96,), gold)  # leaves at token 1, at 0, never
    sample = TokenSample(base.prompt, gold, others)
    with torch.no_grad():
        log_probs = answer_log_probs(model, sample)
        lead_1 = log_probs[1, gold[1]] - log_probs[1, others[0][1]]
        lead_0 = log_probs[0, gold[0]] - log_probs[0, others[1][0]]
        expected = F.softplus(-torch.minimum(lead_0, lead_1))
        assert float(sample_loss(model, sample, "margin")) == pytest.approx(float(expected), rel=1e-6)
        # Without other values the margin is the gold log-probability's loss.
        assert float(sample_loss(model, base, "margin")) == pytest.approx(float(sample_loss(model, base)), rel=1e-6)
        assert float(sample_loss(model, base)) == pytest.approx(-float(log_probs.gather(
            -1, torch.tensor(gold)[:, None]).sum()), rel=1e-6)
        assert math.isfinite(float(sample_loss(model, sample, "margin")))


# ----------------------------------------------------------------------------- samples from a position task

# A chat template of the tiny tokenizer's characters: the prompts below go through it as the task prefers.
TINY_CHAT_TEMPLATE = ("{% for m in messages %}[{{ m['role'] }}]: {{ m['content'] }}\n{% endfor %}"
                      "{% if add_generation_prompt %}[assistant]: {% endif %}")
SMALL_NEEDLES = ConditionRange(num_sentences=(3, 8), needles=(2, 4))


@pytest.fixture(scope="module")
def chat_checkpoint(tmp_path_factory):
    """A tiny Llama behind the character-level tokenizer, with a chat template, long enough for whole prompts."""
    from tiny_models import tiny_tokenizer

    path = tmp_path_factory.mktemp("tiny-chat")
    model = tiny_model("llama", max_position_embeddings=4096)
    model.config.bos_token_id, model.config.eos_token_id, model.config.pad_token_id = 1, 2, 0
    model.save_pretrained(path)
    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = TINY_CHAT_TEMPLATE
    tokenizer.save_pretrained(path)
    return str(path)


def load_lm(checkpoint):
    from lpes_harness.lmeval.lpes_lm import LPESLM

    return LPESLM(pretrained=checkpoint, device="cpu", dtype="float32")


def chars(lm, ids) -> str:
    return "".join(lm.tokenizer.convert_ids_to_tokens(list(ids)))


def fed_tokens(lm, task, condition):
    """The tokens the position scorer's forwards read for one condition's document, in order."""
    from lpes_harness.lmeval.position_scorer import PositionScorer

    percent, index = condition["gold_percent"], condition["sample"]
    options = {k: v for k, v in condition.items() if k not in ("sample", "gold_percent")}
    scorer = PositionScorer(lm, task, [percent], metadata=options, split="search", num_samples=index + 1)
    fed = []

    def record(module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        fed.extend(ids[0].tolist())

    handle = lm.model.get_decoder().register_forward_pre_hook(record, with_kwargs=True)
    try:
        scorer.scores(percent, [index])
    finally:
        handle.remove()
    return fed, scorer.docs[percent][index]


def test_position_samples_are_the_scorers_tokens_with_the_gold_and_the_other_needles_values(chat_checkpoint):
    import re

    from lpes_harness.search.gradient_samples import position_token_samples

    lm = load_lm(chat_checkpoint)
    conditions = draw_conditions(5, 4, SMALL_NEEDLES)
    built = position_token_samples(lm, "multi_needle", "search", conditions, (0, 50, 100), seed=3)
    assert [s.condition["sample"] for s in built] == [0, 1, 2, 3]
    assert {s.condition["gold_percent"] for s in built} == {0, 50, 100}
    for sample, condition in zip(built, conditions):
        assert {k: v for k, v in sample.condition.items() if k != "gold_percent"} == condition
        fed, doc = fed_tokens(lm, "multi_needle", sample.condition)
        # lm-eval reads (prompt + answer) less its last token: the same ids, the chat template included.
        assert fed == list(sample.prompt + sample.answer)[:-1]
        assert "[user]: " in chars(lm, sample.prompt) and doc["answer_prefix"] in chars(lm, sample.prompt)
        assert doc["num_items"] == condition["num_sentences"] + condition["num_needles"]  # the drawn options
        assert chars(lm, sample.answer).strip() == doc["target"] == doc["answers"][0]
        # The other needles' numbers, read from the document's own text: every city but the asked one.
        cities = doc["distractor_cities"].split(",")
        numbers = {city: re.search(rf"The special magic number for {city} is (\d+)\.", doc["prompt"]).group(1)
                   for city in cities}
        assert len(cities) == condition["num_needles"] - 1 and doc["city"] not in cities
        assert sorted(chars(lm, o).strip() for o in sample.others) == sorted(numbers.values())
        # Tokenised as the answer is, after the same prompt: a 7-digit number, as many tokens.
        assert all(len(o) == len(sample.answer) for o in sample.others)


def test_position_samples_are_reproducible_from_their_seed_and_empty_of_others_where_items_hold_no_answer(
        chat_checkpoint):
    from lpes_harness.search.gradient_samples import gold_percents, position_token_samples

    lm = load_lm(chat_checkpoint)
    conditions = draw_conditions(5, 6, SMALL_NEEDLES)
    first = position_token_samples(lm, "multi_needle", "search", conditions, (0, 50, 100), seed=3)
    assert position_token_samples(lm, "multi_needle", "search", conditions, (0, 50, 100), seed=3) == first
    # Every position its share, in an order the seed picks.
    assert sorted(s.condition["gold_percent"] for s in first) == [0, 0, 50, 50, 100, 100]
    assert any(gold_percents(6, (0, 50, 100), s) != gold_percents(6, (0, 50, 100), 3) for s in range(4, 9))
    needle = position_token_samples(lm, "needle", "search", [{"num_sentences": 6}] * 2, (0, 100), seed=3)
    assert [s.others for s in needle] == [(), ()] and [s.condition["sample"] for s in needle] == [0, 1]


def test_one_gradient_step_on_position_samples(chat_checkpoint):
    from lpes_harness.search.gradient_samples import position_token_samples

    lm = load_lm(chat_checkpoint)
    built = position_token_samples(lm, "multi_needle", "search", draw_conditions(5, 3, SMALL_NEEDLES), (0, 50, 100),
                                   seed=3)
    rope.remove(lm.model)  # lpes_hf installs its float hooks; the gradient path is its own
    family = PerLayer("position", L, BOUNDS)
    result = gradient_search(lm.model, built, family,
                             GradientConfig(budget_forwards=2 * 3 * FORWARDS_PER_SAMPLE_STEP, loss="margin"))
    assert len(result.history) == 2 and result.forwards == 2 * 3 * FORWARDS_PER_SAMPLE_STEP
    with torch.no_grad():
        plain = sum(float(sample_loss(lm.model, s, "margin")) for s in built) / 3
    assert result.history[0].loss == pytest.approx(plain, rel=1e-5) and math.isfinite(result.history[1].loss)
    assert result.history[1].factors != result.history[0].factors  # the step moved the factors
    assert all(BOUNDS.low <= f <= BOUNDS.high for f in result.history[1].factors)


def test_the_runs_family_takes_each_axis_bounds_and_held_layers_from_the_genome():
    """--scaling both with --position-layer-type (Gemma-3's case): the position line holds the other layers at 1,
    the base line moves every layer; each axis in its own range, starting flat at the genome's start."""
    from types import SimpleNamespace

    from lpes_harness.search.genome import GenomeSpec
    from lpes_harness.search.gradient_stage import build_family, history_of, start_params

    spec = GenomeSpec(num_layers=L, y_min=0.25, y_max=2.5, y_step=0.05, initial_y=1.2, base_y_min=0.5, base_y_max=4.0,
                      base_y_step=0.25, base_initial_y=1.0, position_held_layers=(0, 2))
    family = build_family(SimpleNamespace(family="lines", scaling="both"), spec)
    assert [(b.low, b.high) for b in family.axis_bounds] == [(0.25, 2.5), (0.5, 4.0)]
    assert family.axis_held == ((0, 2), ())
    start = family.factors(start_params(family, spec)).tolist()
    assert start == pytest.approx([1.0, 1.2, 1.0, 1.2] + [1.0] * L)
    moved = family.factors(family.initial([(0.6, 1.6), (0.5, 1.0)])).tolist()
    assert moved[0] == moved[2] == 1.0 and moved[L:] == pytest.approx([0.5, 2 / 3, 5 / 6, 1.0])
    per_layer = build_family(SimpleNamespace(family="per-layer", scaling="both"), spec)
    assert per_layer.initial().numel() == 2 * L
    # The steps as the later stages read a history: fitness minus the loss, a step's own forwards, step 0 the start.
    steps = [{"step": 0, "loss": 2.0, "factors": [1.0] * 8, "forwards": 6},
             {"step": 1, "loss": 1.5, "factors": [1.1] * 8, "forwards": 12}]
    records = history_of(steps)
    assert [r["fitness"] for r in records] == [-2.0, -1.5] and [r["info"]["samples"] for r in records] == [6, 6]
    assert [r["origin"] for r in records] == ["initial", "gradient"]
