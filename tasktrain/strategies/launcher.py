"""Start the other worker processes when the user ran a plain `python train.py` with a multi-process strategy.

Like torchrun, the same command is run again once per extra rank, with RANK / WORLD_SIZE / LOCAL_RANK /
MASTER_ADDR / MASTER_PORT set; this process becomes rank 0. A watchdog thread stops the whole run when a
worker dies, so a failed rank never leaves the others waiting on a collective until the timeout.
"""
import atexit
import os
import signal
import socket
import subprocess
import sys
import threading
import time


def find_free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _command():
    # `python -m package.module` is re-run as such; a script as a script.
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name and spec.name != "__main__":
        return [sys.executable, "-m", spec.name.removesuffix(".__main__")] + sys.argv[1:]
    script = os.path.abspath(sys.argv[0])
    if not os.path.exists(script):
        raise RuntimeError(
            f"Cannot start worker processes: this program was not started from a script file ({sys.argv[0]!r}), "
            "for example from a notebook or `python -c`. Run a script, use strategy='ddp_spawn', or start it "
            "with `torchrun --nproc_per_node N script.py` / `tasktrain launch`."
        )
    return [sys.executable, script] + sys.argv[1:]


class SubprocessLauncher:
    def __init__(self, num_processes: int, num_nodes: int = 1):
        self.num_processes = num_processes
        self.num_nodes = num_nodes
        self.procs = []
        self.failed = None

    def launch(self):
        """Start ranks 1..N-1 and set this process's environment as rank 0."""
        if self.num_nodes > 1:
            raise RuntimeError(
                f"num_nodes={self.num_nodes} needs a launcher on every machine: run the script with "
                "`torchrun --nnodes N --node_rank R --master_addr HOST --nproc_per_node D script.py` or "
                "`tasktrain launch --num_machines N --machine_rank R ...` on each machine."
            )
        port = os.environ.get("MASTER_PORT") or str(find_free_port())
        common = {
            "MASTER_ADDR": os.environ.get("MASTER_ADDR", "127.0.0.1"),
            "MASTER_PORT": port,
            "WORLD_SIZE": str(self.num_processes),
            "LOCAL_WORLD_SIZE": str(self.num_processes),
            "GROUP_RANK": "0",
            "TASKTRAIN_LAUNCHER": "self",
        }
        cmd = _command()
        for rank in range(1, self.num_processes):
            env = dict(os.environ, **common, RANK=str(rank), LOCAL_RANK=str(rank))
            self.procs.append(subprocess.Popen(cmd, env=env))
        os.environ.update(common, RANK="0", LOCAL_RANK="0")
        atexit.register(self.kill)
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self):
        while self.procs:
            for rank, proc in enumerate(list(self.procs), start=1):
                code = proc.poll()
                if code not in (None, 0) and self.failed is None:
                    self.failed = (rank, code)
                    print(
                        f"[tasktrain] rank {rank} (pid {proc.pid}) exited with code {code}; stopping the other ranks. "
                        "Its error is printed above.",
                        file=sys.stderr,
                        flush=True,
                    )
                    self.kill()
                    # rank 0 may be blocked inside a collective waiting for the dead rank: end it now.
                    os.kill(os.getpid(), signal.SIGTERM)
                    time.sleep(5)
                    os._exit(1)
            time.sleep(0.2)

    def join(self, timeout=60.0):
        """Wait for the other ranks after a successful run; a rank that failed makes this process fail too."""
        deadline = time.monotonic() + timeout
        procs, self.procs = self.procs, []  # stops the watchdog
        for rank, proc in enumerate(procs, start=1):
            try:
                code = proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                code = proc.wait()
            if code != 0:
                raise RuntimeError(f"Worker rank {rank} (pid {proc.pid}) exited with code {code}; see its error above.")

    def kill(self):
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
