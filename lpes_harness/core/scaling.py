"""What a layer's factor multiplies (``lpes_hf scaling=``, ``lpes-search --scaling``).

- ``position``, the paper's LPES: layer h reads position i as i / s_h;
- ``base``: layer h's RoPE base becomes s_h x theta (its layer type's theta), at the true positions;
- ``both``: layer h has a pair (p_h, b_h): base b_h x theta at positions i / p_h.

A ``both`` set of factors travels as one flat list of 2L numbers, the L position factors first,
then the L base factors: ``[p_0, ..., p_{L-1}, b_0, ..., b_{L-1}]`` (:func:`join_both`,
:func:`split_both`); all ones is the plain model under every scaling.

:mod:`lpes_harness.core.rope` applies them; scales files record which (:mod:`lpes_harness.core.scales_file`).
A leaf: imports nothing, so torch-free modules and ``rope`` share it without an import cycle.
"""

SCALINGS = ("position", "base", "both")
HALVES = ("position", "base")  # the halves of a ``both`` list, in their order


def factors_per_layer(scaling: str) -> int:
    """How many numbers a scaling takes per decoder layer: 2 for ``both``, else 1."""
    return 2 if scaling == "both" else 1


def split_both(flat) -> tuple[list[float], list[float]]:
    """``[p_0..p_{L-1}, b_0..b_{L-1}]`` -> ``(positions, bases)``."""
    values = [float(v) for v in flat]
    if len(values) % 2:
        raise ValueError(f"a 'both' list holds 2 factors per layer (the position factors, then the base "
                         f"factors), so an even count; got {len(values)}")
    half = len(values) // 2
    return values[:half], values[half:]


def join_both(positions, bases) -> list[float]:
    """``(positions, bases)`` -> the flat ``both`` list ``[p_0..p_{L-1}, b_0..b_{L-1}]``."""
    positions, bases = [float(v) for v in positions], [float(v) for v in bases]
    if len(positions) != len(bases):
        raise ValueError(f"{len(positions)} position factors but {len(bases)} base factors; give one of each per layer")
    return positions + bases


def halves(flat, scaling: str) -> list[list[float]]:
    """The factors of ``scaling`` as curves over the layers: ``[flat]``, or ``[positions, bases]`` for ``both``."""
    return list(split_both(flat)) if scaling == "both" else [[float(v) for v in flat]]


def held_per_half(scaling: str, held_layers=(), position_held_layers=()) -> list[set[int]]:
    """The layers each half keeps at 1: ``held_layers`` in every half, and under ``both`` also
    ``position_held_layers`` in the position half (``--position-layer-type``: Gemma-3's sliding-window
    layers break under any position factor, while a base factor helps them)."""
    held = set(held_layers)
    if scaling != "both":
        if position_held_layers:
            raise ValueError("layers held in the position half alone need scaling both (two halves)")
        return [held]
    return [held | set(position_held_layers), held]


def uniform_factor(flat, scaling: str, held_layers=(), position_held_layers=()):
    """The one factor every layer outside ``held_layers`` has (a ``(position, base)`` pair for ``both``,
    each half outside its own held layers: :func:`held_per_half`), or None for a per-layer curve: a
    "curve" that is one factor everywhere is PI, not LPES."""
    values = []
    for curve, held in zip(halves(flat, scaling), held_per_half(scaling, held_layers, position_held_layers)):
        moved = {round(float(s), 9) for layer, s in enumerate(curve) if layer not in held}
        if len(moved) != 1:
            return None
        values.append(moved.pop())
    return tuple(values) if scaling == "both" else values[0]


def identity(scaling: str, num_layers: int) -> list[float]:
    """The factors that leave the model as it is: ones, one per layer (two for ``both``)."""
    return [1.0] * (num_layers * factors_per_layer(scaling))


def describe(scaling: str) -> str:
    """What the factors of ``scaling`` do, for messages and axis labels."""
    return {
        "position": "position (the paper's: layer h reads position i as i / s_h)",
        "base": "base (layer h's RoPE base becomes s_h x theta)",
        "both": "both (layer h has a pair: RoPE base b_h x theta at positions i / p_h; 2L numbers, "
                "the L position factors then the L base factors)",
    }[scaling]


def promote(flat, scaling: str) -> list[float]:
    """Factors of ``scaling`` as the ``both`` list that does the same: a position curve with base
    factors 1, a base curve with position factors 1 (each half alone is exactly its own scaling)."""
    values = [float(v) for v in flat]
    if scaling == "both":
        return values
    ones = [1.0] * len(values)
    return values + ones if scaling == "position" else ones + values


def canonical(flat, scaling: str) -> list[float]:
    """The shortest statement of the same factors, for keys that must match across scalings: a
    ``both`` list whose base half is all ones is its position half (bit for bit the same model)."""
    values = [float(v) for v in flat]
    if scaling == "both" and len(values) % 2 == 0 and all(v == 1.0 for v in values[len(values) // 2:]):
        return values[:len(values) // 2]
    return values

