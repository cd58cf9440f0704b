"""An LPES curve under another method in one lm-eval model: the stack ``lpes+<method>`` (issue #97).

    lm_eval --model pcd_hf --model_args "lpes_scales=results/x/scales.json,base_ratio=0.1,weight=0.5" ...
    lm_eval --model fitm_hf --model_args "lpes_scales=0.8;1.1;...;1.3,lpes_scaling=base" ...

Every method model (:class:`~lpes_harness.lmeval.method_lm.MethodLM`) takes ``lpes_scales`` (what
``lpes_hf``'s ``scales=`` takes: a number, numbers separated by ``;``, or a scales file, parsed by the same
code, :func:`~lpes_harness.core.scales_args.parse_scales_args`) and ``lpes_scaling`` (position, base or
both; a scales file says its own). The curve is installed first, then the method, whose hooks then see
the (cos, sin) the curve gives each layer; the method comes off first, then the curve. A method whose
entry does not stack (``Method.stacks_with_lpes``) refuses them, before the model loads, with its
entry's reason. Like ``lpes_hf``'s, the arguments are checked before the load, the layer count too where
the model's config.json or GGUF header says it. Importing this module imports no torch: lm-eval's
command-line check (:mod:`.registration`) reads :data:`STACK_ARGUMENTS` from it on ``lpes_hf``'s cheap path.
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass

from lpes_harness.core.scales_args import ScalesArgs, parse_scales_args
from lpes_harness.core.scales_file import ScalesError, model_layer_info
from lpes_harness.methods import METHODS, stack_key

STACK_ARGUMENTS = ("lpes_scales", "lpes_scaling")


def stack_parameters() -> list[inspect.Parameter]:
    """The two arguments as the keyword-only parameters a stacking method's lm-eval model lists."""
    return [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None) for name in STACK_ARGUMENTS]


@dataclass(frozen=True)
class CurveUnder:
    """The LPES curve a stack installs under ``method``: its arguments, checked."""

    method: str
    args: ScalesArgs

    @property
    def name(self) -> str:
        """The stack's name in the model info and a row's label: ``lpes+pcd``."""
        return stack_key(self.method)

    @property
    def scaling(self) -> str:
        return self.args.scaling_for()

    def layer_scales(self, num_layers: int) -> list[float]:
        try:
            return self.args.layer_scales(num_layers, scaling=self.scaling)
        except ScalesError as err:
            raise _renamed(err) from None

    def install(self, model) -> None:
        """The curve on ``model``, before the method (whose hooks must run after the curve's)."""
        from lpes_harness.core import rope

        rope.install(model, self.layer_scales(rope.num_layers(model)), scaling=self.scaling)

    def info(self, model) -> dict:
        from lpes_harness.core import rope

        return {"stack": self.name, "lpes_scales": rope.get_scales(model), "lpes_scaling": rope.get_scaling(model)}


def parse_curve(method: str, load: dict, lpes_scales=None, lpes_scaling=None) -> CurveUnder | None:
    """The curve of ``lpes_scales`` / ``lpes_scaling`` under ``method``, checked before the model ``load``
    names loads; None when neither is given (the method alone). A method that does not stack is refused."""
    if lpes_scales is None and lpes_scaling is None:
        return None
    from lpes_harness.methods.arguments import MethodError  # torch, as the model class about to load

    entry = METHODS[method]
    if not entry.stacks_with_lpes:
        raise MethodError(f"{entry.lm_eval}: lpes_scales= would put an LPES curve under {entry.label}, which does "
                          f"not stack with one: {entry.why_not_stacked}")
    if lpes_scales is None:
        raise MethodError(f"{entry.lm_eval}: lpes_scaling={lpes_scaling!r} says what the curve's factors multiply, "
                          f"and no lpes_scales= gives them")
    try:
        curve = CurveUnder(method, parse_scales_args(scales=lpes_scales, scaling=lpes_scaling))
    except ScalesError as err:
        raise _renamed(err) from None
    info = model_layer_info(load.get("pretrained"), load.get("gguf_file"), load.get("revision"))
    if info is not None:  # the layer count, where config.json or the GGUF header says it cheaply
        curve.layer_scales(info["num_layers"])
    return curve


def _renamed(err: ScalesError) -> ScalesError:
    """lpes_hf's message, naming the arguments as a stack spells them (``scales=`` -> ``lpes_scales=``)."""
    return type(err)(re.sub(r"\b(scales|scaling)=", r"lpes_\1=", str(err)))
