"""The lm-eval internals we rely on still hold (lm-eval pinned to 0.4.13), and the glue uses no frames."""

import logging

from lpes_harness.lmeval import startup as _startup
from lpes_harness.lmeval import contract, registration
from lpes_harness.lmeval import tasks as glue
from lpes_harness.lmeval.model_args import MODEL_ARGS


def test_every_lm_eval_assumption_holds():
    broken = contract.broken_assumptions()
    assert not broken, "lm-eval moved under us:\n  " + "\n  ".join(broken)


def test_the_startup_hook_watches_exactly_what_registration_patches():
    assert set(_startup.WATCHED) == set(registration.AFTER_IMPORT)


def test_model_args_reach_the_glue_through_a_context_variable_not_a_frame():
    assert glue.model_arg_names() == set()
    token = MODEL_ARGS.set({"pretrained": "x", "scales": 1.2})
    try:
        assert glue.model_arg_names() == {"pretrained", "scales"}
    finally:
        MODEL_ARGS.reset(token)
    assert glue.model_arg_names() == set()


def test_patched_signatures_pass_unknown_keywords_through():
    import types

    calls = []

    class TaskManager:
        def __init__(self, verbosity=None, include_path=None, include_defaults=True, metadata=None, future=None):
            calls.append((include_path, future))

    module = types.SimpleNamespace(TaskManager=TaskManager)
    registration.add_our_tasks_to_task_manager(module)
    TaskManager(include_defaults=False, future="kept")
    assert calls == [(None, "kept")]


def test_only_our_subtasks_custom_kwargs_warning_is_silenced():
    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    logger = logging.getLogger(glue.LM_EVAL_TASK_LOGGER)
    handler = Keep()
    logger.addHandler(handler)
    try:
        logger.warning("kv_retrieval_pos0: %s in console", glue.CUSTOM_KWARGS_WARNING)
        logger.warning("someone_elses_task: %s in console", glue.CUSTOM_KWARGS_WARNING)
        logger.warning("kv_retrieval_pos0: another warning")
    finally:
        logger.removeHandler(handler)
    assert records == [
        f"someone_elses_task: {glue.CUSTOM_KWARGS_WARNING} in console",
        "kv_retrieval_pos0: another warning",
    ]


def test_a_moved_internal_is_named_with_who_relies_on_it(monkeypatch):
    def moved():
        """HFLM._encode_pair(context, continuation)"""
        raise AttributeError("type object 'HFLM' has no attribute '_encode_pair'")

    monkeypatch.setattr(contract, "ASSUMPTIONS", [(moved.__doc__, "lpes_harness/lmeval/requests.py", moved)])
    assert contract.broken_assumptions() == [
        "HFLM._encode_pair(context, continuation) (AttributeError: type object 'HFLM' has no attribute "
        "'_encode_pair') [relied on by lpes_harness/lmeval/requests.py]"
    ]
