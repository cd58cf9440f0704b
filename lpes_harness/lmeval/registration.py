"""Registration with lm-eval: lazy models, our tasks, and the early checks.

Run right after lm-eval executes each of the modules in :data:`AFTER_IMPORT` (the ``.pth``
hook's finder in :mod:`lpes_harness.lmeval.startup` calls :func:`after_import`), or at once for the
ones already imported (:func:`lpes_harness.lmeval.startup.install`, what ``lpes-eval`` calls):

- ``lm_eval.api.registry``: *lazy* registry entries (``"module:Class"`` strings) for our
  models, one per lm-eval name of the table of methods (:data:`lpes_harness.methods.METHODS`),
  so torch is imported only when one of them is used;
- ``lm_eval.tasks.manager``: every ``TaskManager`` that includes lm-eval's default tasks also
  includes ours, so ``--tasks kv_retrieval`` works without ``--include_path``
  (``LPES_NO_AUTO_TASKS=1`` turns that off);
- ``lm_eval.evaluator``: ``simple_evaluate`` checks ``lpes_hf``'s scale arguments and our
  position tasks' options and data files before it loads the model, and publishes the model
  args in :data:`~lpes_harness.lmeval.model_args.MODEL_ARGS` while it runs (the task glue
  tolerates those keys in metadata);
- ``lm_eval.config.evaluate_config``: on the command line, a ``pretrained`` that cannot be a model
  (:mod:`lpes_harness.core.model_source`), a ``dtype`` torch lacks (any of our models), a bad
  ``lpes_hf`` scale argument or another method's argument, a bad ``--metadata`` of our position
  tasks or a suite's data files not found exits 2 with one line, before lm-eval indexes its tasks
  or loads the model.

Every patched callable passes ``*args, **kwargs`` through untouched, so a keyword lm-eval adds
later reaches the original.
"""

from __future__ import annotations

import functools
import os
import sys

from lpes_harness.lmeval.model_args import MODEL_ARGS, parse_model_args
from lpes_harness.methods import lm_eval_models

# name -> "module:attribute", from the table of methods; lm-eval imports the target on first use.
LAZY_MODELS = lm_eval_models()

# Models whose arguments are lpes_hf's (scales, control_points, curve, pi).
SCALES_MODELS = ("lpes_hf",)

_WRAPPED = "_lpes_wrapped"


def register_lazy_models(registry_module) -> None:
    # lm-eval fills its registry with the built-in models only when it finds the
    # registry empty; ours would make it non-empty, so load the built-ins first
    # (lm_eval.models is a name -> "module:Class" table: cheap, no torch).
    import lm_eval.models  # noqa: F401

    registry = registry_module.model_registry
    for name, target in LAZY_MODELS.items():
        if name not in registry:
            registry.register(name, target=lazy_target(name, target))


def lazy_target(name: str, target: str):
    """lm-eval's lazy placeholder for ``"module:attribute"``: the string itself, which lm-eval reads
    with one ``getattr``, or for an attribute path (``method_lm:BOUND.string``) an entry point,
    the other placeholder lm-eval's registry takes, which follows the path."""
    if "." not in target.partition(":")[2]:
        return target
    from importlib.metadata import EntryPoint

    return EntryPoint(name=name, value=target, group="lm_eval.models")


def our_tasks_dir():
    from lpes_harness.tasks import TASKS_DIR

    return TASKS_DIR if TASKS_DIR.is_dir() else None


def _bind(original, args, kwargs, name, default):
    """The value of parameter ``name`` in a call of ``original`` (positional or keyword)."""
    import inspect

    try:
        bound = inspect.signature(original).bind_partial(*args, **kwargs)
    except TypeError:
        return default
    return bound.arguments.get(name, default)


def _with_our_tasks(include_path, include_defaults):
    tasks_dir = our_tasks_dir() if include_defaults else None
    if tasks_dir is None:
        return include_path
    from pathlib import Path

    paths = [] if include_path is None else list(include_path) if isinstance(include_path, (list, tuple)) else [include_path]
    if any(Path(p).resolve() == tasks_dir.resolve() for p in paths):
        return include_path
    return [str(tasks_dir), *paths]  # ours first: a user's --include_path still overrides a same-named task


def add_our_tasks_to_task_manager(manager_module) -> None:
    if os.environ.get("LPES_NO_AUTO_TASKS"):
        return
    task_manager = manager_module.TaskManager
    original_init = task_manager.__init__
    if getattr(original_init, _WRAPPED, False):
        return

    @functools.wraps(original_init)
    def __init__(self, *args, **kwargs):
        import inspect

        bound = inspect.signature(original_init).bind(self, *args, **kwargs)
        include_defaults = bound.arguments.get("include_defaults", True)
        include_path = _with_our_tasks(bound.arguments.get("include_path"), include_defaults)
        if include_path is not bound.arguments.get("include_path"):
            bound.arguments["include_path"] = include_path
        original_init(*bound.args, **bound.kwargs)

    setattr(__init__, _WRAPPED, True)
    task_manager.__init__ = __init__


def model_args_error(model, model_args) -> str | None:
    """:func:`model_args_problem` as one line, or None."""
    problem = model_args_problem(model, model_args)
    return None if problem is None else " ".join(str(problem).split())


def model_args_problem(model, model_args) -> ValueError | None:
    """What is wrong with ``model_args`` for one of our models (not raised), or None: the ``pretrained``
    (and ``gguf_file``) and ``dtype`` of any of them (a ScalesError, as lm-eval's caller has long caught),
    lpes_hf's scale arguments (ScalesError), the other methods' own arguments (their MethodError, as
    their model's ``__init__`` raised it: :func:`method_arguments_error`), an LPES curve under a method
    (``lpes_scales=``: :mod:`.lpes_stack`; on lpes_hf, refused as its class refuses it).

    lpes_hf's are cheap, no torch (the layer count comes from the model's config.json or GGUF
    header); another method's check imports its model class, and with it torch and transformers,
    as lm-eval would a moment later.
    """
    if not isinstance(model, str) or model not in LAZY_MODELS:
        return None
    from lpes_harness.core.model_source import pretrained_problem
    from lpes_harness.core.models import check_dtype
    from lpes_harness.core.scales_args import check_model_args
    from lpes_harness.core.scales_file import ScalesError
    from lpes_harness.lmeval.lpes_stack import STACK_ARGUMENTS

    try:
        parsed = parse_model_args(model_args) if model_args else {}
        problem = pretrained_problem(parsed.get("pretrained"), parsed.get("gguf_file"))
        if problem:
            return ScalesError(f"pretrained={problem}")  # the problem starts with the path as typed
        check_dtype(parsed.get("dtype"))
        if model in SCALES_MODELS:
            check_model_args(parsed)
            if set(STACK_ARGUMENTS) & set(parsed):  # refused by lpes_hf's class, in its words
                method_arguments_error(model, parsed)
        else:
            method_arguments_error(model, parsed)
    except ScalesError as err:
        return err
    except ValueError as err:  # check_dtype's, a method's MethodError
        return err if type(err) is not ValueError else ScalesError(" ".join(str(err).split()))
    except Exception:  # a bug of ours must not stop lm-eval: the model load checks again
        return None
    return None


def method_arguments_error(model: str, parsed: dict) -> None:
    """Run the pre-load checks of ``model``'s class (:meth:`~lpes_harness.lmeval.method_lm.MethodLM.prepare`:
    an LPES curve under it, then its ``before_load``) on ``parsed`` now: a :class:`~lpes_harness.methods.arguments.MethodError` (a ValueError) is then one
    line of the command line's, not a traceback out of the model's ``__init__`` after lm-eval has
    indexed its tasks (poshidden_hf without a channel: 33 lines after 16 s)."""
    import importlib

    module, _, attribute = LAZY_MODELS[model].partition(":")
    lm_class = importlib.import_module(module)
    for part in attribute.split("."):
        lm_class = getattr(lm_class, part)
    if not hasattr(lm_class, "prepare"):
        return
    own = lm_class.taken_arguments()
    arguments = {name: value for name, value in parsed.items() if name in own}
    load = {name: value for name, value in parsed.items() if name not in own}
    # prepare reads the arguments and the class, never the model: an instance not yet initialised will do.
    lm_class.prepare(lm_class.__new__(lm_class), load, **arguments)


def metadata_error(tasks, metadata, model_args) -> str | None:
    """One line saying what is wrong with ``--metadata`` for our position tasks in ``tasks``, or with
    where our suites' data files are, or None.

    Cheap: options are checked, a position task's given ``data_path`` is read and a suite's files
    looked up; no torch, no model."""
    from lpes_harness.lmeval.tasks import precheck
    from lpes_harness.tasks.data import TaskDataError

    try:
        precheck(tasks, metadata, model_args)
    except TaskDataError as err:
        return " ".join(str(err).split())
    return None


def check_position_tasks_before_the_model_loads(evaluator_module) -> None:
    """simple_evaluate loads the model before the tasks: check our tasks' options first."""
    original = evaluator_module.simple_evaluate
    if getattr(original, _WRAPPED, False):
        return

    @functools.wraps(original)
    def simple_evaluate(*args, **kwargs):
        from lpes_harness.lmeval.tasks import precheck

        model = _bind(original, args, kwargs, "model", None)
        model_args = _bind(original, args, kwargs, "model_args", None)
        problem = model_args_problem(model, model_args)
        if problem is not None:
            raise problem
        task_manager = _bind(original, args, kwargs, "task_manager", None)
        metadata = _bind(original, args, kwargs, "metadata", None) or getattr(task_manager, "metadata", None)
        parsed = parse_model_args(model_args)
        precheck(_bind(original, args, kwargs, "tasks", None), metadata, parsed)
        token = MODEL_ARGS.set(parsed)
        try:
            return original(*args, **kwargs)
        finally:
            MODEL_ARGS.reset(token)

    setattr(simple_evaluate, _WRAPPED, True)
    evaluator_module.simple_evaluate = simple_evaluate


def check_model_args_on_the_command_line(config_module) -> None:
    """lm_eval's command line: what :func:`model_args_error` and :func:`metadata_error` find exits 2
    with one line, as argparse does, before tasks or model load (the same checks in
    ``simple_evaluate`` would raise them as a traceback)."""
    config_class = config_module.EvaluatorConfig
    if getattr(config_class.from_cli, _WRAPPED, False):
        return
    original = config_class.from_cli.__func__

    @functools.wraps(original)
    def from_cli(cls, *args, **kwargs):
        config = original(cls, *args, **kwargs)
        # A task's data not found with no --metadata given: the message says where it looked ($LPES_DATA,
        # ../shared/data), and no argument is to blame.
        for argument, error in (("argument --model_args: ", model_args_error(config.model, config.model_args)),
                                ("argument --metadata: " if config.metadata else "",
                                 metadata_error(config.tasks, config.metadata, config.model_args))):
            if error:
                sys.stderr.write(f"{_program()}: error: {argument}{error}\n")
                raise SystemExit(2)
        return config

    setattr(from_cli, _WRAPPED, True)
    config_class.from_cli = classmethod(from_cli)


def _program() -> str:
    name = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "lm_eval"
    return "lm_eval" if name in ("__main__.py", "-c", "") else name


# module name -> what to run right after lm-eval executes it
AFTER_IMPORT = {
    "lm_eval.api.registry": register_lazy_models,
    "lm_eval.tasks.manager": add_our_tasks_to_task_manager,
    "lm_eval.evaluator": check_position_tasks_before_the_model_loads,
    "lm_eval.config.evaluate_config": check_model_args_on_the_command_line,
}


def after_import(module) -> None:
    """Our patch of one just-executed lm-eval module (a no-op for any other module)."""
    patch = AFTER_IMPORT.get(module.__name__)
    if patch is not None:
        patch(module)
