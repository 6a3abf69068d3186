"""Start the other worker processes when the user ran a plain `python train.py` with a multi-process strategy.

Like torchrun, the same command is run again once per extra rank, with RANK / WORLD_SIZE / LOCAL_RANK /
MASTER_ADDR / MASTER_PORT set; this process becomes rank 0. The workers run the whole script, so every
`trainer.fit` / `trainer.test` call of the script happens on every rank.

Failures end the whole run quickly and say who failed:
- a worker that exits non-zero (an error, or a signal such as SIGKILL) is seen by a watchdog thread of rank 0
  within a fraction of a second: it prints "rank R (pid P) failed: <its error>", kills the other workers and
  ends rank 0 with exit code 1, even when rank 0 is blocked in a collective waiting for the dead rank;
- a worker's uncaught error is written to its TASKTRAIN_ERROR_FILE (set up by the DDP strategy), so that
  message carries the error itself, not only an exit code;
- when rank 0 fails, it kills the workers at exit; when rank 0 disappears (SIGKILL), each worker notices
  (its parent is gone) and exits.
At a normal exit rank 0 waits for the workers (they finish the same script) and exits non-zero if one failed.
"""
import atexit
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

JOIN_TIMEOUT = 120.0  # seconds rank 0 waits at exit for workers that are still finishing the script
INTERRUPT_GRACE = 15.0  # after Ctrl-C: seconds for the workers' on_exception; one blocked in a collective never ends


def find_free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def threads_per_process(num_processes):
    """OMP_NUM_THREADS for each of `num_processes` ranks started on this machine: the CPUs this process may run on,
    shared out (at least 1), as Lightning's launchers set it; None when the user set OMP_NUM_THREADS (theirs stays).
    Without it every rank starts one torch thread per core, and N ranks on the same cores spend their time
    waiting for each other's threads (`make demo`, 2 ranks on 2 cores: 2.4x the CPU time of one thread each)."""
    if "OMP_NUM_THREADS" in os.environ:
        return None
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return str(max(1, cpus // num_processes))


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


def _refuse_lightning_launch():
    """Lightning's `strategy.launcher.launch(function, *args, trainer=...)` (run a function on every rank)."""
    raise NotImplementedError(
        "strategy.launcher.launch(function, ..., trainer=...) (Lightning's) is not supported: tasktrain starts the "
        "processes when a Trainer entry point sets up (trainer.fit / validate / test / predict). To run a function "
        "on every rank, use tasktrain.notebook_launcher(function, args, num_processes=N) or torchrun.")


class SubprocessLauncher:
    is_interactive_compatible = False  # Lightning's: re-running the command cannot work from a notebook

    def __init__(self, num_processes: int, num_nodes: int = 1, external: bool = False):
        self.num_processes = num_processes
        self.num_nodes = num_nodes
        # a launcher outside started the processes: this one is the view Lightning gives there, starting nothing
        self.external = external
        self.procs = []  # Popen of ranks 1..N-1, in rank order
        self._error_dir = None
        self._lock = threading.Lock()
        self._ending = False
        self._signalled = False  # rank 0 passed SIGTERM on: workers stopping now is the plan, not a failure
        self._interrupted = False  # rank 0 got Ctrl-C (issue 38): workers get a short grace, not JOIN_TIMEOUT

    def launch(self, *lightning_args, **lightning_kwargs):
        """Start ranks 1..N-1 and set this process's environment as rank 0."""
        if lightning_args or lightning_kwargs or self.external:  # (the Trainer never launches an external one)
            _refuse_lightning_launch()
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
            "TASKTRAIN_PARENT_PID": str(os.getpid()),
        }
        threads = threads_per_process(self.num_processes)
        if threads is not None:  # the children start with it; this process (rank 0) takes it below
            common["OMP_NUM_THREADS"] = threads
        cmd = _command()
        self._error_dir = tempfile.mkdtemp(prefix="tasktrain-errors-")
        for rank in range(1, self.num_processes):
            env = dict(os.environ, **common, RANK=str(rank), LOCAL_RANK=str(rank),
                       TASKTRAIN_ERROR_FILE=self._error_file(rank))
            self.procs.append(subprocess.Popen(cmd, env=env))
        os.environ.update(common, RANK="0", LOCAL_RANK="0")
        if threads is not None:
            import torch

            torch.set_num_threads(int(threads))
        atexit.register(self._at_exit)
        threading.Thread(target=self._watch, name="tasktrain-worker-watch", daemon=True).start()

    def _error_file(self, rank):
        return os.path.join(self._error_dir, f"rank{rank}.txt")

    def forward_signal(self, sig=signal.SIGTERM):
        """Pass a signal (SIGTERM: preemption) on to the running workers; their exit is then expected."""
        self._signalled = True
        self._interrupted = self._interrupted or sig == signal.SIGINT
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(sig)

    def _watch(self):
        while not self._ending:
            for rank, proc in enumerate(self.procs, start=1):
                code = proc.poll()
                if code not in (None, 0) and not self._stopped_as_asked(rank, code):
                    self._fail(f"{self.describe_exit(rank, proc, code)}; stopping the other ranks.")
            time.sleep(0.2)

    def _read_error(self, rank):
        try:
            with open(self._error_file(rank)) as f:
                return f.read().strip() or None
        except OSError:
            return None

    def _stopped_as_asked(self, rank, code):
        # After SIGTERM a worker ends with Lightning's SIGTERMException (status 0; 1 where a script turns it into an
        # error, with no error recorded); after Ctrl-C (the whole process group gets SIGINT) it runs on_exception and
        # exits 130 (a worker of ours; rank 0 exits 1, Lightning's code: trainer/guards.py).
        return code == 130 or (self._signalled and code == 1 and self._read_error(rank) is None)

    def describe_exit(self, rank, proc, code) -> str:
        error = self._read_error(rank)
        if code < 0:
            try:
                how = f"was killed by signal {signal.Signals(-code).name}"
            except ValueError:
                how = f"was killed by signal {-code}"
        else:
            how = f"exited with code {code}"
        if error:
            return f"rank {rank} (pid {proc.pid}) failed: {error} ({how.replace('was ', '')})"
        if code < 0:
            return f"rank {rank} (pid {proc.pid}) {how}"
        return f"rank {rank} (pid {proc.pid}) {how}; its output above says why"

    def _fail(self, message):
        """A worker failed: say so, stop everyone, end this process (it may be stuck in a collective)."""
        with self._lock:
            if self._ending:
                return
            self._ending = True
        print(f"[tasktrain] {message}", file=sys.stderr, flush=True)
        self.kill()
        self._cleanup()
        sys.stdout.flush()
        os._exit(1)

    def _at_exit(self):
        """Rank 0 is exiting: on success wait for the workers, on failure stop them; exit non-zero if any failed."""
        rank0_failed = getattr(sys, "last_value", None) is not None  # set for an uncaught error before atexit
        with self._lock:
            if self._ending:
                return
            self._ending = True  # the watchdog stops; from here on this function decides
        grace = 3.0 if rank0_failed else INTERRUPT_GRACE if self._interrupted else JOIN_TIMEOUT
        deadline = time.monotonic() + grace
        failures = []
        for rank, proc in enumerate(self.procs, start=1):
            try:
                code = proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                if self._interrupted:  # it was waiting in a collective for a rank that stopped: not a failure
                    print(f"[tasktrain] rank {rank} (pid {proc.pid}) had not stopped {grace:.0f} s after Ctrl-C "
                          "(waiting in a collective its peers had left); stopped it.", file=sys.stderr, flush=True)
                elif not rank0_failed:
                    failures.append(f"rank {rank} (pid {proc.pid}) was still running {JOIN_TIMEOUT:.0f} s after "
                                    "rank 0 finished (waiting on a collective rank 0 never joined?); killed it")
                continue
            if code != 0 and not self._stopped_as_asked(rank, code):
                failures.append(self.describe_exit(rank, proc, code))
        self.kill()
        self._cleanup()
        for message in failures:
            print(f"[tasktrain] {message}", file=sys.stderr, flush=True)
        if failures and not rank0_failed:
            sys.stdout.flush()
            os._exit(1)  # an atexit hook cannot change the exit code otherwise

    def stop_watching(self):
        """The watchdog (issue 19) has stopped the run: the workers now exit on purpose, and say why themselves."""
        with self._lock:
            self._ending = True

    def end_workers(self, seconds=3.0):
        """Rank 0 leaves after a watchdog verdict: give the workers a moment to exit on their own, then stop them."""
        deadline = time.monotonic() + seconds
        for proc in self.procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        self.kill()
        self._cleanup()

    def kill(self):
        """Stop every worker still running (SIGKILL: a failed run has nothing left to save) and reap it."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass

    def _cleanup(self):
        if self._error_dir:
            shutil.rmtree(self._error_dir, ignore_errors=True)
            self._error_dir = None


# -- restarts (issue 29) ------------------------------------------------------------------------------------------
def run_under_elastic_agent(num_processes, max_restarts, num_nodes=1):
    """Trainer(max_restarts=N) in a plain `python train.py`: this process becomes torch's elastic agent
    (`python -m torch.distributed.run --standalone --nproc-per-node P --max-restarts N train.py ...`, exec'd in its
    place), which starts the workers and restarts all of them after a failure; the script runs again from its
    start in each worker, as under torchrun. Does not return."""
    if num_nodes > 1:
        raise RuntimeError(f"Trainer(max_restarts={max_restarts}) with num_nodes={num_nodes}: run `tasktrain launch "
                           f"--num_machines {num_nodes} --max_restarts {max_restarts} ...` on every machine.")
    cmd = _command()
    script = ["--module", cmd[2], *cmd[3:]] if cmd[1] == "-m" else cmd[1:]
    args = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(num_processes),
            "--max-restarts", str(max_restarts), *script]
    env = dict(os.environ)
    # torch 2.13: restarted workers must not reuse the rendezvous store (see tasktrain/cli/main.py)
    env.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    print(f"[tasktrain] max_restarts={max_restarts}: starting {num_processes} processes under torch's elastic "
          "agent (torch.distributed.run); the script starts again in each.", flush=True)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, args, env)


def check_restarts(max_restarts):
    """Under a launcher, Trainer(max_restarts=N) must be what the launcher does (it restarts, not the Trainer)."""
    launched = os.environ.get("TORCHELASTIC_MAX_RESTARTS")
    if launched is None:
        raise RuntimeError(f"Trainer(max_restarts={max_restarts}): these processes were not started by torch's "
                           "elastic agent (torchrun / tasktrain launch), which is what restarts them. Start the "
                           f"script with `tasktrain launch --max_restarts {max_restarts} ...`, or plainly (`python "
                           "train.py`: the Trainer starts the agent itself).")
    if int(launched) != max_restarts:
        raise RuntimeError(f"Trainer(max_restarts={max_restarts}), but the launcher restarts up to {launched} times "
                           f"(--max_restarts / --max-restarts): make them agree, or leave max_restarts out of the "
                           "Trainer.")
