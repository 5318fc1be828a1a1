"""The tests' ranks, forked instead of started afresh: `spawn(fn, args)` is torch's mp.spawn with
the forkserver start method. The server, one a test process, imports torch, transformers and
rlep once; each rank is forked from it, a new process with nothing of an earlier test's ranks,
ready in milliseconds where a spawned one spends seconds importing. The parent's environment at
the server's start is the ranks' (tests/conftest.py sets it at import)."""
import multiprocessing

import torch.multiprocessing as mp

# what every rank imports, imported once in the server (rlep brings torch, torch.distributed and
# machinery; transformers it imports lazily); a test module's own imports follow
multiprocessing.set_forkserver_preload(["transformers", "rlep"])


def spawn(fn, args=(), nprocs=2):
    """fn(rank, *args) on nprocs processes forked from the server, joined; a rank's exception
    raised here, as mp.spawn does."""
    return mp.start_processes(fn, args=args, nprocs=nprocs, start_method="forkserver")
