"""``lpes_hf``: lm-eval's HFLM with layer-specific RoPE scales.

    lm_eval --model lpes_hf --model_args "scales=1.2" --tasks kv_retrieval
    lm_eval --model lpes_hf --model_args "scales=results/smollm2/scales.json" ...
    lm_eval --model lpes_hf --model_args "control_points=0:1.5;10:1.2;20:1.8;29:1.4,curve=bezier" ...
    lm_eval --model lpes_hf --model_args "pretrained=gemma3-270m,scales=run/scales.json,pi=true,layer_type=full_attention" ...

``pi=true`` replaces the scales by their mean, on every layer: the paper's Position Interpolation
baseline built from a set of LPES scales (alone, it averages the scales the model was saved with).
``layer_type=T`` scales only the layers of that attention type (the config's ``layer_types``),
the others stay at 1: with ``pi=true`` the mean is taken over those layers and put on them, the PI
of a curve searched with ``--layer-type T``. Checks and messages: :mod:`lpes_harness.core.scales_args`.

Every HFLM argument works too. ``pretrained`` defaults to the bundled SmolLM2 GGUF,
and ``device`` to CUDA when present, else CPU.

``scaling=base`` makes each factor multiply the layer's RoPE base instead of dividing its positions
(:mod:`lpes_harness.core.rope`); a scales file written by a ``--scaling base`` search says so itself.
``scaling=both`` gives each layer a pair, a position factor and a base factor: a scales file of
scaling both, or ``scales="p0;...;p{L-1};b0;...;b{L-1}"`` (2L numbers); ``pi=true`` then puts each
half's mean on every layer (``layer_type=T``: on T's layers, in both halves).

``answer_logits=true`` makes ``loglikelihood`` (MMLU, C-Eval) run the output layer only at the
answer tokens: with Gemma-3's 262k vocabulary the full-vocabulary logits at every prompt position
cost more than the decoder. The answers are HFLM's to rounding (1e-4 in float32), not bit for bit:
the output layer's matmul over fewer rows rounds differently, so the default stays HFLM's path,
on which ``scales=1`` reproduces the plain model exactly.

``prefix_cache=true`` (with ``batch_size`` 1) makes greedy ``generate_until`` run the tokens a
prompt shares with the one before it once, on one KV cache (:mod:`lpes_harness.lmeval.prefix_generation`):
L-Eval's questions of one document then pay for the document once. Its continuations are HFLM's
to float rounding, not bit for bit, so it is off by default too.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from lm_eval.models.huggingface import HFLM

from lpes_harness.core import rope
from lpes_harness.core.arg_values import parse_bool
from lpes_harness.lmeval.hflm import AnswerLogitsLoglikelihoodMixin
from lpes_harness.lmeval.method_lm import MethodLM
from lpes_harness.lmeval.prefix_generation import generate_sharing_prefixes, why_not_shared
from lpes_harness.core.models import config_layer_types, output_layer, resolve_pretrained
from lpes_harness.core.scales_args import parse_scales_args
from lpes_harness.core.scaling import SCALINGS

logger = logging.getLogger(__name__)


class LPESLM(AnswerLogitsLoglikelihoodMixin, MethodLM):
    """HFLM whose decoder layers each see positions divided by their own scale.

    The table's LPES, LPES base, LPES both and PI entries all run here (``scaling=``, ``pi=true``);
    its ``--model_args`` are a curve's (scales file, numbers or control points), not ``install``'s."""

    method = "lpes"

    def before_load(self, load: dict, *, scales: Any = None, control_points: Any = None, curve: str | None = None,
                    pi: bool = False, layer_type: str | None = None, scaling: str | None = None,
                    answer_logits: Any = False, prefix_cache: Any = False):
        # Everything that needs no model, checked before the (slow) model load; a scales file is
        # read here, once. The same checks run from lm_eval's command line (registration.py).
        args = parse_scales_args(scales, control_points, curve, pi, layer_type, scaling)
        self.lpes_answer_logits = parse_bool("answer_logits", answer_logits)
        self.lpes_prefix_cache = parse_bool("prefix_cache", prefix_cache)
        if self.lpes_prefix_cache and str(load.get("batch_size", 1)) != "1":
            raise ValueError(f"prefix_cache=true shares one KV cache between prompts run one at a time: "
                             f"it needs batch_size 1, got {load.get('batch_size')!r}")
        return args, load

    def after_load(self, prepared) -> None:
        args, load = prepared
        pretrained, gguf_file = load["pretrained"], load["gguf_file"]
        # Which model this is, for fingerprints: the GGUF it came from, not the cache folder it loads from.
        source = resolve_pretrained(pretrained, gguf_file) if isinstance(pretrained, str) or pretrained is None \
            else (None, gguf_file)
        self.lpes_source = {"pretrained": source[0], "gguf_file": source[1], "revision": load.get("revision")}
        n_layers = rope.num_layers(self.model)  # also: a clear error for models without RoPE
        saved = rope.saved_scales(self.model.config)
        layer_types = config_layer_types(self.model.config) if args.layer_type else None
        # Saved scales keep the scaling they were saved with (pi=true averages them too).
        scaling = args.scaling_for(rope.saved_scaling(self.model.config) if saved else None)
        layer_scales = args.layer_scales(n_layers, saved, layer_types, scaling)
        if layer_scales is None:
            # Scales saved with the model (save_pretrained), else identity: both let a
            # search change them in place later with set_scales.
            layer_scales = saved or SCALINGS[scaling].identity(n_layers)
        rope.install(self.model, layer_scales, scaling=scaling)

    def loglikelihood(self, requests, disable_tqdm: bool = False):
        if self.lpes_answer_logits:
            return super().loglikelihood(requests, disable_tqdm=disable_tqdm)  # the mixin's
        return HFLM.loglikelihood(self, requests, disable_tqdm=disable_tqdm)

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        if self.lpes_prefix_cache:
            reason = why_not_shared(self, requests)
            if reason is None:
                return generate_sharing_prefixes(self, requests, disable_tqdm=disable_tqdm)
            logger.warning("prefix_cache=true: each prompt runs whole (HFLM's path): %s", reason)
        return super().generate_until(requests, disable_tqdm=disable_tqdm)

    def answer_logits(self, input_ids, rows, columns):
        """``loglikelihood``'s logits ``(n, V)`` at positions ``(rows, columns)`` of the batch only."""
        with torch.no_grad():
            hidden = self.model.get_decoder()(input_ids=input_ids, use_cache=False).last_hidden_state
            return output_layer(self.model, hidden[rows, columns])

    # -- used by the search: change scales on the loaded model, never reload ------------
    def set_scales(self, scales) -> None:
        """One factor per layer; under scaling "both", 2L: the position factors, then the base factors."""
        rope.set_scales(self.model, scales)

    @property
    def scales(self) -> list[float]:
        return rope.get_scales(self.model)

    @property
    def scaling(self) -> str:
        """What the scales multiply: "position" (the paper's), "base" or "both" (pairs)."""
        return rope.get_scaling(self.model)

    def save_pretrained(self, path: str) -> None:
        """Save model + tokenizer; the scales go into config.json and are re-applied on load."""
        self.model.save_pretrained(path)
        self.tokenizer.save_pretrained(path)

    def method_info(self) -> dict:
        return {"lpes_scales": self.scales, "lpes_scaling": self.scaling}
