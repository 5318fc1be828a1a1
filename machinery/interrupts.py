"""How a run stops on Ctrl-C or SIGTERM: where it stopped, what is saved, the command that
continues it."""
import atexit
import contextlib
import os
import shlex
import signal
import sys
import threading


# A stop (Ctrl-C, SIGTERM) of a plain `python rlep.py` (a torchrun rank's SIGTERM ends it at
# once: catch_stops) raises KeyboardInterrupt at once, but not inside a save: torch's
# checkpoint code would wrap it in another error and leave half a checkpoint, so the stop waits
# for the save's end. "why": the stop asked for, seen at the next step or chunk (stop_if_asked)
# where a raise got lost (caught in a __del__); "deferred": inside a save; "script": the script
# whose main runs (raising: its main catches the stop); before that, during the imports, a stop
# ends the process at once in one line.
stop = {"why": "", "deferred": False, "script": ""}


def catch_stops(script: str = ""):
    """ask_to_stop for Ctrl-C and SIGTERM, in a plain process, from a script's first line (its
    imports take seconds). With `script`, its main has started: a stop raises there. Under
    torchrun, a rank's Ctrl-C keeps Python's default, and its SIGTERM ends it at once in one line
    naming it, also while it waits in a collective, where a Python handler would run only once the
    call returns (for up to --timeout_minutes). Python's C handler writes the signal's number to
    the wakeup fd at once; a thread reading it ends the process (the handler itself, where the fd
    was taken over)."""
    stop["script"] = script
    if "RANK" not in os.environ:
        signal.signal(signal.SIGINT, ask_to_stop)
        signal.signal(signal.SIGTERM, ask_to_stop)
    elif not script:  # once, from the first line
        def end(*_):
            end_at_once(f"rlep.py: rank {os.environ['RANK']} stopped: SIGTERM", 143)

        def wait():
            while os.read(read, 1)[0] != signal.SIGTERM:  # Ctrl-C's, here for KeyboardInterrupt
                pass
            end()
        read, write = os.pipe()
        os.set_blocking(write, False)
        signal.set_wakeup_fd(write)
        signal.signal(signal.SIGTERM, end)
        threading.Thread(target=wait, daemon=True).start()


def ask_to_stop(signum, frame):
    """The handler of SIGINT and SIGTERM; a second one stops a save too."""
    again = stop["why"]  # a stop asked for before this one
    stop["why"] = "SIGTERM" if signum == signal.SIGTERM else "Ctrl-C"
    if not stop["script"]:  # still importing: nothing is written yet
        name = os.path.basename(sys.argv[0])
        # the shell's code of a signal's end: 130 (Ctrl-C), 143 (SIGTERM)
        end_at_once(f"{name}: stopped ({stop['why']}) while starting; nothing written",
                    128 + signum)
    if again or not stop["deferred"]:
        stop_if_asked()


def end_at_once(line: str, code: int):
    """One line, then the process's end at once, before any teardown or exit handler: the stops
    that cannot wait (while starting, a rank's SIGTERM, a rank's stop: ranks.end_rank)."""
    print(line, file=sys.stderr, flush=True)
    os._exit(code)


def stop_if_asked():
    """A safe point: a stop asked for and not yet acted on takes effect here."""
    if stop["why"]:
        raise KeyboardInterrupt(stop["why"])


@contextlib.contextmanager
def saving():
    """A save a stop waits for; a second stop does not wait."""
    stop["deferred"] = True
    try:
        yield
    finally:
        stop["deferred"] = False
    stop_if_asked()


def end_on_stop(error: BaseException, cfg, argv: list, where: str):
    """rlep.py's end after a stop: one line on rank 0, where the run stopped, what is saved, the
    command that continues it (cfg: the command's config, its out_dir), then exit 130 (Ctrl-C) or
    143 (SIGTERM). The line comes first: main leaves the engine's shutdown (two full garbage
    collections, 2 to 9 s here) to vLLM's exit handler. A plain process then runs its exit
    handlers (vLLM's, W&B's) and ends without Python's teardown of torch's and vLLM's objects (10
    s and more here). Any other error, unless raised during a stop (a library's wrapping of it),
    is raised again."""
    if not (isinstance(error, KeyboardInterrupt) or stop["why"]):
        raise error
    # imported here: this module is imported before torch (catch_stops, from a script's first line)
    from machinery.checkpoints import latest_checkpoint
    from machinery.data import read_collection

    def line(why):  # on rank 0 alone: the other ranks may see other files
        said = "nothing written"
        if os.path.isfile(os.path.join(cfg.out_dir, "config.json")):
            first, second = (latest_checkpoint(os.path.join(cfg.out_dir, part))[0]
                             for part in ("phase1", "phase2"))
            pooled, done = read_collection(os.path.join(cfg.out_dir, "collect"))
            held = [(f"phase1 step {first}", first), ("the pool", pooled),
                    (f"the collection's first {len(done)} prompts", done and not pooled),
                    (f"phase2 step {second}", second)]
            saved = ", ".join(name for name, there in held if there) or "no checkpoint yet"
            launcher = "torchrun [as before]" if "RANK" in os.environ else "python"
            command = shlex.join([sys.argv[0], *argv] + ([] if cfg.resume else ["--resume"]))
            said = f"saved in {cfg.out_dir}: {saved}; continue with: {launcher} {command}"
        return f"rlep.py: stopped ({why}) in {where}; {said}"
    end(line)


def end(line):
    """A stopped script's end: line(why) on rank 0, exit 130 (Ctrl-C) or 143 (SIGTERM); a plain
    process runs its exit handlers and skips Python's teardown. why: the stop asked for (every
    KeyboardInterrupt of ask_to_stop's and stop_if_asked's), else Ctrl-C (Python's default
    handler raised it: a torchrun rank's)."""
    why = stop["why"] or "Ctrl-C"
    if os.environ.get("RANK", "0") == "0":
        print(line(why), file=sys.stderr, flush=True)
    code = 143 if why == "SIGTERM" else 130
    if "RANK" in os.environ:
        sys.exit(code)
    sys.stdout.flush()
    atexit._run_exitfuncs()
    os._exit(code)


def end_eval():
    """eval.py's end after a stop: what it sampled is kept, and the same command continues."""
    end(lambda why: f"eval.py: stopped ({why}); the problems sampled so far are kept "
        "(samples.jsonl): the same command continues")
