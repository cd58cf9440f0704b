"""Every way of changing a model at inference, and THE table of them: :data:`METHODS`.

A method is a module with ``install(model, **arguments) -> model`` and ``remove(model) -> model``
(the one piece of bookkeeping they share: :mod:`.state`), and one entry here: its label and
one-line description for reports and docs, its numeric parameters with bounds and the value that
makes it the plain model (:class:`~.parameters.Parameter`), the lm-eval model that runs it, the
candidates the baseline tuner scores, the forwards a token costs, and whether an LPES curve may go
under it in one run (a stack, ``lpes+pcd``: :mod:`lpes_harness.lmeval.lpes_stack`). lm-eval's registry
(:mod:`lpes_harness.lmeval.registration`), the tuner (``commands/tune.py``), the report's
labels and ``docs/baselines.md`` all read this table, and it is their only registration (no
decorator registers a model beside it); a new method is one module and one entry.

LPES (position, base, both) and PI are :mod:`lpes_harness.core.rope`'s ``install`` / ``remove``, a
core module below this package; their entries say which scaling. Like lm-eval's registry and
transformers' ``ROPE_INIT_FUNCTIONS``, the table names modules and classes as strings: it imports
nothing heavy (no torch), so lm-eval can read it at start-up; :meth:`Method.load` imports the module.
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass, field, replace
from types import ModuleType
from typing import Any, Mapping

from lpes_harness.methods.parameters import Parameter
from lpes_harness.core.scaling import DEFAULT, SCALINGS

# Where a method without an lm-eval model class of its own gets one: that module's MethodLM (the
# HFLM subclass every method's lm-eval model is), bound to the method (``BOUND.<name>``, an
# entry-point style attribute path).
GENERIC_LM = "lpes_harness.lmeval.method_lm"


@dataclass(frozen=True)
class Method:
    """One entry of :data:`METHODS`.

    ``module``: where ``install`` / ``remove`` live; ``install_args``: the arguments that select
    this method there (LPES base: ``scaling="base"``), and ``model_args`` the same as lm-eval's
    ``--model_args``. ``lm_class``: ``"module:Class"`` of its own subclass of the one method model
    (``lmeval.method_lm.MethodLM``), or None for that class bound to it (:data:`GENERIC_LM`). ``grid``: the tuner's candidates, argument -> values (a tuple
    value is one list argument, ``;``-joined); None: not tuned by a grid (LPES: the GA).
    ``needs``: install arguments that have no default and are no parameter, with a value that
    suits any model (the identity test uses them). ``forwards``: decoder forwards per token.
    ``stacks_with_lpes``: an LPES curve may be installed under it in one run (``lpes+pcd``: lm-eval's
    ``lpes_scales=``), its hooks reading the (cos, sin) the curve gives each layer; where it may not,
    ``why_not_stacked`` says why, in the one line that refuses ``lpes_scales=``.
    """

    name: str
    label: str
    description: str
    module: str
    lm_eval: str
    lm_class: str | None = None
    parameters: tuple[Parameter, ...] = ()
    forwards: str = "1"
    install_args: Mapping[str, Any] = field(default_factory=dict)
    model_args: str = ""
    grid: Mapping[str, tuple] | None = None
    needs: Mapping[str, Any] = field(default_factory=dict)
    stacks_with_lpes: bool = False
    why_not_stacked: str = ""

    def __post_init__(self):
        # A method stacks only once its hooks were read for it (docs/baselines.md, tests/test_stacking.py):
        # every other entry says why not, so a new method is refused, with a reason, until someone checks.
        if self.stacks_with_lpes == bool(self.why_not_stacked):
            raise ValueError(f"method {self.name!r}: give why_not_stacked exactly when stacks_with_lpes is False")

    @property
    def lm_target(self) -> str:
        """lm-eval's lazy ``"module:attribute"`` of the model class that runs this method."""
        return self.lm_class or f"{GENERIC_LM}:BOUND.{self.name}"

    def parameter(self, name: str) -> Parameter:
        found = [p for p in self.parameters if p.name == name]
        if not found:
            raise KeyError(f"{self.name} has no parameter {name!r}; its parameters: "
                           f"{', '.join(p.name for p in self.parameters) or 'none'}")
        return found[0]

    def identity(self, num_layers: int) -> dict:
        """The install arguments at which the method is the plain model, on a model of ``num_layers`` layers."""
        values = {p.name: p.values(p.identity, num_layers) for p in self.parameters if p.identity is not None}
        return {**self.needs, **self.install_args, **values}

    def load(self) -> ModuleType:
        """The module with ``install`` and ``remove`` (imports torch)."""
        return importlib.import_module(self.module)


def _scales(per_layer: int, help: str) -> Parameter:
    return Parameter("scales", default=1.0, identity=1.0, low=0.0, low_open=True, per_layer=per_layer, help=help)


_ROPE = "lpes_harness.core.rope"
_LPES_LM = "lpes_harness.lmeval.lpes_lm:LPESLM"
_OWN_LM = "lpes_harness.lmeval.method_models"
_RATIO = dict(identity=1.0, low=0.0, low_open=True)
# Why LPES and PI take no second curve under them: a layer's RoPE takes one factor (or pair) of a curve.
_A_CURVE_ITSELF = dict(why_not_stacked="it is an LPES curve itself: give the curve as scales= "
                                        "(a layer takes one curve)")

METHODS: dict[str, Method] = {m.name: m for m in (
    Method("lpes", "LPES", "Layer-specific RoPE position scaling (the paper's): decoder layer h reads position i as "
           "i / s_h, one factor per layer from a search", _ROPE, "lpes_hf", _LPES_LM,
           (_scales(1, "one position factor per decoder layer (a scales file from lpes-search)"),),
           install_args={"scaling": "position"}, **_A_CURVE_ITSELF),
    Method("lpes_base", "LPES base", "Layer-specific RoPE base scaling: layer h's RoPE base becomes s_h x theta, at the "
           "true positions (plain RoPE only)", _ROPE, "lpes_hf", _LPES_LM,
           (_scales(1, "one base factor per decoder layer (a scales file of scaling base)"),),
           install_args={"scaling": "base"}, model_args="scaling=base", **_A_CURVE_ITSELF),
    Method("lpes_both", "LPES both", "Layer-specific RoPE position and base scaling: layer h uses base b_h x theta at "
           "positions i / p_h", _ROPE, "lpes_hf", _LPES_LM,
           (_scales(2, "a position and a base factor per decoder layer, the L position factors first"),),
           install_args={"scaling": "both"}, model_args="scaling=both", **_A_CURVE_ITSELF),
    Method("pi", "PI", "Position Interpolation: one factor on every layer (a curve's mean, or tuned; a position "
           "factor, or under scaling=base one base factor)",
           _ROPE, "lpes_hf", _LPES_LM, (_scales(0, "one position factor for every layer"),), model_args="pi=true",
           grid={"scales": (0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 1.05, 1.1)}, **_A_CURVE_ITSELF),
    Method("mspoe", "Ms-PoE", "Multi-scale positional encoding (Zhang et al. 2024): each head of layers 2.. reads "
           "positions i / r_h, ratios ordered by the head's position-awareness", "lpes_harness.methods.mspoe",
           "mspoe_hf", f"{_OWN_LM}:MsPoELM",
           (Parameter("min_ratio", default=1.2, **_RATIO, help="the smallest head ratio"),
            Parameter("max_ratio", default=1.8, **_RATIO, help="the bound of the head ratios (just below the largest)")),
           # Ratios below 1 too: on SmolLM2 every ratio from 1 up silenced the model, and 0.8-1.0 tuned it (the leaderboard).
           grid={"min_ratio": (0.8, 0.9, 1.0, 1.1, 1.2, 1.3, 1.4, 1.5),
                 "max_ratio": (1.0, 1.2, 1.4, 1.6, 1.8, 2.0, 2.2, 2.5, 3.0, 3.5)},
           why_not_stacked="its attention rotates each head at positions i / r_h computed from the true positions, "
                           "so the curve's (cos, sin) would be dropped in its layers without a word"),
    Method("buckets", "Buckets", "Attention Buckets (Chen et al. 2023): K copies of the input, each with its "
           "own RoPE base, logits merged by each copy's confidence", "lpes_harness.methods.buckets", "buckets_hf",
           f"{_OWN_LM}:BucketsLM",
           (Parameter("bases", default=(1.0, 1.3, 1.6, 1.9, 2.2, 2.5, 2.8), identity=(1.0,), low=0.0, low_open=True,
                      help="the K bases, relative to theta (to each layer type's theta)"),),
           forwards="K, one per base (7 by default), as K rows of one batch",
           grid={"bases": ((1.0, 1.3, 1.6, 1.9, 2.2, 2.5, 2.8), (1.0, 1.5, 2.0, 2.5, 3.0), (0.5, 0.75, 1.0, 1.25, 1.5))},
           why_not_stacked="it replaces the rotary embedding's (cos, sin) by each row block's base, output the "
                           "curve's layer hooks then cannot trace to a rotary call (they stop the forward)"),
    Method("moice", "MoICE", "Mixture of in-context experts (Lin et al. 2024): each head's attention at E RoPE bases, "
           "mixed by a trained per-layer router", "lpes_harness.methods.moice", "moice_hf",
           parameters=(Parameter("bases", default=(1.0, 1.75, 1.8, 1.9, 2.0, 2.25, 2.5), identity=(1.0,), low=0.0,
                                 low_open=True, help="the E bases, relative to theta"),
                       Parameter("top_k", default=None, identity=1, low=1, integer=True,
                                 help="bases kept per token and head (default: all, or the gates file's)")),
           forwards="1, with E attention passes per layer (7 by default)", grid={"top_k": (1, 2, 3, 4, 5, 6, 7)},
           why_not_stacked="its attention rotates queries and keys at its E bases from the true positions itself, "
                           "so the curve's (cos, sin) would be dropped in every layer without a word"),
    Method("poshidden", "Positional hidden-state scaling", "Positional hidden-state scaling (Yu et al. 2025): one "
           "hidden channel of the attention input times a factor in a band of middle layers, for the answer's "
           "queries and every key", "lpes_harness.methods.poshidden", "poshidden_hf", f"{_OWN_LM}:PosHiddenLM",
           (Parameter("factor", default=0.0, identity=1.0, low=-1.0, high=1.0,
                      help="what the positional channel is multiplied by (the paper's set: 0.5, 0, -0.5, -1)"),),
           grid={"factor": (0.5, 0.0, -0.5, -1.0)}, needs={"channels": "3"}, stacks_with_lpes=True),
    Method("fitm", "Found in the Middle", "Found in the Middle (Hsieh et al. 2024): each span's attention minus a "
           "dummy span's at its position, redistributed by softmax(rel / t) in the last half of the layers",
           "lpes_harness.methods.fitm", "fitm_hf", f"{_OWN_LM}:FitMLM",
           (Parameter("strength", default=1.0, identity=0.0, low=0.0, high=1.0,
                      help="share of the calibrated attention (1: the paper's; 0: the plain model)"),
            Parameter("temperature", default=5e-5, identity=None, low=1e-12, help="t of softmax(rel / t)"),
            Parameter("num_spans", default=10, identity=None, low=2, high=64, integer=True, help="K, spans of the region"),
            Parameter("spans_per_copy", default=1, identity=None, low=1, high=64, integer=True,
                      help="spans one dummy copy replaces (1: the paper's, a copy per span; K: one copy for all)")),
           forwards="ceil(K / spans_per_copy) + 1: the dummy copies (10 by default) as rows of one batch",
           grid={"temperature": (5e-5, 2e-4, 1e-3, 5e-3), "strength": (0.5, 1.0)}, needs={"dummy_ids": (5, 6, 7)},
           stacks_with_lpes=True),
    Method("string", "STRING", "STRING (An et al. 2025): relative distances d >= S read as d - S + W in every layer "
           "(the far, rarely trained distances replaced by well-trained ones)", "lpes_harness.methods.string_shift",
           "string_hf",
           parameters=(Parameter("shifted_offset", default=None, identity=0, low=0, integer=True,
                                 help="S in tokens; default shifted_ratio x trained_length; 0: the plain model"),
                       Parameter("shifted_ratio", default=0.33, identity=0.0, low=0.0, high=1.0,
                                 help="S as a share of trained_length (default max_position_embeddings)"),
                       Parameter("local_window", default=128, identity=None, low=0, integer=True,
                                 help="W: where shifted distances start"),
                       Parameter("attention_factor", default=1 + 0.1 * math.log(2), identity=None, low=0.1, high=10.0,
                                 help="multiplies queries and keys (logits by its square); the reference's 1 + 0.1 ln 2")),
           grid={"shifted_offset": (128, 256, 384, 512), "local_window": (32, 64, 128)}, stacks_with_lpes=True),
    Method("pcd", "PCD", "Positional contrastive decoding (Xiao et al. 2025): the logits L contrasted with those "
           "L' of a copy whose RoPE base is lowered to r x theta (local-aware attention): L + w (L - L')",
           "lpes_harness.methods.pcd", "pcd_hf", f"{_OWN_LM}:PCDLM",
           (Parameter("base_ratio", default=0.1, identity=1.0, low=0.0, low_open=True, high=1.0,
                      help="r = B'/B: the local-aware copy's RoPE base as a share of theta (of each layer type's)"),
            Parameter("weight", default=0.5, identity=0.0, low=0.0, high=10.0,
                      help="w, the contrast's weight (0: the plain model)")),
           forwards="2: the model and its lowered-base copy, as 2 rows of one batch",
           grid={"base_ratio": (0.02, 0.1, 0.3), "weight": (0.25, 0.5, 1.0)}, stacks_with_lpes=True),
)}


def lm_eval_models() -> dict[str, str]:
    """lm-eval model name -> ``"module:attribute"`` of its class (LPES, its scalings and PI share ``lpes_hf``)."""
    return {m.lm_eval: m.lm_target for m in METHODS.values()}


def by_lm_eval(name: str) -> list[Method]:
    """The entries an lm-eval model runs (``lpes_hf``: LPES, LPES base, LPES both and PI)."""
    return [m for m in METHODS.values() if m.lm_eval == name]


def run_of(lm_eval: str | None, model_args: Mapping[str, Any] | None = None) -> Method | None:
    """The entry an lm-eval run is: of the entries of its model, the one whose ``model_args`` the run's
    include, the most specific (``lpes_hf`` with ``scaling=base``: LPES base); None for a model not here."""
    given = {str(k): str(v).lower() for k, v in (model_args or {}).items()}
    fits = [m for m in by_lm_eval(lm_eval) if _pairs(m.model_args).items() <= given.items()]
    found = max(fits, key=lambda m: len(_pairs(m.model_args)), default=None)
    if found is not None and found.stacks_with_lpes and "lpes_scales" in given:
        return stacked(found)
    return found


STACK_PREFIX = "lpes+"  # a stack's key: lpes+pcd (the model info's "stack", a compare row's method)


def stack_key(name: str) -> str:
    """The key of an LPES curve under method ``name``: ``lpes+pcd``."""
    return f"{STACK_PREFIX}{name}"


def entry_of(key: str | None) -> Method | None:
    """The entry a key names: a key of :data:`METHODS`, or a stack's (``lpes+pcd``, labelled "LPES+PCD") where
    the method stacks; None for anything else."""
    if isinstance(key, str) and key.startswith(STACK_PREFIX):
        entry = METHODS.get(key[len(STACK_PREFIX):])
        return stacked(entry) if entry is not None and entry.stacks_with_lpes else None
    return METHODS.get(key)


def stacked(entry: Method) -> Method:
    """``entry`` with an LPES curve under it (``lpes_scales=``), as reports name it: "LPES+PCD". The name,
    module and model class stay the method's (the stack is that model, run with a curve), so only what a
    reader sees changes: a stack's row must not read as the method alone."""
    return replace(entry, label=f"LPES+{entry.label}",
                   description=f"an LPES curve under {entry.label}. {entry.description}")


def rope_entry(scales, scaling: str = DEFAULT, held_layers=(), pi: bool = False) -> Method | None:
    """What a run of ``lpes_hf`` with these factors is: PI where ``pi=true`` or one factor other than 1 on
    every layer outside ``held_layers`` (a "curve" that is one factor everywhere is PI, not LPES, whatever
    its scaling), else the LPES entry of its scaling; None at the identity, the plain model. A ``both``
    list whose base half is all ones is a position run, one whose position half is, a base run: bit for
    bit those models."""
    scaling, flat = SCALINGS[scaling].narrowed(scales)
    if all(v == 1.0 for v in flat):
        return None
    if pi or SCALINGS[scaling].uniform_factor(flat, held_layers) is not None:
        return METHODS["pi"]
    return next(m for m in METHODS.values() if m.module == _ROPE and m.install_args.get("scaling") == scaling)


def _pairs(model_args: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in model_args.split(",") if part)


def label_of(lm_eval: str) -> str:
    """The label of the method an lm-eval model runs; the name itself for ``lpes_hf`` (several) or a foreign model."""
    entries = by_lm_eval(lm_eval)
    return entries[0].label if len(entries) == 1 else lm_eval


def tuned_by_grid() -> list[str]:
    """The lm-eval models whose candidates the table gives to the baseline tuner (PI's: its ``--uniform``)."""
    return [m.lm_eval for m in METHODS.values() if m.grid is not None and m.lm_eval != "lpes_hf"]


def grid_of(lm_eval: str) -> Mapping[str, tuple] | None:
    """The tuner's candidates for an lm-eval model other than ``lpes_hf``, or None."""
    entries = by_lm_eval(lm_eval)
    return entries[0].grid if len(entries) == 1 and lm_eval != "lpes_hf" else None
