"""The lm-eval internals this package relies on, each a named check.

``tests/test_lmeval_contract.py`` runs :func:`broken_assumptions` against the installed
lm-eval (pinned to :data:`lpes_harness.lmeval.LM_EVAL_VERSION`): after an upgrade it names
each assumption that no longer holds and the module of ours that makes it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable


# (assumption, who relies on it, check), in the order they are checked
ASSUMPTIONS: list[tuple[str, str, Callable[[], bool]]] = []


def _assumption(who: str):
    def register(check: Callable[[], bool]) -> Callable[[], bool]:
        ASSUMPTIONS.append((check.__doc__, who, check))
        return check

    return register


def _params(function) -> list[str]:
    return list(inspect.signature(function).parameters)


@_assumption("pyproject.toml")
def _version() -> bool:
    """lm_eval is the pinned version"""
    from importlib.metadata import version

    from lpes_harness.lmeval import LM_EVAL_VERSION

    return version("lm_eval") == LM_EVAL_VERSION


@_assumption("lpes_harness/lmeval/registration.py")
def _registry() -> bool:
    """lm_eval.api.registry.model_registry.register(name, target=...) takes lazy 'module:Class' targets"""
    from lm_eval.api import registry

    return hasattr(registry, "model_registry") and "target" in _params(registry.model_registry.register)


@_assumption("lpes_harness/lmeval/registration.py")
def _entry_point_targets() -> bool:
    """the registry's lazy targets may also be EntryPoint objects, loaded with .load() (attribute paths)"""
    from lm_eval.api import registry

    return "ph.load()" in inspect.getsource(registry._materialise_placeholder)


@_assumption("lpes_harness/lmeval/registration.py")
def _task_manager() -> bool:
    """TaskManager.__init__ takes include_path, include_defaults, metadata"""
    from lm_eval.tasks.manager import TaskManager

    return {"include_path", "include_defaults", "metadata"} <= set(_params(TaskManager.__init__))


@_assumption("lpes_harness/lmeval/registration.py")
def _simple_evaluate() -> bool:
    """simple_evaluate(model, model_args, ..., tasks, metadata, task_manager)"""
    from lm_eval import evaluator

    original = getattr(evaluator.simple_evaluate, "__wrapped__", evaluator.simple_evaluate)
    params = _params(original)
    return params[:2] == ["model", "model_args"] and {"tasks", "metadata", "task_manager"} <= set(params)


@_assumption("lpes_harness/lmeval/tasks.py")
def _model_args_in_metadata() -> bool:
    """simple_evaluate merges model_args into the TaskManager's metadata"""
    from lm_eval import evaluator

    original = getattr(evaluator.simple_evaluate, "__wrapped__", evaluator.simple_evaluate)
    source = inspect.getsource(original)
    return "simple_parse_args_string(model_args)" in source and "TaskManager(metadata=metadata)" in source


@_assumption("lpes_harness/lmeval/registration.py")
def _parse_args_string() -> bool:
    """lm_eval.utils.simple_parse_args_string parses 'k=v,k=v'"""
    from lm_eval.utils import simple_parse_args_string

    return simple_parse_args_string("a=1,b=x") == {"a": 1, "b": "x"}


@_assumption("lpes_harness/lmeval/registration.py")
def _from_cli() -> bool:
    """EvaluatorConfig.from_cli is a classmethod and the config has model, model_args"""
    from lm_eval.config.evaluate_config import EvaluatorConfig

    fields = getattr(EvaluatorConfig, "__dataclass_fields__", {})
    return isinstance(inspect.getattr_static(EvaluatorConfig, "from_cli"), classmethod) and {"model", "model_args"} <= set(fields)


@_assumption("lpes_harness/lmeval/tasks.py")
def _custom_kwargs_warning() -> bool:
    """ConfigurableTask.download logs the custom-kwargs warning on lm_eval.api.task"""
    from lm_eval.api import task

    from lpes_harness.lmeval.tasks import CUSTOM_KWARGS_WARNING, LM_EVAL_TASK_LOGGER

    source = inspect.getsource(task.ConfigurableTask.download)
    return task.eval_logger.name == LM_EVAL_TASK_LOGGER and CUSTOM_KWARGS_WARNING in source


@_assumption("lpes_harness/lmeval/position_scorer.py")
def _fewshot_context() -> bool:
    """ConfigurableTask.fewshot_context takes num_fewshot, apply_chat_template, chat_template, gen_prefix"""
    from lm_eval.api.task import ConfigurableTask

    return {"num_fewshot", "apply_chat_template", "chat_template", "gen_prefix"} <= set(
        _params(ConfigurableTask.fewshot_context)
    ) and hasattr(ConfigurableTask, "doc_to_prefix")


@_assumption("lpes_harness/lmeval/requests.py")
def _instance() -> bool:
    """Instance(request_type, doc, arguments, idx)"""
    from lm_eval.api.instance import Instance

    return _params(Instance)[:4] == ["request_type", "doc", "arguments", "idx"]


@_assumption("lpes_harness/lmeval/requests.py")
def _encode_pair() -> bool:
    """HFLM._encode_pair(context, continuation)"""
    from lm_eval.models.huggingface import HFLM

    return _params(HFLM._encode_pair)[1:3] == ["context", "continuation"]


@_assumption("lpes_harness/lmeval/hflm.py")
def _loglikelihood_tokens() -> bool:
    """HFLM._loglikelihood_tokens(requests, ...)"""
    from lm_eval.models.huggingface import HFLM

    return _params(HFLM._loglikelihood_tokens)[1] == "requests"


@_assumption("lpes_harness/lmeval/hflm.py")
def _pad_id() -> bool:
    """HFLM right-pads loglikelihood batches with token 0 (pad_and_concat)"""
    from lm_eval.models import huggingface

    from lpes_harness.lmeval.hflm import LOGLIKELIHOOD_PAD_ID

    source = inspect.getsource(huggingface.pad_and_concat)
    return LOGLIKELIHOOD_PAD_ID == 0 and "torch.zeros" in source and "pad_and_concat(" in inspect.getsource(
        huggingface.HFLM._loglikelihood_tokens
    )


@_assumption("lpes_harness/lmeval/requests.py")
def _loglikelihood_tokens_of_requests() -> bool:
    """TemplateLM.loglikelihood: an empty context is prefix_token_id, any other goes through _encode_pair"""
    from lm_eval.api.model import TemplateLM

    source = inspect.getsource(TemplateLM.loglikelihood)
    return "self.prefix_token_id" in source and "self._encode_pair(context, continuation)" in source


@_assumption("lpes_harness/lmeval/hflm.py")
def _cache_hook() -> bool:
    """LM.cache_hook.add_partial(attr, req, res)"""
    from lm_eval.api.model import CacheHook

    return _params(CacheHook.add_partial)[1:4] == ["attr", "req", "res"]


@_assumption("lpes_harness/lmeval/method_models.py")
def _model_hooks() -> bool:
    """HFLM._model_call(inps, attn_mask, labels) and _model_generate(context, max_length, stop, **kwargs)"""
    from lm_eval.models.huggingface import HFLM

    return _params(HFLM._model_call)[1:4] == ["inps", "attn_mask", "labels"] and _params(HFLM._model_generate)[1:4] == [
        "context", "max_length", "stop"]


@_assumption("lpes_harness/lmeval/method_models.py")
def _stop_criteria() -> bool:
    """lm_eval.models.utils_hf.stop_sequences_criteria(tokenizer, stop, initial_length, batch_size)"""
    from lm_eval.models.utils_hf import stop_sequences_criteria

    return len(_params(stop_sequences_criteria)) == 4


def broken_assumptions() -> list[str]:
    """One line per assumption that does not hold for the installed lm-eval."""
    broken = []
    for assumption, who, check in ASSUMPTIONS:
        try:
            holds = check()
        except Exception as err:  # an import or attribute that moved
            holds, assumption = False, f"{assumption} ({type(err).__name__}: {err})"
        if not holds:
            broken.append(f"{assumption} [relied on by {who}]")
    return broken
