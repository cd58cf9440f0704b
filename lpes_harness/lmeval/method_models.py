"""The methods that need more of HFLM than their ``install``: their lm-eval models.

- ``mspoe_hf`` (:class:`MsPoELM`): Ms-PoE ranks heads on each row's last real token, which
  HFLM's right-padded ``loglikelihood`` batches hide (:class:`~.hflm.RightPaddedRowsMixin`);
- ``buckets_hf`` (:class:`BucketsLM`): K copies of every input, logits merged, in its own
  ``loglikelihood`` (logits only at the answers) and greedy decoding loop;
- ``poshidden_hf`` (:class:`PosHiddenLM`): a setting file, and the answer's first column in
  ``loglikelihood`` (:class:`~.hflm.RightPaddedRowsMixin`);
- ``fitm_hf`` (:class:`FitMLM`): the dummy span's tokens, K dummy copies beside every input,
  the answer's first column, and its own greedy decoding loop;
- ``pcd_hf`` (:class:`PCDLM`): the model and its lowered-base copy beside every input, logits
  contrasted, in its own ``loglikelihood`` (logits only at the answers) and greedy decoding loop;
  HFLM's own paths at the identity.

Each is :class:`~.method_lm.MethodLM` for its entry of :data:`lpes_harness.methods.METHODS`
(``--model_args``: HFLM's and the method's) plus what it overrides. Ms-PoE's and Buckets' arguments
are their ``install``'s; the rivals' install depends on what HFLM loaded (a setting file checked
against the model, the dummy span's tokens), so they fill MethodLM's two hooks: ``before_load``
checks their own arguments, ``after_load`` installs. The methods themselves (install, remove, their
forwards and decoding) are :mod:`lpes_harness.methods`' modules.
"""

from __future__ import annotations

from typing import Any

import torch
from lm_eval.models.utils_hf import stop_sequences_criteria

from lpes_harness.lmeval.hflm import AnswerLogitsLoglikelihoodMixin, RightPaddedRowsMixin
from lpes_harness.lmeval.method_lm import MethodLM
from lpes_harness.methods import buckets, fitm, mspoe, pcd, poshidden
from lpes_harness.methods.arguments import MethodError


def _greedy_only(name: str, generation_kwargs: dict) -> None:
    if generation_kwargs.get("do_sample") or generation_kwargs.get("num_beams", 1) != 1:
        raise MethodError(
            f"{name} decodes greedily; got do_sample={generation_kwargs.get('do_sample')!r}, "
            f"num_beams={generation_kwargs.get('num_beams', 1)!r}. Accepted: do_sample=false, num_beams=1"
        )


class MsPoELM(RightPaddedRowsMixin, MethodLM):
    """HFLM whose attention heads each see positions divided by their own ratio (Ms-PoE)."""

    method = "mspoe"

    def _model_call(self, inps, attn_mask=None, labels=None):
        state = mspoe.get_state(self.model)
        state.last_index = self._last_real_index(inps)
        try:
            return super()._model_call(inps, attn_mask=attn_mask, labels=labels)
        finally:
            state.last_index = None

    def _model_generate(self, context, max_length, stop, **generation_kwargs):
        mspoe.get_state(self.model).last_index = None
        return super()._model_generate(context, max_length, stop, **generation_kwargs)


class BucketsLM(AnswerLogitsLoglikelihoodMixin, MethodLM):
    """HFLM running K RoPE bases in parallel and merging their logits (Attention Buckets).

    ``--model_args``: ``bases=1.0;1.3;...`` (default: the authors' seven), each relative to the
    model's theta, and on a model with a RoPE per layer type (Gemma-3) to each layer type's
    theta; ``absolute_bases=true`` takes them as bases (refused where there are several
    layer types); every HFLM argument.
    """

    method = "buckets"

    def answer_logits(self, input_ids, rows, columns):
        """``loglikelihood``'s logits: the merged K copies at the answer positions only."""
        with torch.no_grad():
            return buckets.answer_logits(self.model, input_ids, rows, columns)

    def _model_call(self, inps, attn_mask=None, labels=None):
        with torch.no_grad():
            return buckets.forward_logits(self.model, inps)

    def _model_generate(self, context, max_length, stop, **generation_kwargs):
        _greedy_only("buckets_hf", generation_kwargs)
        criteria = stop_sequences_criteria(self.tokenizer, stop, context.shape[1], context.shape[0])
        with torch.no_grad():
            return buckets.generate(self.model, context, attention_mask=generation_kwargs.get("attention_mask"),
                                    max_length=max_length, stopping_criteria=criteria,
                                    pad_token_id=self.tokenizer.pad_token_id)


class PosHiddenLM(RightPaddedRowsMixin, MethodLM):
    """HFLM with positional hidden-state scaling.

    ``--model_args``: ``setting=<file>`` (from ``poshidden_channel``: channels, layers, factor),
    or ``channels=12[;34]``; ``factor`` (default: the file's, else 0; 1 is the plain model);
    ``layers`` (``10:25`` or ``10;11;12``; default: the file's, else the middle band); every HFLM argument.
    """

    method = "poshidden"

    def before_load(self, load: dict, *, setting: str | None = None, channels: Any = None, factor: Any = None,
                    layers: Any = None) -> dict:
        return poshidden.resolve_arguments(setting, channels, factor, layers)

    def after_load(self, resolved: dict) -> None:
        self._poshidden = resolved
        if resolved["channels"] is not None:
            poshidden.check_setting_shape(self.model, resolved["expect"], resolved["setting"])
            poshidden.install(self.model, resolved["channels"], resolved["factor"], resolved["layers"])

    def _model_call(self, inps, attn_mask=None, labels=None):
        state = poshidden.SLOT.find(self.model)
        if state is None:
            return super()._model_call(inps, attn_mask=attn_mask, labels=labels)
        state.query_start = self._answer_starts(inps)
        try:
            return super()._model_call(inps, attn_mask=attn_mask, labels=labels)
        finally:
            state.query_start = None

    def method_info(self) -> dict:
        state = poshidden.SLOT.find(self.model)
        return {"poshidden": (
            {"channels": state.channels, "factor": state.factor, "layers": state.layers, "setting": self._poshidden["setting"]}
            if state is not None else {"factor": 1.0, "plain": True}
        )}


class FitMLM(RightPaddedRowsMixin, MethodLM):
    """HFLM with Found-in-the-Middle attention calibration.

    ``--model_args``: ``strength`` (default 1; 0 is the plain model), ``temperature`` (5e-5),
    ``num_spans`` (10), ``spans_per_copy`` (1, the paper's; ``num_spans``: one dummy copy for all),
    ``region`` (``0.05:0.95``), ``layers`` (default: the last half), ``dummy`` (the dummy span's text);
    every HFLM argument.
    """

    method = "fitm"

    def before_load(self, load: dict, *, strength: Any = 1.0, temperature: Any = 5e-5, num_spans: Any = 10,
                    region: Any = None, layers: Any = None, dummy: str = fitm.DUMMY_TEXT, spans_per_copy: Any = 1) -> dict:
        strength, temperature, num_spans, region, spans_per_copy = fitm.check_arguments(
            strength, temperature, num_spans, region, spans_per_copy, layers)
        if not str(dummy).strip():
            raise MethodError(f"fitm_hf: dummy={dummy!r} is empty; give the dummy span's text")
        return {"strength": strength, "temperature": temperature, "num_spans": num_spans, "region": region,
                "layers": layers, "dummy": dummy, "spans_per_copy": spans_per_copy}

    def after_load(self, checked: dict) -> None:
        self._fitm = checked
        if checked["strength"] != fitm.STRENGTH.identity:  # the dummy span's tokens need the loaded tokenizer
            dummy_ids = self.tokenizer(str(checked["dummy"]), add_special_tokens=False)["input_ids"]
            fitm.install(self.model, checked["strength"], checked["temperature"], checked["num_spans"],
                         checked["region"], checked["layers"], dummy_ids, checked["spans_per_copy"])

    def _installed(self) -> bool:
        return fitm.SLOT.find(self.model) is not None

    def _model_call(self, inps, attn_mask=None, labels=None):
        if not self._installed():
            return super()._model_call(inps, attn_mask=attn_mask, labels=labels)
        with torch.no_grad():
            return fitm.forward_logits(self.model, inps, query_start=self._answer_starts(inps))

    def _model_generate(self, context, max_length, stop, **generation_kwargs):
        if not self._installed():
            return super()._model_generate(context, max_length, stop, **generation_kwargs)
        _greedy_only("fitm_hf", generation_kwargs)
        criteria = stop_sequences_criteria(self.tokenizer, stop, context.shape[1], context.shape[0])
        with torch.no_grad():
            return fitm.generate(self.model, context, attention_mask=generation_kwargs.get("attention_mask"),
                                 max_length=max_length, stopping_criteria=criteria,
                                 pad_token_id=self.tokenizer.pad_token_id)

    def method_info(self) -> dict:
        return {"fitm": dict(self._fitm, region=list(self._fitm["region"]))}


class PCDLM(AnswerLogitsLoglikelihoodMixin, MethodLM):
    """HFLM decoding from the contrast of the model's logits with a lowered-RoPE-base copy's (PCD).

    ``--model_args``: ``base_ratio`` (the copy's base over theta, each layer type's on Gemma-3; default 0.1),
    ``weight`` (default 0.5; 0 is the plain model); every HFLM argument. At the identity nothing is
    installed and every request takes HFLM's own path: vanilla's answers, bit for bit.
    """

    method = "pcd"

    def after_load(self, arguments: dict) -> None:
        self._pcd = dict(zip(("base_ratio", "weight"), pcd.check_arguments(**arguments)))
        if not pcd.is_identity(**self._pcd):
            pcd.install(self.model, **self._pcd)

    def _installed(self) -> bool:
        return pcd.SLOT.find(self.model) is not None

    def loglikelihood(self, requests, disable_tqdm: bool = False):
        if not self._installed():
            return MethodLM.loglikelihood(self, requests, disable_tqdm=disable_tqdm)
        return super().loglikelihood(requests, disable_tqdm=disable_tqdm)

    def answer_logits(self, input_ids, rows, columns):
        """``loglikelihood``'s logits: the two copies contrasted at the answer positions only."""
        with torch.no_grad():
            return pcd.answer_logits(self.model, input_ids, rows, columns)

    def _model_call(self, inps, attn_mask=None, labels=None):
        if not self._installed():
            return super()._model_call(inps, attn_mask=attn_mask, labels=labels)
        with torch.no_grad():
            return pcd.forward_logits(self.model, inps)

    def _model_generate(self, context, max_length, stop, **generation_kwargs):
        if not self._installed():
            return super()._model_generate(context, max_length, stop, **generation_kwargs)
        _greedy_only("pcd_hf", generation_kwargs)
        criteria = stop_sequences_criteria(self.tokenizer, stop, context.shape[1], context.shape[0])
        with torch.no_grad():
            return pcd.generate(self.model, context, attention_mask=generation_kwargs.get("attention_mask"),
                                max_length=max_length, stopping_criteria=criteria, pad_token_id=self.tokenizer.pad_token_id)

    def method_info(self) -> dict:
        return {"pcd": pcd.settings(self.model) if self._installed() else {**self._pcd, "plain": True}}
