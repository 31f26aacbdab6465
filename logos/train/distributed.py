"""Process group set-up and the few collectives the trainer needs (one process or many, CPU or GPU).

One process needs RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT (else DeepSpeed looks
for MPI): :func:`init` fills in single-process defaults for what no launcher set, then starts
DeepSpeed's process group (gloo on CPU, nccl on GPU).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

import torch

__all__ = ["Dist", "init", "shutdown", "free_port"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env_defaults() -> None:
    """Single-process defaults for the variables a launcher (torchrun, deepspeed) would set."""
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))


@dataclass(frozen=True)
class Dist:
    """This process's place in the group, and collectives that are no-ops in a group of one."""

    rank: int
    world: int

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.world > 1:
            torch.distributed.barrier()

    def all_sum(self, t: torch.Tensor) -> torch.Tensor:
        if self.world > 1:
            t = t.clone()
            torch.distributed.all_reduce(t)
        return t

    def all_max(self, value: float) -> float:
        if self.world == 1:
            return value
        t = torch.tensor([float(value)], dtype=torch.float64)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
        return float(t.item())

    def gather_objects(self, obj) -> list:
        """Every rank's ``obj``, in rank order, on every rank."""
        if self.world == 1:
            return [obj]
        out = [None] * self.world
        torch.distributed.all_gather_object(out, obj)
        return out

    def from_main(self, obj):
        """Rank 0's ``obj`` on every rank."""
        if self.world == 1:
            return obj
        box = [obj if self.is_main else None]
        torch.distributed.broadcast_object_list(box, src=0)
        return box[0]


def init() -> Dist:
    """Start (or join) the process group through DeepSpeed."""
    import deepspeed

    _env_defaults()
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    deepspeed.init_distributed(dist_backend=backend, verbose=False)
    return Dist(torch.distributed.get_rank(), torch.distributed.get_world_size())


def shutdown() -> None:
    """Leave a group of several processes in order once a run has ended on every rank: all ranks meet, then the
    group is destroyed. Left to the interpreter's exit, the process group's threads can be torn down while one is
    still in use, and the process aborts ("terminate called without an active exception") after its work is
    done. A group of one is left as it is (a process may train again)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized() and \
            torch.distributed.get_world_size() > 1:
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
