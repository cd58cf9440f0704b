"""Scored held-out samples on disk: a paired comparison resumes, grows and reuses what it shares."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from lpes_harness.core.scaling import SCALINGS, cache_scaling


class ScoreCache:
    """Scored samples on disk, keyed by the scales (rounded) and the gold position.

    The file records what the samples depend on (task, split, options, chat template, scoring
    mode, model, dtype) but not how many there are: a block holds the scores of the first
    samples of the split, and a larger run extends it. Each position also keeps a fingerprint
    of every scored sample's text, so a block is reused only for the very same samples; a
    cache made for other samples is refused, never mixed in.
    """

    def __init__(self, path: str | Path, identity: Mapping):
        self.path = Path(path)
        self.identity = json.loads(json.dumps(dict(identity)))  # JSON-normalised, so it compares equal on reload
        self.identity.pop("num_samples", None)
        self.blocks: dict[str, list[float]] = {}
        self.fingerprints: dict[str, list[str]] = {}
        if self.path.is_file():
            saved = json.loads(self.path.read_text(encoding="utf-8"))
            identity_saved = dict(saved.get("identity") or {})
            # Files written before blocks could grow named their sample count; their samples are
            # still the first ones of the split, which the rest of the identity pins down.
            identity_saved.pop("num_samples", None)
            blocks = saved.get("blocks", {})
            recorded = identity_saved.get("scaling")
            if recorded is not None and cache_scaling(recorded) is None:  # both, before it was keyed canonically
                del identity_saved["scaling"]
                blocks = {_canonical_key(key, recorded): block for key, block in blocks.items()}
            if identity_saved != self.identity:
                raise ValueError(f"{self.path} holds scores of other samples or another model "
                                 f"({identity_saved} != {self.identity}); remove it or choose another --output")
            self.blocks = blocks
            self.fingerprints = saved.get("fingerprints", {})

    @staticmethod
    def key(method: Sequence[float] | str, percent: int) -> str:
        """Scales (rounded) or a baseline's ``model:args`` spec, at one gold position."""
        if isinstance(method, str):
            return json.dumps(method) + f"@{int(percent)}"
        return json.dumps([round(float(s), 6) for s in method]) + f"@{int(percent)}"

    @staticmethod
    def fingerprint(doc: Mapping) -> str:
        import hashlib

        text = json.dumps(doc, sort_keys=True, default=str, ensure_ascii=False)
        return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]

    def _check_samples(self, percent: int, docs: Sequence[Mapping], count: int) -> None:
        saved = self.fingerprints.get(str(int(percent)), [])
        mine = [self.fingerprint(doc) for doc in docs[: min(count, len(saved))]]
        if mine != saved[: len(mine)]:
            first = next(i for i, (a, b) in enumerate(zip(mine, saved)) if a != b)
            raise ValueError(f"{self.path}: sample {first} at {percent} % is not the sample these scores were made "
                             f"for (other samples: a changed data file or task code?); remove it or choose another --output")

    def merge(self, other: str | Path) -> int:
        """Take in the blocks of another cache file made for the same samples; returns how many.

        Another run (a search's held-out table, an earlier comparison in another directory) may
        already have scored some methods on these samples. Its file must have the same identity
        and, position by position, fingerprints that agree with this cache's where both have
        them; a longer block replaces a shorter one. Checked in full before anything changes,
        so a refused file leaves this cache as it was.

        A file that differs only in its scaling (a position cache for a base run, or back) gives only
        the blocks that mean the same model under either: the plain model (every factor 1, bit for
        bit vanilla whatever the factors multiply) and baselines (keyed by their ``model:args``).
        """
        from lpes_harness.core.files import atomic_write_json

        other = Path(other)
        other = other / self.path.name if other.is_dir() else other
        saved = json.loads(other.read_text(encoding="utf-8"))
        identity = dict(saved.get("identity") or {})
        identity.pop("num_samples", None)
        blocks = saved.get("blocks") or {}
        if identity != self.identity:
            if _without_scaling(identity) != _without_scaling(self.identity):
                raise ValueError(f"{other} holds scores of other samples or another model ({identity} != {self.identity})")
            blocks = {key: block for key, block in blocks.items() if _means_one_model(key)}
        fingerprints = dict(self.fingerprints)
        for percent, theirs in (saved.get("fingerprints") or {}).items():
            mine = fingerprints.get(percent, [])
            common = min(len(mine), len(theirs))
            if mine[:common] != theirs[:common]:
                first = next(i for i in range(common) if mine[i] != theirs[i])
                raise ValueError(f"{other}: sample {first} at {percent} % is not the sample of {self.path}")
            fingerprints[percent] = max(mine, theirs, key=len)
        taken = {key: list(block) for key, block in blocks.items()
                 if len(block) > len(self.blocks.get(key, []))}
        for key, block in taken.items():
            percent = key.rpartition("@")[2]
            if len(block) > len(fingerprints.get(percent, [])):
                raise ValueError(f"{other}: block {key[:40]}... has more scores than fingerprinted samples")
        self.fingerprints = fingerprints
        self.blocks.update(taken)
        atomic_write_json(self.path, {"identity": self.identity, "blocks": self.blocks, "fingerprints": self.fingerprints})
        return len(taken)

    def get(self, scales: Sequence[float] | str, percent: int, docs: Sequence[Mapping] | None = None) -> list[float]:
        """The cached scores of the first samples (``docs``, checked against the fingerprints), maybe none."""
        block = list(self.blocks.get(self.key(scales, percent), []))
        if docs is not None:
            block = block[: len(docs)]
            self._check_samples(percent, docs, len(block))
        return block

    def put(self, scales: Sequence[float] | str, percent: int, docs: Sequence[Mapping] | None, values: Sequence[float]) -> None:
        """Keep ``values`` (the first samples' scores) for these scales at ``percent``: the whole file
        is rewritten atomically, so a kill leaves the file before or after this block, never half of it."""
        from lpes_harness.core.files import atomic_write_json, kill_point

        if docs is not None:
            self._check_samples(percent, docs, len(values))
            saved = self.fingerprints.get(str(int(percent)), [])
            if len(values) > len(saved):
                self.fingerprints[str(int(percent))] = saved + [self.fingerprint(d) for d in docs[len(saved): len(values)]]
        self.blocks[self.key(scales, percent)] = list(values)
        atomic_write_json(self.path, {"identity": self.identity, "blocks": self.blocks, "fingerprints": self.fingerprints})
        kill_point("score-cache")  # test hook (lpes_harness.core.files.kill_point): a kill between two blocks


def _without_scaling(identity: Mapping) -> dict:
    return {k: v for k, v in identity.items() if k != "scaling"}


def _means_one_model(key: str) -> bool:
    """Whether a block's key names the same model under every scaling: a baseline's spec, or all ones."""
    scales = json.loads(key.rpartition("@")[0])
    return not isinstance(scales, list) or all(float(s) == 1.0 for s in scales)


def _canonical_key(key: str, scaling: str) -> str:
    """A key of a ``scaling`` (both) curve in its canonical form (:meth:`lpes_harness.core.scaling.Scaling.canonical`)."""

    scales, at, percent = key.rpartition("@")
    try:
        values = json.loads(scales)
    except json.JSONDecodeError:
        return key
    if not isinstance(values, list):
        return key  # a baseline's spec
    return json.dumps([round(float(s), 6) for s in SCALINGS[scaling].canonical(values)]) + f"@{percent}"

