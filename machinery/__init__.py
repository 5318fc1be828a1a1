"""What a run of rlep.py needs beside the method, a module an idea.

The rule of the boundary: a line belongs in rlep.py if changing it changes a number the loss, the
reward, the advantages, the pool or the choice of groups sees (log π at T, the loss's tokens, N,
the pool's rule). What a reader may take on trust from its call lives here: processes and
collectives, sharding, the engine's push and sleep, the memory and balance plan, files,
checkpoints, checks, the lock, Ctrl-C, the report. rlep.py calls each by module
(`checkpoints.save(...)`), so a call says where it goes; none of them needs rlep.py's types (a
docstring says which fields of a sample or a config a function reads).

    ranks         the ranks of a torchrun job: rank 0 decides, the ranks gather and exchange rows,
                  a rank's failure ends the job
    vllm_engine   the rank's vLLM engine: generation, the weight push and its guard, sleep and wake
    fsdp          the policy's weights on the devices: the dtype, rank 0's read, FSDP2's shards
    planner       the update's plan: micro-batches dealt to the ranks as rows, FSDP2's lockstep
    data          data rows and pool files, read and checked row by row
    schema        a data row's fields, checked by pydantic (imported where rows are read)
    hub           names on the Hugging Face hub (models, dataset files): fetched once, their commit
    builtin       the small presets' built-in tasks and models, made here
    files         files written whole, JSONL, config.json, the run folder's lock
    checkpoints   checkpoints written whole, pruned, resumed
    metrics       a step's metrics: summed over the ranks, written, printed, sent to W&B
    report        the comparison of baseline and RLEP, its curves, the time table
    preflight     the command line and every input checked before anything is written
    disk          a command's disk peak against the free space
    interrupts    Ctrl-C and SIGTERM: stop at a safe point, say where, in one line

UserError, below, is bad input, refused before anything is written: rlep.py and eval.py print
its message as one line and exit 2. RunStopped is a run that cannot go on for a reason it names (an
update no longer finite, a full disk, an empty pool): one line, exit 1, what is saved kept.
"""


class UserError(ValueError):
    """Bad input (a flag, file, row, folder, the disk): rlep.py and eval.py print the message as
    one line and exit 2; anything else keeps its traceback."""


class RunStopped(Exception):
    """A run that cannot go on after its start, for a reason the message names (a diverged
    update, a disk full in a save, an empty pool): rlep.py prints it as one line and exits 1;
    what is saved stays (the last whole checkpoint)."""
