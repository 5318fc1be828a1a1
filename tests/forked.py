"""The tests' ranks and scripts, forked instead of started afresh: `spawn(fn, args)` is torch's
mp.spawn with the forkserver start method, `script(path, argv, stderr)` a `python path argv`. The
server, one a test process, imports torch, transformers and rlep once; each process is forked from
it, a new process with nothing of an earlier test's, ready in milliseconds where a spawned one
spends seconds importing. The parent's environment at the server's start is the forked
processes' (tests/conftest.py sets it at import)."""
import multiprocessing
import os
import runpy
import sys

import torch.multiprocessing as mp

# what every rank imports, imported once in the server (rlep brings torch, torch.distributed and
# machinery; transformers it imports lazily); a test module's own imports follow
multiprocessing.set_forkserver_preload(["transformers", "rlep"])


def spawn(fn, args=(), nprocs=2):
    """fn(rank, *args) on nprocs processes forked from the server, joined; a rank's exception
    raised here, as mp.spawn does."""
    return mp.start_processes(fn, args=args, nprocs=nprocs, start_method="forkserver")


def script(path, argv, stderr):
    """`python path *argv` forked from the server, its stderr into the file `stderr`: the process,
    started (`.join()`, then `.exitcode`). The server's imports print nothing here: a test of
    what a script prints at its start runs it in a process of its own."""
    process = multiprocessing.get_context("forkserver").Process(target=as_main,
                                                                 args=(path, argv, stderr))
    process.start()
    return process


def as_main(path, argv, stderr):
    fd = os.open(stderr, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 2)
    os.close(fd)
    sys.argv = [path, *argv]
    runpy.run_path(path, run_name="__main__")  # its sys.exit(code) is the process's exit code
