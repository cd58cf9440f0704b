"""Baseline models as rows of a paired comparison: Ms-PoE, MoICE, Attention Buckets, any lm-eval model.

A row is named on the command line as ``[NAME=]MODEL[:ARGS]`` (``Ms-PoE rank=mspoe_hf:head_mapping=rank``),
becomes a :class:`~lpes_harness.methods.setup.MethodSetup` of that model, and is loaded only when the
score cache lacks one of its blocks (:func:`lpes_harness.evaluation.paired.score_methods`).
"""

from __future__ import annotations

from lpes_harness.methods.setup import MethodSetup


def parse_baseline(text: str) -> tuple[str, MethodSetup]:
    """``[NAME=]MODEL[:ARGS]`` -> (row name, baseline); the model must be a registered lm-eval model.

    ``Ms-PoE rank=mspoe_hf:head_mapping=rank`` names the row; without NAME the row is the spec.
    """
    from lpes_harness.lmeval.plugin import register

    head, _, args = text.partition(":")
    name, sep, model = head.partition("=")
    if not sep:
        name, model = "", head
    model, name, args = model.strip(), name.strip(), args.strip()
    register()
    from lm_eval.api.registry import get_model

    try:
        get_model(model)
    except ValueError:
        raise ValueError(f"--baseline {text!r}: {model!r} is not a registered lm-eval model "
                         f"(e.g. mspoe_hf, buckets_hf, moice_hf)") from None
    if model == "lpes_hf":
        raise ValueError(f"--baseline {text!r}: give lpes_hf scales with --scales (or --uniform), not as a baseline")
    baseline = MethodSetup(model, args)
    return name or baseline.spec, baseline


def parse_baselines(texts) -> dict[str, MethodSetup]:
    """Every ``--baseline`` of a command line by row name (:func:`parse_baseline`); two of one name are refused."""
    baselines = dict(parse_baseline(text) for text in texts)
    if len(baselines) != len(texts):
        raise ValueError("two --baseline rows have the same name; name each NAME=MODEL[:ARGS]")
    return baselines


def load_baseline_lm(baseline: MethodSetup, pretrained: str | None, dtype: str):
    """The lm-eval model of ``baseline`` on the comparison's checkpoint and dtype (its own arguments win)."""
    from lm_eval.api.registry import get_model
    from lm_eval.utils import simple_parse_args_string

    kwargs = {"dtype": dtype, "batch_size": 1, **({"pretrained": pretrained} if pretrained else {})}
    kwargs.update(simple_parse_args_string(baseline.args))
    return get_model(baseline.model)(**kwargs)


class BaselineLoader:
    """One lm-eval model of a method at a time: another setting of the same method is installed on it
    (:meth:`~lpes_harness.lmeval.method_lm.MethodLM.reconfigure`), another method loads its own."""

    def __init__(self, pretrained: str | None, dtype: str):
        self.pretrained, self.dtype, self.lm, self.model = pretrained, dtype, None, None

    def __call__(self, setup: MethodSetup):
        from lm_eval.utils import simple_parse_args_string

        arguments = simple_parse_args_string(setup.args)
        if self.lm is not None and self.model == setup.model and hasattr(self.lm, "reconfigure") and \
                set(arguments) <= {p.name for p in self.lm.method_arguments()}:  # HFLM's own need a load
            self.lm.reconfigure(**arguments)
            return self.lm
        self.lm = None  # the previous model is freed before the next loads
        self.lm, self.model = load_baseline_lm(setup, self.pretrained, self.dtype), setup.model
        return self.lm
