"""``lpes_hf``: lm-eval's HFLM with layer-specific RoPE scales.

    lm_eval --model lpes_hf --model_args "scales=1.2" --tasks kv_retrieval
    lm_eval --model lpes_hf --model_args "scales=results/smollm2/scales.json" ...
    lm_eval --model lpes_hf --model_args "control_points=0:1.5;10:1.2;20:1.8;29:1.4,curve=bezier" ...

Every HFLM argument works too. ``pretrained`` defaults to the bundled SmolLM2 GGUF,
and ``device`` to CUDA when present, else CPU.
"""

from __future__ import annotations

import os
from typing import Any

from lm_eval.api.registry import register_model
from lm_eval.models.huggingface import HFLM

from lpes_harness import rope
from lpes_harness.models import hflm_model_args
from lpes_harness.scales_file import read_scales_file

SCALES_FORMS = "a number (uniform), numbers separated by ';' (one per layer), or a path to a JSON scales file"


def parse_scales(value: Any) -> float | list[float]:
    """What a user typed for ``scales=`` -> a number or a list of numbers."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, (list, tuple)):
        return [float(v) for v in value]
    text = str(value).strip()
    if os.path.isfile(text) or text.endswith(".json"):
        return read_scales_file(text)
    parts = [p.strip() for p in text.split(";") if p.strip()]
    try:
        numbers = [float(p) for p in parts]
    except ValueError:
        raise rope.LPESError(f"scales={text!r} is not understood; give {SCALES_FORMS}") from None
    if not numbers:
        raise rope.LPESError(f"scales={text!r} is empty; give {SCALES_FORMS}")
    return numbers[0] if len(numbers) == 1 else numbers


def resolve_layer_scales(
    num_layers: int,
    scales: Any = None,
    control_points: Any = None,
    curve: str = "bezier",
    pi: bool = False,
) -> list[float] | None:
    """Turn the user's ``scales`` / ``control_points`` into one validated scale per layer.

    ``pi=True`` replaces them by their mean, used uniformly: the paper's Position
    Interpolation baseline built from a set of LPES scales.
    """
    if scales is not None and control_points is not None:
        raise rope.LPESError("give either scales=... or control_points=..., not both")
    if control_points is not None:
        from lpes_harness import curves

        points = curves.parse_control_points(str(control_points)) if isinstance(control_points, str) else control_points
        layer_scales = curves.curve_scales(points, num_layers, curve=curve)
    elif scales is not None:
        layer_scales = parse_scales(scales)
    else:
        return None
    layer_scales = rope.validate_scales(layer_scales, num_layers)
    if pi:
        mean = sum(layer_scales) / len(layer_scales)
        layer_scales = [mean] * num_layers
    return layer_scales


@register_model("lpes_hf")
class LPESLM(HFLM):
    """HFLM whose decoder layers each see positions divided by their own scale."""

    def __init__(
        self,
        pretrained: Any = None,
        scales: Any = None,
        control_points: Any = None,
        curve: str = "bezier",
        pi: bool = False,
        gguf_file: str | None = None,
        device: str | None = None,
        **kwargs,
    ) -> None:
        model_args = hflm_model_args(pretrained, gguf_file, device)
        # Check the cheap things before the (slow) model load.
        if scales is not None and control_points is not None:
            raise rope.LPESError("give either scales=... or control_points=..., not both")
        if scales is not None:
            scales = parse_scales(scales)  # once: a number or a list from here on (a file is read here)
        super().__init__(**model_args, **kwargs)
        n_layers = rope.num_layers(self.model)  # also: a clear error for models without RoPE
        layer_scales = resolve_layer_scales(n_layers, scales, control_points, curve, pi)
        if layer_scales is None:
            # Scales saved with the model (save_pretrained), else identity: both let a
            # search change them in place later with set_scales.
            layer_scales = rope.saved_scales(self.model.config) or [1.0] * n_layers
        rope.install(self.model, layer_scales)

    # -- used by the search: change scales on the loaded model, never reload ------------
    def set_scales(self, scales) -> None:
        rope.set_scales(self.model, scales)

    @property
    def scales(self) -> list[float]:
        return rope.get_scales(self.model)

    def save_pretrained(self, path: str) -> None:
        """Save model + tokenizer; the scales go into config.json and are re-applied on load."""
        self.model.save_pretrained(path)
        self.tokenizer.save_pretrained(path)

    def get_model_info(self) -> dict:
        info = super().get_model_info()
        info["lpes_scales"] = self.scales
        return info
