"""The lm-eval internals this package relies on, each a named check.

``tests/test_lmeval_contract.py`` runs :func:`broken_assumptions` against the installed
lm-eval (pinned to :data:`lpes_harness.lmeval.LM_EVAL_VERSION`): after an upgrade it names
each assumption that no longer holds and the module of ours that makes it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable


def _params(function) -> list[str]:
    return list(inspect.signature(function).parameters)


def _version() -> bool:
    from importlib.metadata import version

    from lpes_harness.lmeval import LM_EVAL_VERSION

    return version("lm_eval") == LM_EVAL_VERSION


def _registry() -> bool:
    from lm_eval.api import registry

    return hasattr(registry, "model_registry") and "target" in _params(registry.model_registry.register)


def _task_manager() -> bool:
    from lm_eval.tasks.manager import TaskManager

    return {"include_path", "include_defaults", "metadata"} <= set(_params(TaskManager.__init__))


def _simple_evaluate() -> bool:
    from lm_eval import evaluator

    original = getattr(evaluator.simple_evaluate, "__wrapped__", evaluator.simple_evaluate)
    params = _params(original)
    return params[:2] == ["model", "model_args"] and {"tasks", "metadata", "task_manager"} <= set(params)


def _model_args_in_metadata() -> bool:
    from lm_eval import evaluator

    original = getattr(evaluator.simple_evaluate, "__wrapped__", evaluator.simple_evaluate)
    source = inspect.getsource(original)
    return "simple_parse_args_string(model_args)" in source and "TaskManager(metadata=metadata)" in source


def _parse_args_string() -> bool:
    from lm_eval.utils import simple_parse_args_string

    return simple_parse_args_string("a=1,b=x") == {"a": 1, "b": "x"}


def _from_cli() -> bool:
    from lm_eval.config.evaluate_config import EvaluatorConfig

    fields = getattr(EvaluatorConfig, "__dataclass_fields__", {})
    return isinstance(inspect.getattr_static(EvaluatorConfig, "from_cli"), classmethod) and {"model", "model_args"} <= set(fields)


def _custom_kwargs_warning() -> bool:
    from lm_eval.api import task

    from lpes_harness.lmeval.tasks import CUSTOM_KWARGS_WARNING, LM_EVAL_TASK_LOGGER

    source = inspect.getsource(task.ConfigurableTask.download)
    return task.eval_logger.name == LM_EVAL_TASK_LOGGER and CUSTOM_KWARGS_WARNING in source


def _fewshot_context() -> bool:
    from lm_eval.api.task import ConfigurableTask

    return {"num_fewshot", "apply_chat_template", "chat_template", "gen_prefix"} <= set(
        _params(ConfigurableTask.fewshot_context)
    ) and hasattr(ConfigurableTask, "doc_to_prefix")


def _instance() -> bool:
    from lm_eval.api.instance import Instance

    return _params(Instance)[:4] == ["request_type", "doc", "arguments", "idx"]


def _encode_pair() -> bool:
    from lm_eval.models.huggingface import HFLM

    return _params(HFLM._encode_pair)[1:3] == ["context", "continuation"]


def _loglikelihood_tokens() -> bool:
    from lm_eval.models.huggingface import HFLM

    return _params(HFLM._loglikelihood_tokens)[1] == "requests"


def _pad_id() -> bool:
    from lm_eval.models import huggingface

    from lpes_harness.lmeval.hflm import LOGLIKELIHOOD_PAD_ID

    source = inspect.getsource(huggingface.pad_and_concat)
    return LOGLIKELIHOOD_PAD_ID == 0 and "torch.zeros" in source and "pad_and_concat(" in inspect.getsource(
        huggingface.HFLM._loglikelihood_tokens
    )


# assumption -> (who relies on it, check)
ASSUMPTIONS: dict[str, tuple[str, Callable[[], bool]]] = {
    "lm_eval is the pinned version": ("pyproject.toml", _version),
    "lm_eval.api.registry.model_registry.register(name, target=...) takes lazy 'module:Class' targets": (
        "lpes_harness/lmeval/registration.py", _registry),
    "TaskManager.__init__ takes include_path, include_defaults, metadata": ("lpes_harness/lmeval/registration.py", _task_manager),
    "simple_evaluate(model, model_args, ..., tasks, metadata, task_manager)": ("lpes_harness/lmeval/registration.py", _simple_evaluate),
    "simple_evaluate merges model_args into the TaskManager's metadata": ("lpes_harness/lmeval/tasks.py", _model_args_in_metadata),
    "lm_eval.utils.simple_parse_args_string parses 'k=v,k=v'": ("lpes_harness/lmeval/registration.py", _parse_args_string),
    "EvaluatorConfig.from_cli is a classmethod and the config has model, model_args": (
        "lpes_harness/lmeval/registration.py", _from_cli),
    "ConfigurableTask.download logs the custom-kwargs warning on lm_eval.api.task": (
        "lpes_harness/lmeval/tasks.py", _custom_kwargs_warning),
    "ConfigurableTask.fewshot_context takes num_fewshot, apply_chat_template, chat_template, gen_prefix": (
        "lpes_harness/search/fitness.py", _fewshot_context),
    "Instance(request_type, doc, arguments, idx)": ("lpes_harness/lmeval/requests.py", _instance),
    "HFLM._encode_pair(context, continuation)": ("lpes_harness/lmeval/requests.py", _encode_pair),
    "HFLM._loglikelihood_tokens(requests, ...)": ("lpes_harness/lmeval/hflm.py", _loglikelihood_tokens),
    "HFLM right-pads loglikelihood batches with token 0 (pad_and_concat)": ("lpes_harness/lmeval/hflm.py", _pad_id),
}


def broken_assumptions() -> list[str]:
    """One line per assumption that does not hold for the installed lm-eval."""
    broken = []
    for assumption, (who, check) in ASSUMPTIONS.items():
        try:
            holds = check()
        except Exception as err:  # an import or attribute that moved
            holds, assumption = False, f"{assumption} ({type(err).__name__}: {err})"
        if not holds:
            broken.append(f"{assumption} [relied on by {who}]")
    return broken
