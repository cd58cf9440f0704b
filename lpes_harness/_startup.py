"""Start-up hook: make lm-eval see our models and tasks without importing anything heavy.

lm-eval 0.4.13 discovers models only through its own ``MODEL_MAPPING`` and tasks only
in its own folder plus ``--include_path``; it reads no entry points. A ``.pth`` file
imports this module at every interpreter start-up, so it must cost almost nothing: it
only puts a finder on ``sys.meta_path`` that waits for two lm-eval modules to be
executed, then

- after ``lm_eval.api.registry``: adds *lazy* registry entries (``"module:Class"``
  strings) for our models, so torch is imported only when one of them is used;
- after ``lm_eval.tasks.manager``: makes every ``TaskManager`` that includes lm-eval's
  default tasks also include ours, so ``--tasks kv_retrieval`` works without
  ``--include_path``;
- after ``lm_eval.evaluator``: checks the options and data files of our position tasks,
  and ``lpes_hf``'s scale arguments, before ``simple_evaluate`` loads the model (it builds
  tasks only after the model);
- after ``lm_eval.config.evaluate_config``: checks ``lpes_hf``'s scale arguments as soon as
  the command line is read, before lm-eval indexes its tasks (seconds) or loads the model: a
  bad value ends the command with exit code 2 and one line, like an argparse ``error:``.

Set ``LPES_NO_AUTO_TASKS=1`` to keep lm-eval's task list untouched.
"""

import os
import sys

# name -> "module:Class"; lm-eval imports the target on first use.
LAZY_MODELS = {
    "lpes_hf": "lpes_harness.lm:LPESLM",
    "mspoe_hf": "lpes_harness.baselines.mspoe:MsPoELM",
    "buckets_hf": "lpes_harness.baselines.buckets:BucketsLM",
    "moice_hf": "lpes_harness.baselines.moice:MoICELM",
}


def register_lazy_models(registry_module) -> None:
    # lm-eval fills its registry with the built-in models only when it finds the
    # registry empty; ours would make it non-empty, so load the built-ins first
    # (lm_eval.models is a name -> "module:Class" table: cheap, no torch).
    import lm_eval.models  # noqa: F401

    registry = registry_module.model_registry
    for name, target in LAZY_MODELS.items():
        if name not in registry:
            registry.register(name, target=target)


def our_tasks_dir():
    from lpes_harness.tasks import TASKS_DIR

    return TASKS_DIR if TASKS_DIR.is_dir() else None


def add_our_tasks_to_task_manager(manager_module) -> None:
    if os.environ.get("LPES_NO_AUTO_TASKS"):
        return
    task_manager = manager_module.TaskManager
    original_init = task_manager.__init__
    if getattr(original_init, "_lpes_wrapped", False):
        return

    def __init__(self, verbosity=None, include_path=None, include_defaults=True, metadata=None):
        tasks_dir = our_tasks_dir() if include_defaults else None
        if tasks_dir is not None:
            paths = [] if include_path is None else list(include_path) if isinstance(include_path, (list, tuple)) else [include_path]
            from pathlib import Path

            if all(Path(p).resolve() != tasks_dir.resolve() for p in paths):
                # Ours first: a user's --include_path still overrides a same-named task.
                include_path = [str(tasks_dir), *paths]
        original_init(self, verbosity=verbosity, include_path=include_path, include_defaults=include_defaults, metadata=metadata)

    __init__._lpes_wrapped = True
    __init__.__doc__ = original_init.__doc__
    task_manager.__init__ = __init__


# Models whose arguments are lpes_hf's (scales, control_points, curve, pi).
SCALES_MODELS = ("lpes_hf",)


def model_args_error(model, model_args):
    """One line saying what is wrong with ``model_args`` for one of our models, or None.

    Cheap: no torch; the layer count comes from the model's config.json or GGUF header.
    """
    if not isinstance(model, str) or model not in SCALES_MODELS or not model_args:
        return None
    if isinstance(model_args, str):
        from lm_eval.utils import simple_parse_args_string

        model_args = simple_parse_args_string(model_args)
    from lpes_harness.scales_file import check_model_args

    try:
        check_model_args(model_args)
    except ValueError as err:
        return " ".join(str(err).split())
    except Exception:  # a bug of ours must not stop lm-eval: the model load checks again
        return None
    return None


def check_position_tasks_before_the_model_loads(evaluator_module) -> None:
    """simple_evaluate loads the model before the tasks: check our tasks' options first."""
    original = evaluator_module.simple_evaluate
    if getattr(original, "_lpes_wrapped", False):
        return
    import functools

    @functools.wraps(original)
    def simple_evaluate(*args, **kwargs):
        from lpes_harness.tasks.position import precheck

        task_manager = kwargs.get("task_manager")
        metadata = kwargs.get("metadata") or getattr(task_manager, "metadata", None)
        model = kwargs.get("model", args[0] if args else None)
        error = model_args_error(model, kwargs.get("model_args", args[1] if len(args) > 1 else None))
        if error:
            from lpes_harness.scales_file import ScalesError

            raise ScalesError(error)
        precheck(kwargs.get("tasks"), metadata, kwargs.get("model_args"))
        return original(*args, **kwargs)

    simple_evaluate._lpes_wrapped = True
    evaluator_module.simple_evaluate = simple_evaluate


def check_model_args_on_the_command_line(config_module) -> None:
    """lm_eval's command line: a bad lpes_hf scale argument exits 2 before tasks or model load."""
    config_class = config_module.EvaluatorConfig
    if getattr(config_class.from_cli, "_lpes_wrapped", False):
        return
    import functools

    original = config_class.from_cli.__func__

    @functools.wraps(original)
    def from_cli(cls, namespace):
        config = original(cls, namespace)
        error = model_args_error(config.model, config.model_args)
        if error:
            sys.stderr.write(f"{_program()}: error: argument --model_args: {error}\n")
            raise SystemExit(2)
        return config

    from_cli._lpes_wrapped = True
    config_class.from_cli = classmethod(from_cli)


def _program() -> str:
    name = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "lm_eval"
    return "lm_eval" if name in ("__main__.py", "-c", "") else name


# module name -> what to run right after lm-eval executes it
_AFTER_IMPORT = {
    "lm_eval.api.registry": register_lazy_models,
    "lm_eval.tasks.manager": add_our_tasks_to_task_manager,
    "lm_eval.evaluator": check_position_tasks_before_the_model_loads,
    "lm_eval.config.evaluate_config": check_model_args_on_the_command_line,
}


class _LmEvalWatcher:
    """Wraps the loaders of the watched lm-eval modules to run our code after them.

    A plain class (sys.meta_path needs only ``find_spec``): importing ``importlib.abc``
    would pull in pathlib, tempfile and typing, ~15 ms on every Python start.
    """

    def find_spec(self, fullname, path=None, target=None):
        after = _AFTER_IMPORT.get(fullname)
        if after is None:
            return None
        # Ask the other finders for the real spec, skipping ourselves.
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _PostExecLoader(spec.loader, after)
                return spec
        return None


class _PostExecLoader:
    def __init__(self, loader, after):
        self._loader = loader
        self._after = after

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        try:
            self._after(module)
        except Exception as err:  # never break lm-eval because of us
            print(f"lpes-harness: could not hook into {module.__name__}: {err}", file=sys.stderr)

    def __getattr__(self, name):
        return getattr(self._loader, name)


def install() -> None:
    for name, after in _AFTER_IMPORT.items():
        if name in sys.modules:  # already imported: act directly
            after(sys.modules[name])
    if not any(isinstance(f, _LmEvalWatcher) for f in sys.meta_path):
        sys.meta_path.insert(0, _LmEvalWatcher())


install()
