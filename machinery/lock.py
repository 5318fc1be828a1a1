"""One process writes a run folder: rank 0 holds a lock on it from the first write on (a
torchrun job whose launcher was killed leaves its ranks running: a --resume meanwhile is
refused)."""
import fcntl
import os
import socket

from machinery.errors import UserError


# the run folder this process holds, {lock file: its open file} (hold_run_folder)
held_folder = {}


def hold_run_folder(out_dir: str):
    """One process writes a run folder: an exclusive flock on its rlep.lock, taken before the
    first write and held for the process's life (the kernel lets go however the process ends, a
    SIGKILL too); the file names the holder. A second process on the folder is refused: a
    --resume while torchrun's ranks, orphaned by a SIGKILL of their launcher (each rank is in a
    session of its own), still write the run."""
    path = os.path.realpath(os.path.join(out_dir, "rlep.lock"))
    if path in held_folder:
        return  # an earlier main in this process holds it
    os.makedirs(out_dir, exist_ok=True)
    handle = open(path, "a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        raise UserError(f"--out_dir {out_dir}: in use by {holder} (it holds {path}): one "
                        "process writes a run; wait for it to end, or stop it") from None
    handle.truncate(0)
    handle.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
    handle.flush()
    # an earlier main's folder, in this process, is let go
    for earlier in held_folder.values():
        earlier.close()
    held_folder.clear()
    held_folder[path] = handle
