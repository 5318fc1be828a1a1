"""The ranks of a torchrun job and their object collectives: a plain `python rlep.py` gets
the same names (one rank). Rank 0 decides what every rank must agree on (rank0_decides: one
broadcast of its answer, or of the error it raised); the ranks gather small lists (a step's sizes
and counts), bring results to rank 0, which alone writes files, and exchange training rows (one
all-to-all a step: each rank receives the rows planned for it). A rank's unexpected error ends
the job at once (end_rank).

Object collectives cost what they carry: `rank0_decides` broadcasts rank 0's answer once
(torch's all_gather_object would pad every rank's copy to the largest and hand each rank all W of
them), and `gather_to_rank0` brings results to the one rank that writes them."""
import datetime
import io
import os
import pickle
import traceback
from typing import NamedTuple

import torch
import torch.distributed as dist

from machinery import RunStopped, UserError
from machinery.interrupts import end_at_once


class Dist(NamedTuple):
    distributed: bool  # under torchrun: W processes, the policy sharded by FSDP2
    rank: int
    world_size: int
    device: torch.device
    master_process: bool  # rank 0, which alone prints and writes files


def setup_distributed(timeout_minutes: int = 180) -> Dist:
    if "RANK" not in os.environ:
        return Dist(False, 0, 1, torch.device("cuda" if torch.cuda.is_available() else "cpu"), True)
    # NCCL's default can be shorter than a rank's generation
    timeout = datetime.timedelta(minutes=timeout_minutes)
    # vLLM reuses this group; with TP = 1 it must exist before the engine (docs/cpu.md)
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
        # Object collectives on gloo: pickles stay off the GPU. FSDP2's tensor collectives take
        # NCCL, and so does dist.barrier (device_id is bound).
        dist.init_process_group("cpu:gloo,cuda:nccl", device_id=device, timeout=timeout)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", timeout=timeout)
    return Dist(True, dist.get_rank(), dist.get_world_size(), device, dist.get_rank() == 0)


def end_rank(error: BaseException):
    """A rank's stop under torchrun, of any kind but Ctrl-C (every rank's; rank 0 says where it
    stopped): bad input (exit 2), a run that cannot go on (exit 1), an unexpected error (its
    traceback first, exit 1); SIGTERM's is interrupts.catch_stops. One line naming the
    rank, then the process ends at once, before any teardown: the stop may be this rank's alone (a
    full disk in rank 0's save while the others wait in a barrier), vLLM's shutdown and
    destroy_process_group can wait on ranks stuck in a collective (NCCL's abort: pytorch#132696),
    and while this rank lives torchrun leaves the others waiting for up to --timeout_minutes; its
    exit makes torchrun end them. A plain process: nothing (the caller's one line, or the error
    goes on)."""
    if "RANK" not in os.environ or isinstance(error, KeyboardInterrupt):
        return
    line = f"stopped: {error}"
    if not isinstance(error, (UserError, RunStopped)):
        traceback.print_exception(error)
        line = f"failed: {type(error).__name__}: {(str(error).splitlines() or [''])[0]}"
    end_at_once(f"rlep.py: rank {os.environ['RANK']} {line}",
                2 if isinstance(error, UserError) else 1)


def gather_lists(items: list, d: Dist) -> list:
    """Every rank's list, concatenated in rank order, on every rank: for what each rank needs of
    the others (small: a step's sizes and counts)."""
    if not d.distributed:
        return items
    gathered = [None] * d.world_size
    dist.all_gather_object(gathered, items)
    return [x for part in gathered for x in part]


def gather_to_rank0(items: list, d: Dist) -> list:
    """Every rank's list, concatenated in rank order, on rank 0; the other ranks get []."""
    if not d.distributed:
        return items
    gathered = [None] * d.world_size if d.master_process else None
    dist.gather_object(items, gathered, dst=0)
    return [x for part in gathered or [] for x in part]  # gathered: None off rank 0


def rank0_decides(decide, d: Dist):
    """decide() on rank 0 alone; its answer, or the error it raised, on every rank, which returns
    or raises the same. One answer for all: a shared filesystem (NFS caches listings) can show
    ranks different files, and then they run different collectives; a refusal on rank 0 alone
    would leave the others waiting in the next collective."""
    message = [None, None]  # rank 0's answer, or the error it raised
    if d.master_process:
        try:
            message[0] = decide()
        except Exception as e:  # re-raised below, on every rank
            message[1] = e
    if d.distributed:
        dist.broadcast_object_list(message, src=0)
    answer, error = message
    if error is not None:
        raise error
    return answer


def barrier(d: Dist):
    if d.distributed:
        dist.barrier()


def exchange(outgoing: list[list], d: Dist) -> list:
    """outgoing[r] to rank r; back, what every rank sent this one, in rank order. One all-to-all
    of pickled bytes on the host (gloo): a rank receives only its own."""
    if not d.distributed:
        return outgoing[0]
    kept = outgoing[d.rank]  # not through pickle
    payloads = [row_bytes([] if r == d.rank else items) for r, items in enumerate(outgoing)]
    send_sizes = torch.tensor([len(p) for p in payloads])
    recv_sizes = torch.empty_like(send_sizes)
    dist.all_to_all_single(recv_sizes, send_sizes)
    sent = torch.frombuffer(bytearray(b"".join(payloads)), dtype=torch.uint8)
    received = torch.empty(int(recv_sizes.sum()), dtype=torch.uint8)
    dist.all_to_all_single(received, sent, recv_sizes.tolist(), send_sizes.tolist())
    items = []
    # each rank's bytes, a view of the received buffer; pickle reads a numpy array's buffer
    for rank, part in enumerate(received.split(recv_sizes.tolist())):
        items += kept if rank == d.rank else pickle.loads(part.numpy())
    return items


class RowPickler(pickle.Pickler):
    """Rows cross ranks as plain data (token ids, floats): a tensor in one would be restored on
    the sender's device index on the receiver (rank 5's cuda:5 tensor on rank 2's cuda:5), so one
    is refused."""

    def reducer_override(self, obj):
        if isinstance(obj, torch.Tensor):
            raise TypeError(f"exchange: a row carries a tensor ({obj.dtype}, {obj.device}); rows "
                            "cross ranks as plain data, made before any tensor of theirs")
        return NotImplemented


def row_bytes(items: list) -> bytes:
    buffer = io.BytesIO()
    RowPickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(items)
    return buffer.getvalue()
