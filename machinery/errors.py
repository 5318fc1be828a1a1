"""Bad input: a flag, file, row, folder or disk the run cannot take. rlep.py and eval.py print
its message as one line and exit 2; anything else keeps its traceback."""


class UserError(ValueError):
    """Bad input (a flag, file, row, folder, the disk): rlep.py prints the message as one line
    and exits 2; anything else keeps its traceback."""
