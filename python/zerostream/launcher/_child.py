"""What every process `zerostream run` starts runs first, before the user's program.

The elastic agent starts `python -u _child.py [--cores SETS] --run KIND -- TARGET [ARGS...]`
once per local rank, with its RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR... in the
environment. This file then:

0. asks the kernel to kill it when its agent dies (Note [Ranks die with their agent]);
1. adds DeepSpeed's launcher variables that torch's agent does not set (LOCAL_SIZE,
   CROSS_RANK, CROSS_SIZE), so code written for `deepspeed` finds them;
2. with --cores `0,1;2,3` (one set per local rank), binds this process to its set with
   os.sched_setaffinity and sets OMP_NUM_THREADS to the set's size (DeepSpeed's
   --bind_cores_to_rank does the same with numactl);
3. runs TARGET: KIND `script` runs a Python file as __main__ (like `python FILE`), `module`
   a module (like `python -m`), `exec` replaces this process with a program (--no_python).
   For Python targets an uncaught exception is written, in torch elastic's error-file format,
   to TORCHELASTIC_ERROR_FILE before the usual traceback, so the launcher can show the rank
   that failed first with its error (see Note [First failure] in failures.py).

It is run by path, not imported: it uses the standard library only, so a rank starts without
importing zerostream or torch on the user's behalf, and it is Python 3.9 compatible.
"""

import json
import os
import runpy
import sys
import time
import traceback

# Note [Ranks die with their agent]
# Elastic starts each rank in a session of its own, so a `kill -9` of `zerostream run` (the
# agent) reaches no rank: they went on training and writing checkpoints, orphaned, racing any
# restarted job on the same folders and, on a GPU box, holding the GPUs (issue 32). So each
# rank sets PR_SET_PDEATHSIG = SIGKILL first thing. Two Linux details matter:
# - the signal comes when the *thread* that forked the rank exits; elastic's agent starts the
#   ranks from its main thread (SubprocessHandler's Popen), which lives as long as the agent;
# - the agent may die between the fork and prctl, when no signal will ever come, so the
#   parent is checked again afterwards against the pid the agent wrote (ZS_AGENT_PID).
# The setting survives exec, so a --no_python program is covered too. SIGKILL, not SIGTERM:
# a rank's own handler must not keep it alive, and a checkpoint save cut short is never
# loaded (the tag is published by rename last).
_PR_SET_PDEATHSIG = 1


def _die_with_agent() -> None:
    agent = os.environ.get("ZS_AGENT_PID")
    if agent is None or not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
        err = ctypes.get_errno()
        print(
            f"zerostream run (rank start-up): prctl(PR_SET_PDEATHSIG) failed: "
            f"{os.strerror(err)}; this rank will outlive a killed agent",
            file=sys.stderr,
        )
        return
    if os.getppid() != int(agent):
        raise SystemExit("zerostream run: the agent that started this rank is gone; stopping")


def _deepspeed_env() -> None:
    for ours, theirs in (
        ("LOCAL_SIZE", "LOCAL_WORLD_SIZE"),
        ("CROSS_RANK", "GROUP_RANK"),
        ("CROSS_SIZE", "GROUP_WORLD_SIZE"),
    ):
        if theirs in os.environ:
            os.environ[ours] = os.environ[theirs]


def _bind(sets: str) -> None:
    local_rank = int(os.environ["LOCAL_RANK"])
    cores = [int(c) for c in sets.split(";")[local_rank].split(",")]
    os.sched_setaffinity(0, cores)
    os.environ["OMP_NUM_THREADS"] = str(len(cores))


def _write_error_file(exc: BaseException) -> None:
    """The layout of torch.distributed.elastic's ErrorHandler.record_exception, which the
    agent reads back into ProcessFailure. A file already there was written by the user's own
    @record and is kept."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path or os.path.exists(path):
        return
    data = {
        "message": {
            "message": f"{type(exc).__name__}: {exc}",
            "extraInfo": {
                "py_callstack": "".join(
                    traceback.format_exception(type(exc), exc, exc.__traceback__)
                ),
                "timestamp": str(int(time.time())),
            },
        }
    }
    try:
        with open(path, "w") as f:
            json.dump(data, f)
    except OSError:
        pass  # the traceback still goes to stderr


def _user_frames(tb):
    """The traceback without this file's and runpy's frames, as `python FILE` would show."""
    skip = (os.path.abspath(__file__), os.path.abspath(runpy.__file__), "<frozen runpy>")
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        if name not in skip and os.path.abspath(name) not in skip:
            break
        tb = tb.tb_next
    return tb


def _set_path0(entry: str) -> None:
    """sys.path[0] as `python FILE` or `python -m` would have it, not this file's folder (where
    a module named like ours would shadow the user's)."""
    here = os.path.dirname(os.path.abspath(__file__))
    if sys.path and os.path.abspath(sys.path[0] or ".") == here:
        del sys.path[0]
    if not getattr(sys.flags, "safe_path", False):  # python -P / PYTHONSAFEPATH: none added
        sys.path.insert(0, entry)


def _run_python(kind: str, target: str, args: list) -> None:
    sys.argv = [target] + args  # run_module replaces argv[0] with the module's file
    if kind == "module":
        _set_path0(os.getcwd())
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    else:
        _set_path0(os.path.dirname(os.path.realpath(target)))
        runpy.run_path(os.path.abspath(target), run_name="__main__")  # __file__ as python sets it


def main(argv: list) -> None:
    cores, kind = None, None
    while argv and argv[0] != "--":
        flag, value, argv = argv[0], argv[1], argv[2:]
        if flag == "--cores":
            cores = value
        elif flag == "--run":
            kind = value
        else:
            raise SystemExit(f"zerostream run (rank start-up): unknown option {flag}")
    target, args = argv[1], argv[2:]
    _die_with_agent()
    _deepspeed_env()
    if cores:
        _bind(cores)
    if kind == "exec":
        try:
            os.execvp(target, [target] + args)
        except OSError as exc:
            raise SystemExit(f"zerostream run: cannot start {target!r}: {exc.strerror}") from None
    failure = None
    try:
        _run_python(kind, target, args)
    except SystemExit:
        raise
    except BaseException as exc:
        failure = exc
    if failure is not None:
        # Hooks such as torch.distributed's format exc.__traceback__, not their argument.
        failure = failure.with_traceback(_user_frames(failure.__traceback__))
        if not isinstance(failure, KeyboardInterrupt):  # Ctrl-C, or elastic stopping the job
            _write_error_file(failure)
        sys.excepthook(type(failure), failure, failure.__traceback__)
        # An uncaught exception's status (128 + SIGINT for an interrupt, as a shell reports
        # it); atexit hooks still run.
        sys.exit(130 if isinstance(failure, KeyboardInterrupt) else 1)


if __name__ == "__main__":
    main(sys.argv[1:])
