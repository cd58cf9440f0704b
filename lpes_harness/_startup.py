"""Start-up hook: make lm-eval see our models without importing anything heavy.

lm-eval 0.4.13 discovers models only through its own ``MODEL_MAPPING``; it reads no
entry points. A ``.pth`` file imports this module at every interpreter start-up, so
it must cost almost nothing: it only puts a finder on ``sys.meta_path`` that waits
for ``lm_eval.api.registry`` to be executed, then adds *lazy* registry entries
(``"module:Class"`` strings). torch and lm-eval are imported only when a user asks
for one of our models.
"""

import sys
from importlib.abc import MetaPathFinder

_REGISTRY_MODULE = "lm_eval.api.registry"

# name -> "module:Class"; lm-eval imports the target on first use.
LAZY_MODELS = {
    "lpes_hf": "lpes_harness.lm:LPESLM",
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


class _RegistryWatcher(MetaPathFinder):
    """Wraps the loader of lm-eval's registry module to run our registration after it."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != _REGISTRY_MODULE:
            return None
        # Ask the other finders for the real spec, skipping ourselves.
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _PostExecLoader(spec.loader)
                return spec
        return None


class _PostExecLoader:
    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        try:
            register_lazy_models(module)
        except Exception as err:  # never break lm-eval because of us
            print(f"lpes-harness: could not register models with lm-eval: {err}", file=sys.stderr)

    def __getattr__(self, name):
        return getattr(self._loader, name)


def install() -> None:
    if _REGISTRY_MODULE in sys.modules:  # already imported: register directly
        register_lazy_models(sys.modules[_REGISTRY_MODULE])
        return
    if not any(isinstance(f, _RegistryWatcher) for f in sys.meta_path):
        sys.meta_path.insert(0, _RegistryWatcher())


install()
