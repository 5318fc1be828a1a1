"""What a paper-scale run of rlep.py needs beside the method, a module an idea. rlep.py calls each
by module (`checkpoints.save(...)`), so a call says where it goes; none of them needs rlep.py's
types (a docstring says which fields of a sample or a config a function reads).

    ranks         the ranks of a torchrun job: rank 0 decides, the ranks gather
    vllm_engine   the rank's vLLM engine: generation, the weight push and its guard, sleep and wake
    fsdp          the policy: read by rank 0, sharded by FSDP2, its token log-probs at T
    planner       the update's plan: micro-batches dealt to the ranks as rows, FSDP2's lockstep
    collate       a micro-batch as tensors
    data          data rows and the experience pool, read and checked
    files         files written whole, JSONL, config.json, hub dataset files
    checkpoints   checkpoints written whole, pruned, resumed
    step_metrics  a step's row of metrics.jsonl, its printed line, W&B
    report        the comparison of baseline and RLEP, its curves, the time table
    checks        what is refused before anything is written or any engine starts
    disk          a command's disk peak against the free space
    lock          one process writes a run folder
    stops         Ctrl-C and SIGTERM: at a safe point, in one line
    cli           the command line from Config's fields
    models        a model folder: as given, fetched from the hub, or built here
    tasks         the small presets' built-in tasks
    precision     the dtype a CPU trains fastest in, measured
    errors        UserError: bad input, one line, exit 2
"""
