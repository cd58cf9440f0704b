"""What ``lpes-compare`` tunes for each method: its candidate settings, from the table of methods.

- **LPES**: drawn pairs of lines over depth (position and base factors, each line's ends log-uniform in its
  bounds, Latin-hypercube spread from the seed): the family and draws of ``lpes-search --search-method
  racing``, on the loaded ``lpes_hf`` under scaling both, with the bounds and layers of the race ``lpes-search``
  runs by default on this model (:func:`line_family`: Gemma-3's position line on its global layers only);
- **PI**: one factor on every layer, position (the table's grid) or base (0.5 to 4), the best of either;
- every other method: the Cartesian product of its grid in :data:`lpes_harness.methods.METHODS`, through
  its own lm-eval model. MoICE runs only with trained routers (``--moice-gates``), positional hidden-state
  scaling only with its channel setting (``--poshidden-setting``): without them the board says why.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from lpes_harness.methods import METHODS
from lpes_harness.methods.setup import MethodSetup

# The methods a compare runs, in board order for equal rows: the paper's first, then the rivals.
COMPARED = ("lpes", "pi", "mspoe", "buckets", "moice", "poshidden", "fitm", "string", "pcd")
LINE_BOUNDS = ((0.5, 2.0), (0.5, 2.0))  # position, base: racing-smollm2's, for a model with no race of its own
BASE_FACTORS = (0.5, 0.75, 1.25, 1.5, 2.0, 3.0, 4.0)


@dataclass(frozen=True)
class Setting:
    """One candidate: what runs and how the board says it."""

    setup: MethodSetup
    text: str

    def to_dict(self) -> dict:
        return {"setup": self.setup.recorded, "model": self.setup.model, "text": self.text}

    @classmethod
    def from_dict(cls, saved: dict) -> Setting:
        recorded = saved["setup"]
        if isinstance(recorded, list):
            return cls(MethodSetup.of_scales(recorded), saved["text"])
        return cls(MethodSetup(saved["model"], recorded.partition(":")[2]), saved["text"])


class NotRun(Exception):
    """A method this compare cannot run on this model with what it was given; the message says what would."""


def method_list(text: str | None) -> list[str]:
    """``--methods`` (comma-separated names of :data:`COMPARED`) -> names; None: all of them."""
    if text is None:
        return list(COMPARED)
    names = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [n for n in names if n not in COMPARED]
    if unknown or not names:
        raise ValueError(f"--methods {text!r}: {', '.join(unknown) or 'no name'} not among {', '.join(COMPARED)}")
    return list(dict.fromkeys(names))


@dataclass(frozen=True)
class LineFamily:
    """The lines LPES races: each axis's bounds (position, base), the attention type whose layers alone take the
    position line (None: every layer), and the search profile they come from."""

    bounds: tuple = LINE_BOUNDS
    position_layer_type: str | None = None
    profile: str = "racing-smollm2"


def line_family(pretrained: str | None, device, dtype: str) -> LineFamily:
    """The family of the race ``lpes-search`` runs by default on this model (``--profile auto``): Gemma-3-270M's
    position line on its 3 global layers in [1, 3] and base line in [1, 8] (scaling its sliding layers breaks it;
    below 1 nothing helped), racing-smollm2's [0.5, 2] on both axes for SmolLM2 and for a model whose default
    search is not a race."""
    from lpes_harness.search.profiles import PROFILES, auto_profile

    name = auto_profile(device, dtype, pretrained)
    values = PROFILES[name]
    if values.get("search_method") != "racing":
        return LineFamily()
    return LineFamily(((values["y_min"], values["y_max"]), (values["base_y_min"], values["base_y_max"])),
                      values.get("position_layer_type"), name)


def line_ends_text(ends, position_layer_type: str | None = None) -> str:
    (p0, p1), (b0, b1) = ends
    where = f" ({position_layer_type} layers)" if position_layer_type else ""
    return f"position {p0:.2f} -> {p1:.2f}{where}, base {b0:.2f} -> {b1:.2f} over depth"


def lpes_settings(num_layers: int, draws: int, seed: int, family: LineFamily = LineFamily(),
                  layer_types: list[str] | None = None) -> list[Setting]:
    """``draws`` pairs of lines of ``family`` (``layer_types``: each layer's attention type, which its
    ``position_layer_type`` needs)."""
    from lpes_harness.evaluation.layer_types import layers_not_of
    from lpes_harness.search.factor_families import Bounds, Lines
    from lpes_harness.search.line_racing import latin_ends

    held = [[], []]
    if family.position_layer_type:
        held[0] = list(layers_not_of(layer_types or [], family.position_layer_type, "the race's position line"))
    lines = Lines("both", num_layers, [Bounds(*b) for b in family.bounds], held)
    return [Setting(MethodSetup.of_scales(lines.factors(lines.initial(ends)).tolist()),
                    line_ends_text(ends, family.position_layer_type))
            for ends in latin_ends(draws, family.bounds, seed)]


def pi_settings(num_layers: int) -> list[Setting]:
    ones = [1.0] * num_layers
    position = [Setting(MethodSetup.of_scales([float(v)] * num_layers + ones), f"position factor {v:g} on every layer")
                for v in METHODS["pi"].grid["scales"]]
    base = [Setting(MethodSetup.of_scales(ones + [float(v)] * num_layers), f"base factor {v:g} on every layer")
            for v in BASE_FACTORS]
    return position + base


def grid_settings(name: str, fixed: dict | None = None) -> list[Setting]:
    """The grid's settings that the method's own checks accept (Ms-PoE's grid pairs a min_ratio above a
    max_ratio, which it refuses): a race spends nothing on a setting that cannot run."""
    from lpes_harness.search.baseline_tuning import expand_grid, format_value

    entry = METHODS[name]
    grid = {k: [format_value(v) for v in values] for k, values in entry.grid.items()}
    return [Setting(MethodSetup(entry.lm_eval, args), f"`{args}`") for args in expand_grid(grid, fixed or {})
            if accepted(entry.lm_eval, args)]


def accepted(model: str, args: str) -> bool:
    """Whether ``model``'s lm-eval class takes ``args``: its checks before a load (``before_load``), run on a
    bare instance, with no model loaded."""
    from lm_eval.api.registry import get_model
    from lm_eval.utils import simple_parse_args_string

    from lpes_harness.core.rope_anatomy import LPESError

    klass = get_model(model)
    try:
        klass.before_load(klass.__new__(klass), {}, **simple_parse_args_string(args))
    except LPESError:
        return False
    return True


def settings_of(name: str, num_layers: int, *, draws: int, seed: int, moice_gates: str | None = None,
                poshidden_setting: str | None = None, lines: LineFamily = LineFamily(),
                layer_types: list[str] | None = None) -> list[Setting]:
    """The candidates of method ``name`` on a model of ``num_layers`` layers (LPES: of ``lines``); :class:`NotRun`
    with the reason."""
    if name == "lpes":
        return lpes_settings(num_layers, draws, seed, lines, layer_types)
    if name == "pi":
        return pi_settings(num_layers)
    if name == "moice":
        if not moice_gates:
            raise NotRun("MoICE needs routers trained on this model: give --moice-gates FILE "
                         "(python -m lpes_harness.commands.train_moice writes one)")
        return grid_settings(name, {"gates": moice_gates})
    if name == "poshidden":
        if not poshidden_setting:
            raise NotRun("positional hidden-state scaling needs this model's positional channel: give "
                         "--poshidden-setting FILE (python -m lpes_harness.commands.poshidden_channel writes one)")
        return grid_settings(name, {"setting": poshidden_setting})
    return grid_settings(name)


WITHOUT_DEFAULTS = ("lpes", "pi")  # a searched curve and a factor: no setting of their authors to score


def authors_setting(name: str, *, moice_gates: str | None = None, poshidden_setting: str | None = None) -> Setting:
    """Method ``name`` (not one of :data:`WITHOUT_DEFAULTS`) at its authors' defaults: none of its parameters set,
    only the file it needs on this model."""
    needs = {"moice": f"gates={moice_gates}", "poshidden": f"setting={poshidden_setting}"}.get(name, "")
    return Setting(MethodSetup(METHODS[name].lm_eval, needs), "authors' defaults" + (f" (`{needs}`)" if needs else ""))


def check_files(moice_gates: str | None, poshidden_setting: str | None) -> None:
    """The given files exist (a one-line refusal before the model loads)."""
    for flag, path in (("--moice-gates", moice_gates), ("--poshidden-setting", poshidden_setting)):
        if path and not Path(path).is_file():
            raise ValueError(f"{flag} {path}: no such file")
