"""DeepSpeed's compiled ops and the lock a killed build leaves behind.

DeepSpeed builds its C++ ops (cpu_adam, async_io, fused_adam, ...) just in time with torch.utils.cpp_extension, which
takes a FileBaton, `<TORCH_EXTENSIONS_DIR>/<op>/lock`, around every load (a quick ninja run when the op is built
already, minutes when it is not). A process killed while it holds the baton leaves the file, and every later load of
that op waits for it forever, silently. clear_stale_op_locks removes such a file before tasktrain loads ops
(engine.import_deepspeed, the Makefile's ops step, the tests' conftest) when nothing can be holding it: the op's .so
is built, neither the lock nor any other file of the op's folder changed for STALE_LOCK_SECONDS (a build writes its
objects as it goes; the longest pause measured here, async_io on 2 cores, was 4 minutes), and no process on this
machine has the lock open (the baton keeps its file open while held). An old lock it must keep (no .so yet: a first
build may be running on another machine of a shared folder) is named in a warning with what to do.

A leaf module: it imports neither deepspeed nor the rest of tasktrain (the Makefile runs it before either is needed).
"""
import glob
import os
import time
import warnings

STALE_LOCK_SECONDS = 600
_warned = set()  # old locks already named in a warning by this process


def extensions_root():
    """Where torch builds its extensions: $TORCH_EXTENSIONS_DIR, else torch's default root (whose op folders lie one
    level further down, under a python/accelerator folder such as py311_cpu)."""
    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    if root:
        return root
    from torch.utils.cpp_extension import get_default_build_root

    return get_default_build_root()


def clear_stale_op_locks(root=None, max_age=STALE_LOCK_SECONDS):
    """Remove the stale op locks under `root` (default: extensions_root()), each with a warning naming the file;
    returns the paths removed."""
    root = glob.escape(root or extensions_root())
    removed = []
    for lock in glob.glob(os.path.join(root, "*", "lock")) + glob.glob(os.path.join(root, "*", "*", "lock")):
        folder = os.path.dirname(lock)
        op = os.path.basename(folder)
        now = time.time()
        try:
            age = now - os.stat(lock).st_mtime
            names = os.listdir(folder)
            changed = max((os.stat(os.path.join(folder, name)).st_mtime for name in names), default=0)
        except FileNotFoundError:  # released (or removed by another rank) meanwhile
            continue
        if age < max_age:
            continue  # a build or a quick check of a built op: this load waits for it, as it should
        built = any(name.endswith(".so") for name in names)
        if built and now - changed >= max_age and not _held_on_this_machine(lock):
            try:
                os.remove(lock)
            except FileNotFoundError:
                continue
            removed.append(lock)
            warnings.warn(f"Removed the stale lock file {lock!r} of DeepSpeed's {op} op ({age / 60:.0f} minutes old, "
                          "left by a process killed while loading the op): its .so is built and no build has "
                          "touched the folder since, and every later load of the op would have waited for it forever.",
                          RuntimeWarning, stacklevel=2)
        elif lock not in _warned:
            _warned.add(lock)
            warnings.warn(f"DeepSpeed's {op} op is locked by {lock!r} ({age / 60:.0f} minutes old): loading the op "
                          "waits until the build holding it ends. If no build of it is running on any machine (a "
                          "process killed while building it), delete that file and run again.",
                          RuntimeWarning, stacklevel=2)
    return removed


def _held_on_this_machine(path):
    """Whether a process of this machine has `path` open (a live FileBaton holder keeps it open). Processes this
    user may not inspect, and machines without /proc, count as not holding it."""
    path = os.path.realpath(path)
    for fd_folder in glob.glob("/proc/[0-9]*/fd"):
        try:
            fds = os.listdir(fd_folder)
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(os.path.join(fd_folder, fd)) == path:
                    return True
            except OSError:
                continue
    return False
