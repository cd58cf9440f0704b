import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
# A session converts each real GGUF once into a cache of its own (lpes_harness.core.gguf_cache), which its
# subprocesses share: so every run of the suite runs the conversion, and no test reads or fills ~/.cache.
# Under pytest-xdist the workers inherit the controller's folder (its conftest runs first), and only the
# controller removes it: a worker that finished first must not delete what another still reads.
_WORKER = os.environ.get("PYTEST_XDIST_WORKER")
_GGUF_CACHE = None if _WORKER else tempfile.mkdtemp(prefix="lpes-test-cache-")
if _GGUF_CACHE:
    os.environ.setdefault("LPES_CACHE_DIR", _GGUF_CACHE)

if _WORKER:
    # `make test` runs one worker a core: each worker (and the CLIs its tests start) takes its share of
    # the cores, so that two forwards do not fight over both (torch reads this when it is imported).
    _WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // _WORKERS)))


def pytest_sessionfinish(session, exitstatus):
    if _GGUF_CACHE:
        shutil.rmtree(_GGUF_CACHE, ignore_errors=True)


def pytest_collection_modifyitems(items):
    # The files that load a real model (a `slow` test) go first, each whole and in its own order: under
    # xdist (`make test`, --no-loadscope-reorder) the workers take files in this order, so the long ones
    # start while the other worker has work, and the suite does not end on one of them run alone.
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)  # stable: the rest keep pytest's order

@pytest.fixture(autouse=True)
def lm_eval_logging_as_a_fresh_process_has_it():
    """lm-eval's ``simple_evaluate`` gives its logger, once a process, a StreamHandler bound to the
    ``sys.stderr`` of that moment. Under ``capsys`` that stream closes with the test, and every lm-eval log
    line of a later test in the same worker printed a '--- Logging error ---' traceback into that test's
    stderr (CI failed on it: a one-line error check read 91 lines). Each test ends with the logger as a new
    process finds it, which is what a user's command starts from."""
    logger = logging.getLogger("lm_eval")
    handlers, propagate, level = list(logger.handlers), logger.propagate, logger.level
    configured = getattr(sys.modules.get("lm_eval.utils"), "_LOGGING_CONFIGURED", False)
    yield
    for handler in [h for h in logger.handlers if h not in handlers]:
        logger.removeHandler(handler)
    logger.propagate, logger.level = propagate, level
    lm_eval_utils = sys.modules.get("lm_eval.utils")
    if hasattr(lm_eval_utils, "_LOGGING_CONFIGURED"):
        lm_eval_utils._LOGGING_CONFIGURED = configured


REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"
sys.path.insert(0, str(Path(__file__).resolve().parent))


def load_benchmark(name: str):
    """A script of benchmarks/ as a module (the folder is not a package)."""
    import importlib.util

    # As `python benchmarks/X.py` does: the scripts import their shared helpers from beside them.
    if str(REPO_ROOT / "benchmarks") not in sys.path:
        sys.path.append(str(REPO_ROOT / "benchmarks"))

    spec = importlib.util.spec_from_file_location(f"{name}_benchmark", REPO_ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def converted_bundled_model() -> str:
    """The folder this package's GGUF cache converts the bundled SmolLM2 into, for plain ``hf``: the GGUF's
    logits bit for bit (tests/test_gguf_cache.py), where ``hf`` on the GGUF would dequantize it again (~25 s)."""
    from lpes_harness.core.gguf_cache import loadable
    from lpes_harness.core.models import BUNDLED_GGUF, bundled_model_dir

    folder, gguf_file = loadable(bundled_model_dir(), BUNDLED_GGUF)
    assert gguf_file is None, "the GGUF cache did not convert the bundled model"
    return folder


@pytest.fixture(scope="session")
def tiny_model_with_the_bundled_tokenizer(tmp_path_factory) -> str:
    """A tiny random Llama behind SmolLM2's tokenizer and chat template (tiny_models): a benchmark's
    commands run on real tasks' prompts, tokenized as the bundled model does, in seconds."""
    from tiny_models import save_tiny_checkpoint_with_tokenizer

    return save_tiny_checkpoint_with_tokenizer(tmp_path_factory.mktemp("tiny_bundled_tokenizer"), converted_bundled_model())
