"""Scale-out with accelerate: every fitness evaluation's samples are split across processes.

    accelerate launch --multi_gpu --num_processes 2 searches/ga.py ...   # gloo on CPU, nccl on GPU
    torchrun --nproc_per_node 2 searches/ga.py ...                       # the same

(``accelerate launch --cpu`` starts a single process: accelerate routes multi-CPU runs
through MPI, so use ``--multi_gpu``, which on a machine without GPUs gives gloo.)

Rank 0 drives the genetic algorithm. For each individual it broadcasts the layer scales
and the racing threshold; every rank scores the samples whose index ≡ rank (mod world)
and the scores are gathered back into sample order after each racing chunk. All ranks
see the same gathered scores, so they take the same racing decisions in lockstep, and
the fitness equals a single-process run's.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from lpes_harness.search.fitness import LMEvalFitness

_STOP = "stop"


@dataclass
class Context:
    rank: int = 0
    world: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def launched_rank() -> int:
    """This process's rank as its launcher set it (torchrun and ``accelerate launch`` set ``RANK``), known
    before :func:`init` loads anything: what decides who holds the run folder. 0 when not launched so."""
    return int(os.environ.get("RANK", "0"))


def init() -> Context:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return Context()
    import torch
    from accelerate import PartialState

    # cpu=True makes accelerate set up a gloo group when there is no GPU, whatever launcher
    # started us (`accelerate launch --multi_gpu` or torchrun both set WORLD_SIZE).
    state = PartialState(cpu=not torch.cuda.is_available())
    return Context(rank=state.process_index, world=state.num_processes)


def _broadcast(obj):
    import torch.distributed as dist

    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _gather(indices, mine, local_scores):
    """All ranks' scores for ``indices``, in that order."""
    import torch.distributed as dist

    pieces = [None] * dist.get_world_size()
    dist.all_gather_object(pieces, list(zip(mine, local_scores)))
    by_index = {index: score for piece in pieces for index, score in piece}
    return [by_index[index] for index in indices]


class DistributedFitness(LMEvalFitness):
    def __call__(self, scales, threshold: float | None = None):
        if self.rank == 0 and self.world > 1:  # world is 1 once release() let the other ranks go
            _broadcast((list(scales), threshold))
        return super().__call__(scales, threshold)


def make_fitness(lm, config, context: Context) -> LMEvalFitness:
    if context.world == 1:
        return LMEvalFitness(lm, config)
    return DistributedFitness(lm, config, shard=(context.rank, context.world), gather=_gather)


def serve(fitness: LMEvalFitness, context: Context) -> None:
    """Non-zero ranks: evaluate what rank 0 broadcasts, until it says stop."""
    while True:
        message = _broadcast(None)
        if message == _STOP:
            _leave()
            return
        scales, threshold = message
        LMEvalFitness.__call__(fitness, scales, threshold)


def release(context: Context, fitness: LMEvalFitness | None = None) -> None:
    """Rank 0, after the search: the other ranks stop serving and exit. What rank 0 scores after that (the
    uniform factors, the validation) it scores alone, on every sample: ``fitness`` is made a one-process one."""
    if context.world > 1 and context.is_main:
        _broadcast(_STOP)
        _leave()
        if fitness is not None:
            fitness.rank, fitness.world = 0, 1


def _leave() -> None:
    """Every rank leaves the process group together, once the last evaluation is over. A gloo group left for
    the interpreter's exit to tear down while a peer may still be mid-broadcast can abort a rank at exit
    ("terminate called without an active exception": the flaky two-process test of tests/test_search_cli.py)."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
