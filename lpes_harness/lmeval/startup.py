"""Start-up hook: make lm-eval see our models and tasks without importing anything heavy.

lm-eval 0.4.13 discovers models only through its own ``MODEL_MAPPING`` and tasks only
in its own folder plus ``--include_path``; it reads no entry points. A ``.pth`` file
imports this module at every interpreter start-up, so it must cost almost nothing: it
only puts a finder on ``sys.meta_path`` that waits for the lm-eval modules named in
:data:`WATCHED` to be executed, then hands each to
:func:`lpes_harness.lmeval.registration.after_import` (lazy model entries, our task folder,
the early checks of task options and ``lpes_hf``'s scale arguments; see that module).

Set ``LPES_NO_AUTO_TASKS=1`` to keep lm-eval's task list untouched.
"""

import sys

# What lpes_harness.lmeval.registration.AFTER_IMPORT patches (kept here so that start-up
# imports nothing of ours but this module; a test checks the two agree).
WATCHED = (
    "lm_eval.api.registry",
    "lm_eval.tasks.manager",
    "lm_eval.evaluator",
    "lm_eval.config.evaluate_config",
)


def _after(module) -> None:
    from lpes_harness.lmeval.registration import after_import

    after_import(module)


class _LmEvalWatcher:
    """Wraps the loaders of the watched lm-eval modules to run our code after them.

    A plain class (sys.meta_path needs only ``find_spec``): importing ``importlib.abc``
    would pull in pathlib, tempfile and typing, ~15 ms on every Python start.
    """

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in WATCHED:
            return None
        # Ask the other finders for the real spec, skipping ourselves.
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _PostExecLoader(spec.loader, _after)
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
    """Patch the watched lm-eval modules already imported, and watch for the others."""
    for name in WATCHED:
        if name in sys.modules:  # already imported: act directly
            _after(sys.modules[name])
    if not any(isinstance(f, _LmEvalWatcher) for f in sys.meta_path):
        sys.meta_path.insert(0, _LmEvalWatcher())


install()
