"""The rows of a leaderboard: every method's committed 0/1 scores on one held-out sample set, each row
named for what it ran by the table of methods, all rows on the same samples in the same order.

Two kinds of committed record feed it, each read with the loader that the command that wrote it uses:

- a paired comparison's ``heldout.json`` (``python -m lpes_harness.commands.paired``): each row's scales
  (vanilla, LPES, PI) or a baseline's ``model:args``, and its 0/1 scores per gold position;
- a kept ``lpes-report`` record (``--keep-samples``): ``results_<row>.json`` (lm-eval's results: the
  model, its arguments, the scales it ran; :mod:`.results_files`) beside ``per_sample.json`` (row ->
  subtask -> doc_id -> 0/1 and the document's hash).

Several records of one sample set make one table (a later report re-keeps vanilla beside its new
rows): a row found twice must hold the same scores, and every record the same documents, else
nothing is paired.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from lpes_harness.evaluation.logged_samples import KEPT_SAMPLES, RESULTS_PREFIX, kept_stem
from lpes_harness.evaluation.results_files import POSITION_SUBTASK, read_results, unmoved_layers
from lpes_harness.evaluation.results_files import Method as ResultsMethod
from lpes_harness.methods import METHODS, Method, rope_entry, run_of
from lpes_harness.core.scaling import DEFAULT, SCALINGS

ROPE = METHODS["pi"].module  # LPES (every scaling) and PI are rope.py's install
RUN_ARGS = ("pretrained", "dtype", "device", "batch_size")  # where and how a row ran, not what it set
PLAIN_MODEL = "hf"  # lm-eval's own model: vanilla


class LeaderboardError(ValueError):
    """A record that cannot be read or paired; the message names the file or the row."""


@dataclass(frozen=True)
class Row:
    name: str  # as its record names it
    entry: Method | None  # what it ran, by the table of methods; None: the plain model
    setting: str  # what it set, in words
    scores: tuple[int, ...]  # 0/1 per sample, in the order of its table's samples
    scaling: str | None = None  # an lpes_hf row's scaling (latency was measured for position only)
    sets_parameters: bool = False  # a baseline row that sets its method's parameters (not its authors' defaults)
    arguments: tuple[tuple[str, str], ...] = ()  # what a baseline row set (arguments_key), to find its own latency


@dataclass(frozen=True)
class Table:
    rows: tuple[Row, ...]
    positions: tuple[int, ...]  # the gold positions, in percent
    per_position: int  # samples per position


def is_lpes(row: Row) -> bool:
    """A searched curve: an LPES entry of any scaling (PI is an entry of its own)."""
    return row.entry is not None and row.entry.module == ROPE and row.entry.name != "pi"


def read_table(sources: Sequence[str], root: Path = Path(".")) -> Table:
    """The rows of ``sources`` (``heldout.json`` files or kept record folders, relative to ``root``), merged."""
    rows: dict[str, Row] = {}
    samples = None
    for source in sources:
        path = root / source
        if path.is_file():
            found, keys = paired_record(path)
        elif path.is_dir():
            found, keys = kept_record(path)
        else:
            raise LeaderboardError(f"{source!r} does not exist; give a paired comparison's heldout.json or a "
                                   f"folder written by lpes-report --keep-samples")
        if samples is None:
            samples, first = keys, source
        elif keys != samples:
            raise LeaderboardError(f"{source!r} holds other samples than {first!r} (other positions, documents or "
                                   f"counts): their rows cannot be paired")
        for row in found:
            if row.name in rows and rows[row.name].scores != row.scores:
                raise LeaderboardError(f"row {row.name!r} of {source!r} differs from the row of that name read before")
            rows.setdefault(row.name, row)
    positions = sorted({key[0] for key in samples})
    counts = {p: sum(1 for key in samples if key[0] == p) for p in positions}
    if len(set(counts.values())) != 1:
        raise LeaderboardError(f"{sources[0]!r}: unequal samples per position {counts}; the pooled average needs equal ones")
    return Table(tuple(rows.values()), tuple(positions), next(iter(counts.values())))


def paired_record(path: Path) -> tuple[list[Row], list[tuple]]:
    """The rows of a ``heldout.json``; its samples are (position, index): every row was scored on the same ones."""
    try:
        scored = json.loads(path.read_text(encoding="utf-8")).get("scored")
    except (json.JSONDecodeError, AttributeError):
        scored = None
    if not isinstance(scored, dict) or not isinstance(scored.get("scores"), dict) or not scored["scores"]:
        raise LeaderboardError(f"{path}: no 'scored' scores; give a heldout.json of python -m lpes_harness.commands.paired")
    scaling = scored.get("scaling", DEFAULT)
    by_row = {name: {int(p): list(v) for p, v in by_position.items()} for name, by_position in scored["scores"].items()}
    first = next(iter(by_row))
    shape = {p: len(v) for p, v in by_row[first].items()}
    rows = []
    for name, by_position in by_row.items():
        if {p: len(v) for p, v in by_position.items()} != shape:
            raise LeaderboardError(f"{path}: row {name!r} was scored on other samples than row {first!r}")
        ran = (scored.get("methods") or {}).get(name)
        if isinstance(ran, str):  # a baseline model, "model:args"
            model, _, text = ran.partition(":")
            args = model_args(text)
            entry, setting, sets = baseline_row(model, args, f"{path}: row {name!r}")
            row_scaling, arguments = None, arguments_key(args)
        elif isinstance(ran, list):
            entry, setting, row_scaling, sets = rope_entry(ran, scaling), rope_setting(ran, scaling), scaling, False
            arguments = ()
        else:
            raise LeaderboardError(f"{path}: row {name!r} has no scales or model:args under 'methods'")
        scores = [v for p in sorted(by_position) for v in by_position[p]]
        rows.append(Row(name, entry, setting, _binary(scores, f"{path}: row {name!r}"), row_scaling, sets, arguments))
    return rows, [(p, i, None) for p in sorted(shape) for i in range(shape[p])]


def kept_record(folder: Path) -> tuple[list[Row], list[tuple]]:
    """The rows of a kept ``lpes-report`` record; its samples are (position, doc_id, the document's hash)."""
    record_file = folder / KEPT_SAMPLES
    if not record_file.is_file():
        raise LeaderboardError(f"{folder}: no {KEPT_SAMPLES}; give a folder written by lpes-report --keep-samples")
    try:
        record = json.loads(record_file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise LeaderboardError(f"{record_file}: not JSON ({err.msg}, line {err.lineno})") from None
    rows, samples = [], None
    for name, by_task in record.items():
        results = folder / f"{RESULTS_PREFIX}{kept_stem(name)}.json"
        if not results.is_file():
            raise LeaderboardError(f"{folder}: row {name!r} of {KEPT_SAMPLES} has no {results.name} beside it")
        method = ResultsMethod(name)
        method.add(read_results(results), results)
        tasks = sorted((int(m["percent"]), task) for task in method.samples if (m := POSITION_SUBTASK.match(task)))
        if not tasks:
            raise LeaderboardError(f"{results}: row {name!r} has no per-sample scores of a position task")
        keys = [(percent, int(doc), (by_task.get(task, {}).get(str(doc)) or {}).get("doc_hash"))
                for percent, task in tasks for doc in sorted(method.samples[task])]
        if samples is not None and keys != samples:
            raise LeaderboardError(f"{folder}: row {name!r} was scored on other documents than the rows before it")
        samples = keys
        scores = [method.samples[task][doc] for _, task in tasks for doc in sorted(method.samples[task])]
        rows.append(_results_row(method, _binary(scores, f"{results}: row {name!r}")))
    if samples is None:
        raise LeaderboardError(f"{record_file}: no rows")
    return rows, samples


def _results_row(method: ResultsMethod, scores: tuple[int, ...]) -> Row:
    """A row of a kept record, named for what its results file says it ran."""
    where = f"{method.files[0]}: row {method.name!r}"
    if method.model == PLAIN_MODEL:
        return Row(method.name, None, "the plain model", scores)
    entry = method.entry
    if entry is None:
        raise LeaderboardError(f"{where} ran {method.model!r}, which is not in the table of methods (lpes_harness.methods)")
    if entry.module != ROPE:
        entry, setting, sets = baseline_row(method.model, method.model_args, where)
        return Row(method.name, entry, setting, scores, sets_parameters=sets, arguments=arguments_key(method.model_args))
    scaling = str(method.model_args.get("scaling", DEFAULT))
    scales = method.scales or [1.0]
    return Row(method.name, None if method.is_plain else entry, rope_setting(scales, scaling), scores, scaling)


def baseline_row(model: str, args: Mapping[str, object], where: str) -> tuple[Method, str, bool]:
    """A baseline's entry, its setting in words, and whether it sets any of its method's parameters
    (else it ran the authors' defaults)."""
    entry = run_of(model, args)
    if entry is None:
        raise LeaderboardError(f"{where} ran {model!r}, which is not in the table of methods (lpes_harness.methods)")
    shown = ",".join(f"{key}={value}" for key, value in args.items() if key not in RUN_ARGS)
    if not {p.name for p in entry.parameters} & set(args):
        return entry, "authors' defaults" + (f" (`{shown}`)" if shown else ""), False
    return entry, f"`{shown}`", True


def model_args(text: str) -> dict[str, str]:
    """``key=value,...`` (an lm-eval ``--model_args`` string) -> its pairs, values as written."""
    return dict(pair.split("=", 1) for pair in text.split(",") if "=" in pair)


def arguments_key(args: Mapping[str, object]) -> tuple[tuple[str, str], ...]:
    """What a row set, beside where it ran (:data:`RUN_ARGS`), in one spelling: sorted, numbers as floats
    (``5e-05`` and ``0.00005`` are one value), so a row and ``benchmarks/latency.py --setting`` compare."""
    def spelled(value: object) -> str:
        try:
            return repr(float(value))
        except (TypeError, ValueError):
            return str(value).strip()

    return tuple(sorted((str(key).strip(), spelled(value)) for key, value in args.items() if key not in RUN_ARGS))


def rope_setting(scales: Sequence[float], scaling: str) -> str:
    """What an ``lpes_hf`` row set, in words: the plain model, one factor on the layers it moved, or a curve."""
    kind = SCALINGS[scaling]
    curves = kind.halves(scales)
    layers, held = len(curves[0]), set(unmoved_layers(scales, scaling))
    if len(held) == layers:
        return "the plain model"
    where = "every layer" if not held else f"{layers - len(held)} of {layers} layers (the others at 1)"
    factor = kind.uniform_factor(scales, held)
    if factor is not None:
        values = factor if kind.paired else (factor,)
        return ", ".join(f"{axis} factor {value:.3g}" for axis, value in zip(kind.axes, values)) + f" on {where}"
    moved = [[v for layer, v in enumerate(curve) if layer not in held] for curve in curves]
    return f"a curve on {where}: " + ", ".join(f"{axis} {min(c):.2f} to {max(c):.2f}" for axis, c in zip(kind.axes, moved))


def _binary(values: Sequence[float], where: str) -> tuple[int, ...]:
    if any(v not in (0, 1) for v in values):
        raise LeaderboardError(f"{where}: a leaderboard pairs 0/1 scores per sample, found {sorted(set(values))[:5]}")
    return tuple(int(v) for v in values)
