"""A search's fingerprint: everything that decides a fitness value, so a resume cannot mix two experiments.

The fitness cache is keyed by the layer scales alone, so a run resumed with another task,
sample count, model or library version would mix old fitness values with new ones. The
checkpoint keeps :func:`fingerprint` of the first run; a resume computes it again and refuses
when :func:`mismatches` finds any difference (one line each), before any file is written.

Sections of the fingerprint (a JSON object):

``fitness``
    ``task``, ``metadata``, ``mode``, ``scorer``, ``weights``, ``positions``,
    ``num_samples``, ``racing``, ``chunk_size``, ``chat_template``, and ``objective`` and
    ``sample_order`` unless they are the defaults ``weighted`` and ``roles``: what ``FitnessConfig`` holds.
``model``
    ``pretrained`` (as given), ``path`` and ``gguf_file`` (as resolved), ``revision``
    (asked for, and the hub commit when known), ``files`` (size, modification time and sha256 of
    the GGUF file, or of each model file in a local directory: weights, config, tokenizer),
    ``model_args`` and ``dtype`` (the loaded model's, else the one asked for). A file is compared
    by size and content (sha256), so a run moved to another machine with the same model resumes;
    a fingerprint from before the hash compares size and modification time.
``versions``
    ``lm_eval`` and ``transformers``.
``search`` (when the settings hold them)
    the GA's sizes, steps, seed, mutation and genome settings. ``generations`` alone may grow
    (to extend a finished run).

:func:`state_mismatches` applies the same comparison to a saved search state's own ``spec`` and
``config`` (what ``GeneticSearch.load_state_dict`` checks): resume compatibility is decided here
alone.
"""

from __future__ import annotations

import datetime as _dt
import functools
import hashlib
import json
from importlib import metadata as _metadata
from pathlib import Path
from typing import Any, Mapping

from lpes_harness.core.scaling import DEFAULT, scaling_of
from lpes_harness.search.config import current_names

FORMAT = "lpes-fingerprint/1"
FITNESS_KEYS = ("task", "metadata", "mode", "scorer", "weights", "positions", "num_samples", "racing", "chunk_size",
                "chat_template")
# The search's own settings (the command line's and SearchConfig's names are the same).
SEARCH_KEYS = ("population", "parents", "mutants", "crossovers", "generations", "mx", "my", "crossover_tries", "seed",
               "mutation", "curve", "control_points", "brute_force", "y_min", "y_max", "y_step", "initial_y", "sweep")
# Scaling both: the base curve's settings.
BOTH_KEYS = ("base_y_min", "base_y_max", "base_y_step", "my_base", "base_sweep")
# What the stages after the search do (final choice, uniform.json), when not their defaults.
AFTER_SEARCH = {"validation_samples": 0, "select_top": 4, "uniform_tuning": False, "selection_rule": "two-se"}
MAY_GROW = {"search.generations", "config.generations"}
VERSIONED = ("lm_eval", "transformers")
# Files of a local model directory that define the model (weights, config, tokenizer).
MODEL_FILE_SUFFIXES = (".json", ".safetensors", ".bin", ".gguf", ".model", ".jinja", ".txt", ".tiktoken", ".py", ".pt")


def fingerprint(settings: Mapping[str, Any] | Any, model: Any = None) -> dict:
    """The fingerprint of a search: ``settings`` (a mapping or an argparse namespace) and ``model``.

    ``settings`` holds the ``FitnessConfig`` fields (e.g. ``{**vars(args), **vars(fitness_config)}``)
    and ``pretrained``, ``model_args`` and ``dtype``; a namespace's ``weights_dict``,
    ``positions_dict`` and ``fitness`` are read as ``weights``, ``positions`` and ``mode`` (the
    name fingerprints keep, so older checkpoints compare), and the ``no_racing`` of namespaces
    from before ``--racing`` as ``racing``. ``model``: the loaded ``lpes_hf`` model, or a dict with
    ``pretrained`` / ``gguf_file`` / ``revision`` / ``dtype``, or None (from ``settings``).
    """
    if not isinstance(settings, Mapping):
        settings = vars(settings)
    values = _canonical_settings(settings)
    fitness = {key: _plain(values.get(key)) for key in FITNESS_KEYS}
    if values.get("objective", "weighted") != "weighted":  # absent means weighted: older checkpoints still resume
        fitness["objective"] = values["objective"]
    if values.get("sample_order", "roles") != "roles":  # likewise; it changes forwards and raced bounds, not choices
        fitness["sample_order"] = values["sample_order"]
    search = {key: _plain(values[key]) for key in SEARCH_KEYS if key in values}
    if values.get("layer_type"):  # absent means all layers: older checkpoints still resume
        search["layer_type"] = values["layer_type"]
    if values.get("position_layer_type"):  # likewise
        search["position_layer_type"] = values["position_layer_type"]
    if values.get("line_values"):  # --lines, parsed (absent means none: older checkpoints still resume)
        search["lines"] = [list(line) for line in values["line_values"]]
    if values.get("initial", "mutants") != "mutants":  # absent means the paper's mutants: likewise
        search["initial"] = values["initial"]
    if values.get("scaling", DEFAULT) != DEFAULT:  # absent means position: likewise
        search["scaling"] = values["scaling"]
    if scaling_of(values.get("scaling")).paired:  # the base curve's grid and steps (both runs only)
        search.update({key: _plain(values.get(key)) for key in BOTH_KEYS})
    if values.get("condition"):  # a search over conditions (absent: the one of task and metadata)
        fitness["conditions"] = _plain(list(values["condition"]))
        fitness["condition_objective"] = values.get("condition_objective", "mean")
    for key, default in AFTER_SEARCH.items():  # the stages after the search, when they run
        if values.get(key, default) != default:
            search[key] = _plain(values[key])
    result = {
        "format": FORMAT,
        "fitness": fitness,
        "model": model_identity(settings, model),
        "versions": {name: _version(name) for name in VERSIONED},
    }
    if search:
        result["search"] = search
    return result


def mismatches(saved: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """One line per difference, ``"fitness.num_samples: saved 20, now 50"``; empty when they agree.

    ``search.generations`` may grow. A value absent on one side shows as ``(absent)``.
    """
    if saved.get("format") != current.get("format"):
        return [f"format: saved {saved.get('format')!r}, now {current.get('format')!r}"]
    flat_saved, flat_current = _flatten(saved), _flatten(current)
    lines = []
    for key in sorted(set(flat_saved) | set(flat_current)):
        old, new = flat_saved.get(key, _ABSENT), flat_current.get(key, _ABSENT)
        if key.startswith("model.files."):
            old, new = _file_identity(old, new)
        if old == new:
            continue
        if key in MAY_GROW and _ABSENT not in (old, new) and isinstance(old, int) and isinstance(new, int):
            if new >= old:
                continue
            lines.append(f"{key}: saved {old!r}, now {new!r} (it may only grow)")
            continue
        lines.append(f"{key}: saved {_show(old)}, now {_show(new)}" + _touch_hint(key, old, new, flat_current))
    return lines


def _touch_hint(key: str, old: Any, new: Any, flat_current: Mapping[str, Any]) -> str:
    """For a fingerprint from before the hash whose model file differs only in its modification time (a
    reinstalled package rewrites the file), how to tell the resume it is the same file."""
    if not (key.startswith("model.files.") and isinstance(old, Mapping) and isinstance(new, Mapping)):
        return ""
    if "sha256" in old or old.get("size") != new.get("size"):
        return ""
    name, folder = key.removeprefix("model.files."), Path(str(flat_current.get("model.path")))
    path = folder if folder.name == name else folder / name
    return (f" (a run from before model files were hashed compares their time; if this is the same file, give "
            f"it the saved time and resume again: touch -d '{old.get('modified')}' '{path}')")


def state_mismatches(saved_state: Mapping[str, Any], spec: Mapping[str, Any], config: Mapping[str, Any]) -> list[str]:
    """One line per difference between a saved search state's ``spec`` / ``config`` and these
    (``config.seed: saved 1, now 5``); ``generations`` may grow."""
    # States from before the mutation option used the joint draw.
    saved_config = {"mutation": "joint", **current_names(saved_state["config"])}
    saved_spec = {"held_layers": [], **saved_state["spec"]}  # before --layer-type every layer moved
    if saved_spec.get("base_y_min") is not None:  # scaling both, from before --position-layer-type
        saved_spec.setdefault("position_held_layers", [])
    return mismatches({"format": FORMAT, "spec": saved_spec, "config": saved_config},
                      {"format": FORMAT, "spec": dict(spec), "config": dict(config)})


# ---------------------------------------------------------------------------- settings


def _canonical_settings(settings: Mapping[str, Any]) -> dict:
    values = dict(settings)
    if "mode" not in values and "fitness" in values:
        values["mode"] = values["fitness"]
    if "racing" not in values and "no_racing" in values:
        values["racing"] = not values["no_racing"]
    for key in ("weights", "positions"):
        if isinstance(values.get(f"{key}_dict"), Mapping):
            values[key] = values[f"{key}_dict"]
    if isinstance(values.get("weights"), str):
        values["weights"] = [float(part) for part in values["weights"].split(",") if part.strip()]
    if isinstance(values.get("metadata"), str):
        try:
            values["metadata"] = json.loads(values["metadata"])
        except json.JSONDecodeError:
            pass
    if isinstance(values.get("positions"), Mapping):
        values["positions"] = {role: _percents(p) for role, p in values["positions"].items()}
    return values


def _percents(value) -> list:
    return [value] if isinstance(value, (int, float)) else list(value)


def _parse_model_args(text: Any) -> dict:
    if not text:
        return {}
    if isinstance(text, Mapping):
        return dict(text)
    from lm_eval.utils import simple_parse_args_string

    return simple_parse_args_string(str(text))


# ------------------------------------------------------------------------------- model


def model_identity(settings: Mapping[str, Any], model: Any = None) -> dict:
    """``pretrained``, resolved ``path`` / ``gguf_file``, ``revision``, ``files``, ``model_args``, ``dtype``."""
    model_args = _parse_model_args(settings.get("model_args"))
    pretrained = settings.get("pretrained", model_args.get("pretrained"))
    source: dict = {}
    dtype = settings.get("dtype", model_args.get("dtype"))
    commit = None
    if isinstance(model, Mapping):
        source = dict(model)
        dtype = source.get("dtype", dtype)
    elif model is not None:
        source = dict(getattr(model, "lpes_source", None) or {})
        loaded = getattr(model, "model", None)
        if getattr(loaded, "dtype", None) is not None:
            dtype = str(loaded.dtype).removeprefix("torch.")
        commit = getattr(getattr(loaded, "config", None), "_commit_hash", None)
    path, gguf_file = source.get("pretrained"), source.get("gguf_file")
    if path is None:
        path, gguf_file = _resolve(pretrained, model_args.get("gguf_file"))
    revision = source.get("revision", model_args.get("revision"))
    return {
        "pretrained": pretrained if pretrained is not None else "bundled",
        "path": None if path is None else str(path),
        "gguf_file": gguf_file,
        "revision": revision,
        "commit": commit,
        "files": model_files(path, gguf_file),
        "model_args": _plain(model_args),
        "dtype": None if dtype is None else str(dtype),
    }


def _resolve(pretrained, gguf_file):
    from lpes_harness.core.models import resolve_pretrained

    try:
        return resolve_pretrained(pretrained, gguf_file)
    except (OSError, ValueError):
        return pretrained, gguf_file


def model_files(path: Any, gguf_file: str | None = None) -> dict:
    """``{file name: {"size": bytes, "modified": UTC time}}``: the GGUF file, or a local model folder's files."""
    if path is None:
        return {}
    folder = Path(str(path))
    if gguf_file:
        candidates = [folder / gguf_file]
    elif folder.is_file():
        candidates = [folder]
    elif folder.is_dir():
        candidates = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix in MODEL_FILE_SUFFIXES)
    else:
        return {}  # a hub id: its revision / commit identifies it
    files = {}
    for candidate in candidates:
        try:
            stat = candidate.stat()
        except OSError:
            files[candidate.name] = None  # missing
            continue
        modified = _dt.datetime.fromtimestamp(stat.st_mtime_ns / 1e9, tz=_dt.timezone.utc)
        files[candidate.name] = {"size": stat.st_size, "modified": modified.isoformat(timespec="microseconds"),
                                 "sha256": file_sha256(str(candidate.resolve()), stat.st_size, stat.st_mtime_ns)}
    return files


@functools.lru_cache(maxsize=64)
def file_sha256(path: str, _size: int, _mtime_ns: int) -> str:
    """The file's sha256 (hex), once per process for a file that did not change (~0.5 s for 250 MB)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def _file_identity(old: Any, new: Any) -> tuple[Any, Any]:
    """What decides whether a model file is the same: size and content where both sides hashed it, else (a
    fingerprint from before the hash) size and modification time. The time alone differs on a copy."""
    if not (isinstance(old, Mapping) and isinstance(new, Mapping)):
        return old, new
    keys = ("size", "sha256") if "sha256" in old and "sha256" in new else ("size", "modified")
    return {key: old.get(key) for key in keys}, {key: new.get(key) for key in keys}


# ------------------------------------------------------------------------------ helpers


def _version(name: str) -> str | None:
    try:
        return _metadata.version(name)
    except _metadata.PackageNotFoundError:
        try:
            return _metadata.version(name.replace("_", "-"))
        except _metadata.PackageNotFoundError:
            return None


def _plain(value: Any) -> Any:
    """JSON's view of a value (tuples -> lists, keys sorted), so a saved and a fresh fingerprint compare equal."""
    return json.loads(json.dumps(value, sort_keys=True, default=str))


class _Absent:
    def __repr__(self) -> str:
        return "(absent)"


_ABSENT = _Absent()


def _flatten(fingerprint: Mapping[str, Any]) -> dict:
    """``section.key -> value`` (``model.files.<name>`` per file): one line per changed setting."""
    flat = {}
    for section, content in fingerprint.items():
        if not isinstance(content, Mapping):
            flat[section] = _plain(content)
            continue
        for key, value in content.items():
            if section == "model" and key == "files" and isinstance(value, Mapping):
                for name, stat in value.items():
                    flat[f"model.files.{name}"] = _plain(stat)
            else:
                flat[f"{section}.{key}"] = _plain(value)
    return flat


def _show(value: Any) -> str:
    return "(absent)" if value is _ABSENT else json.dumps(value, sort_keys=True) if not isinstance(value, str) else repr(value)
