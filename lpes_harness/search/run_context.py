"""What every stage of a search run reads: :class:`Run`, made once by :func:`lpes_harness.search.run_start.start`.

The stages (:mod:`lpes_harness.search.run`) take a :class:`Run` and what the stages before them returned,
and return what the stages after them need; each adds its count to :attr:`Run.forwards`.
"""

from __future__ import annotations

import argparse
import contextlib
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

from lpes_harness.core.models import machine_description
from lpes_harness.search.run_record import RUN_RECORD, stamp_process_end, write_config

BUNDLED_MODEL = "SmolLM2-135M-Instruct"  # what a run without --pretrained searches, as its files name it


@dataclass
class Run:
    """One search run: its flags, folder, clock, model, fitness and genome, as the start made them."""

    args: argparse.Namespace  # the parsed flags, resolved (dtype_chosen, heldout_share, --time-budget's sizes)
    output: Path  # the run folder
    folder_lock: contextlib.ExitStack  # holds the folder; what runs however the run ends is pushed here
    launched: float  # perf_counter at launch: the wall time a user waits, model load and sweep included
    launched_at: float  # epoch seconds at launch: config.json's clock
    idle_before: float | None  # a resume: from the stopped process's last write to this launch
    resume_search: bool  # a resume of a search that has a checkpoint (else a fresh search)
    saved_state: dict | None  # that checkpoint, read once
    config: object  # SearchConfig: the genetic search's settings
    fitness_config: object  # FitnessConfig: the one condition's fitness settings (the first condition's)
    fingerprint: dict  # what a resume is compared with
    settings: dict  # config.json's "settings", what --resume restores
    conditions: list  # the run's conditions (Condition): one, or its --condition list
    configs: dict  # condition name -> its FitnessConfig
    context: object  # distributed.Context: this process's rank among accelerate's
    lm: object  # the loaded lpes_hf (LPESLM)
    fitness: object  # the search's fitness over the search samples
    num_layers: int
    spec: object  # GenomeSpec; the sweep stage moves its start
    drawn_samples: list | None = None  # --search-method gradient / racing: the samples its plan built (None: built later)
    forwards: dict = field(default_factory=lambda: {"sweep": 0})  # stage -> forwards it spent, in stage order
    # Plain fields, not properties: what every stage reads is here, without a call into this file.
    several: bool = field(init=False)  # a run over --condition's: the fitness and the tables go by condition
    model_name: str = field(init=False)  # --pretrained, or the bundled model's name, as the run's files name it
    record_path: Path = field(init=False)  # config.json
    checkpoint_path: Path = field(init=False)

    def __post_init__(self):
        self.several = bool(self.args.conditions)
        self.model_name = self.args.pretrained or BUNDLED_MODEL
        self.record_path = self.output / RUN_RECORD
        self.checkpoint_path = self.output / "checkpoint.json"

    def record(self) -> dict:
        """config.json's record of the run."""
        args = self.args
        return {
            "command": " ".join(shlex.quote(a) for a in sys.argv),
            "search": self.config.to_dict(), "genome": self.spec.to_dict(),
            "fitness": dict(vars(self.fitness_config)),
            "conditions": [c.to_dict() for c in self.conditions] if self.several else None,
            "model": {"pretrained": args.pretrained or "bundled SmolLM2-135M-Instruct (GGUF)",
                      "model_args": args.model_args, "num_layers": self.num_layers,
                      "dtype": args.dtype_chosen, "dtype_requested": args.dtype,
                      "machine": machine_description(str(self.lm.device))},  # timings compare within one CPU kind
            "chat_template": self.fitness.chat_template,
            "sweep": args.sweep_values, "lines": args.line_values, "heldout_samples": args.heldout_samples,
            "processes": self.context.world, "profile": args.profile,
            "heldout_share": args.heldout_share,  # a validation/held-out forward's time, relative
            "settings": self.settings,  # what `--resume --output DIR` restores
            "fingerprint": self.fingerprint,  # what it compares before the search has a checkpoint
        }

    def write_record(self) -> None:
        """config.json written (a resume's entry appended), and this process's end stamped there however
        the run ends: the next resume's gap starts there."""
        write_config(self.record_path, self.args.resume, self.record(), self.launched_at, self.idle_before)
        self.folder_lock.callback(stamp_process_end, self.record_path)
