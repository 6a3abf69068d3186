"""SLURM pre-emption: on the requeue signal, save, requeue the job, and resume from that save when SLURM restarts it.

SLURM warns a job before it ends it (`#SBATCH --signal=USR1@120`: SIGUSR1 two minutes before the time limit, or when
a higher-priority job pre-empts it). On that signal, inside a SLURM job:
1. every rank notes it; the ranks agree on it at their next agreement point (the Trainer: where SIGTERM is agreed) and
   each saves its part of a pre-emption checkpoint there;
2. rank 0 records that checkpoint for this job (`<root>/.slurm-requeue/<job id>.json`) and runs
   `scontrol requeue <job id>`; every process then exits 0 (see REQUEUED_EXIT_CODE);
3. SLURM starts the job again (same job id, SLURM_RESTART_COUNT > 0): the run finds the record of its own job and
   resumes from it, with no ckpt_path; a resumed run equals an uninterrupted one bitwise.

SIGTERM keeps Lightning's meaning (SIGTERMException, on_exception hooks, exit status 0, no requeue). Settings, read
from the environment so that the Trainer, the Accelerator and `tasktrain launch` (which passes its environment to the
workers) share them:

    TASKTRAIN_SLURM_REQUEUE=0        off: the signal is left to its default action (SIGUSR1 ends the process)
    TASKTRAIN_REQUEUE_SIGNAL=USR2    another signal (a name, with or without SIG, or a number); default SIGUSR1

The Trainer's script may say the same with Lightning's plugin instead (it wins over the variables):
Trainer(plugins=[SLURMEnvironment(auto_requeue=False)]) or SLURMEnvironment(requeue_signal=signal.SIGUSR2).

Outside a SLURM job (no SLURM_JOB_ID) nothing is installed.
"""
import json
import os
import signal
import subprocess
import sys
import threading

# Why 0: SLURM itself records the stop (the job's state becomes REQUEUED, then PENDING, and its Restarts count
# grows), whatever the process returns; a non-zero code would make srun report a failed step and torch's elastic
# agent (`tasktrain launch --max_restarts`) restart the workers in place instead of letting SLURM requeue the job.
REQUEUED_EXIT_CODE = 0
RECORD_FOLDER = ".slurm-requeue"
SCONTROL_TIMEOUT = 60.0


def requeue_signal(env=None, settings=None):
    """The requeue signal, or None when requeueing is off or this is not a SLURM job. `settings`: (auto_requeue,
    signal) given in the script (Lightning's SLURMEnvironment plugin), which win over the environment's."""
    env = os.environ if env is None else env
    if not env.get("SLURM_JOB_ID"):
        return None
    if settings is not None:
        auto_requeue, sig = settings
        return signal.Signals(sig) if auto_requeue else None
    if env.get("TASKTRAIN_SLURM_REQUEUE", "1") in ("0", "false", "False", "no"):
        return None
    text = env.get("TASKTRAIN_REQUEUE_SIGNAL", "SIGUSR1").strip()
    try:
        return signal.Signals(int(text)) if text.isdigit() else signal.Signals[
            text.upper() if text.upper().startswith("SIG") else "SIG" + text.upper()]
    except (KeyError, ValueError):
        raise ValueError(f"TASKTRAIN_REQUEUE_SIGNAL={text!r} is not a signal: use a name such as USR1 or SIGUSR2, or a "
                         "number.") from None


def job_id(env=None):
    """The id `scontrol requeue` takes: an array task is <array job id>_<task id>."""
    env = os.environ if env is None else env
    if env.get("SLURM_ARRAY_JOB_ID") and env.get("SLURM_ARRAY_TASK_ID"):
        return f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
    return env.get("SLURM_JOB_ID")


class RequeueHandler:
    """The requeue signal's handler for one run: `on_signal()` is called when it arrives (the run stops as on a
    stop request); `requested` says it came. Installs nothing outside a SLURM job, with requeueing off, or off the
    main thread; nor where the script has a handler of its own for that signal (Lightning's rule: its SLURM handler
    is registered only on a signal nobody handles; SIG_IGN, which `tasktrain launch` leaves its workers, is none)."""

    def __init__(self, on_signal, settings=None):
        self.requested = False
        self._previous = None
        self.signal = requeue_signal(settings=settings)
        if self.signal is None or threading.current_thread() is not threading.main_thread():
            return
        if callable(signal.getsignal(self.signal)):
            self.signal = None  # (the same script on every rank: all leave it, agreed() asks none)
            return

        def handle(signum, frame):
            self.requested = True
            on_signal()

        self._previous = (self.signal, signal.signal(self.signal, handle))

    def restore(self):
        if self._previous is not None:
            signal.signal(*self._previous)
            self._previous = None

    def agreed(self, strategy):
        """Whether any rank got the requeue signal (one small all-reduce, once, after the run stopped)."""
        if self.signal is None:
            return False
        if strategy.world_size > 1:
            import torch

            return bool(strategy.reduce(torch.tensor([float(self.requested)]), op="max")[0])
        return self.requested


def ignore_in_launcher():
    """`tasktrain launch`'s own process: SLURM signals every process of the job step, the workers included, and the
    workers save and requeue; the launcher (torch's elastic agent) must outlive the signal (SIGUSR1's default action
    would end it and leave its workers orphaned)."""
    sig = requeue_signal()
    if sig is not None:
        signal.signal(sig, signal.SIG_IGN)


def _record_path(root, env=None):
    return os.path.join(root, RECORD_FOLDER, f"{job_id(env)}.json")


def requeue(root, checkpoint, step, is_global_zero, **extra):
    """After the pre-emption save (every rank's part complete): rank 0 records the checkpoint for this job and requeues
    it. Returns the process's exit code."""
    if not is_global_zero:
        return REQUEUED_EXIT_CODE
    record = _record_path(root)
    os.makedirs(os.path.dirname(record), exist_ok=True)
    with open(record + ".tmp", "w") as f:
        json.dump(dict(extra, job_id=job_id(), path=os.path.abspath(checkpoint), step=step), f)
    os.replace(record + ".tmp", record)
    # SLURM answers the requeue by ending this job (SIGTERM, then SIGKILL): the save is complete, nothing is left to
    # do but exit, so SIGTERM no longer interrupts it.
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    command = ["scontrol", "requeue", job_id()]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=SCONTROL_TIMEOUT)
        failed = result.returncode != 0 and f"exit code {result.returncode}: {(result.stderr or result.stdout).strip()}"
    except (OSError, subprocess.TimeoutExpired) as err:
        failed = str(err)
    if failed:
        signal.signal(signal.SIGTERM, previous)
        print(f"[tasktrain] pre-empted: saved {checkpoint} at step {step}, but `{' '.join(command)}` failed "
              f"({failed}). Resubmit the job (it resumes from that checkpoint only with ckpt_path=...), or allow "
              "requeueing (#SBATCH --requeue; the cluster's JobRequeue).", file=sys.stderr, flush=True)
        return 1
    print(f"[tasktrain] pre-empted, requeued: saved {checkpoint} at step {step}; SLURM job {job_id()} was requeued "
          "and resumes from it when it starts again.", file=sys.stderr, flush=True)
    return REQUEUED_EXIT_CODE


def _restarted_record(root):
    """This job's pre-emption record under root, in a job SLURM restarted (SLURM_RESTART_COUNT > 0); else None."""
    if not os.environ.get("SLURM_JOB_ID") or int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0) < 1:
        return None
    try:
        with open(_record_path(root)) as f:
            record = json.load(f)
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and "path" in record else None


def resume_path(root, ckpt_path, is_global_zero=True):
    """What a fit resumes from: in a job SLURM restarted (SLURM_RESTART_COUNT > 0) that recorded a pre-emption
    checkpoint under root, that checkpoint (whatever ckpt_path says: the script is the same as on the first start);
    otherwise ckpt_path."""
    record = _restarted_record(root)
    if record is None:
        return ckpt_path
    path = record["path"]
    if is_global_zero:
        print(f"[tasktrain] SLURM restart {os.environ['SLURM_RESTART_COUNT']} of job {job_id()}: resuming from the "
              f"pre-emption checkpoint {path}", flush=True)
    return path


def finished(root, is_global_zero):
    """A fit that ended normally: its job's record is spent (a later fit of the same script starts afresh)."""
    if is_global_zero and os.environ.get("SLURM_JOB_ID"):
        try:
            os.remove(_record_path(root))
        except OSError:
            pass


# -- the Accelerator ------------------------------------------------------------------------------------------------
# A custom loop has no stop points of its own: the prepared optimizer's step is the one every rank reaches alike.
# There the ranks agree on the signal (one tiny all-reduce every CHECK_EVERY steps on several processes, none per step;
# every step on one), save_state into <project_dir, else the working directory>/.slurm-requeue/<job id>/, and rank 0
# requeues. When SLURM starts the job again, the prepare() call that has prepared as many models, optimizers,
# schedulers and loaders as were saved loads that folder: the loop continues from the loaders' positions
# (`for epoch in range(loader.epoch, epochs)`), as after an explicit load_state.
CHECK_EVERY = 10


class AcceleratorRequeue:
    def __init__(self, accelerator):
        self.accelerator = accelerator
        self.handler = RequeueHandler(lambda: None)
        self.restored = False
        self.check_every = int(os.environ.get("TASKTRAIN_REQUEUE_CHECK_EVERY", CHECK_EVERY))

    def root(self):
        return self.accelerator.project_dir or os.getcwd()

    def _counts(self):
        a = self.accelerator
        return [len(a._models), len(a._optimizers), len(a._schedulers), len(a._loaders)]

    def after_step(self):
        """At each optimizer step (the end of an accumulation window): save, requeue and exit when the ranks agree
        that the requeue signal came."""
        accelerator = self.accelerator
        if self.handler.signal is None:
            return
        if accelerator.strategy.world_size > 1 and accelerator._steps % self.check_every:
            return
        if not self.handler.agreed(accelerator.strategy):
            return
        folder = os.path.join(self.root(), RECORD_FOLDER, str(job_id()))
        accelerator.save_state(folder)
        if accelerator.is_main_process:
            print(f"[tasktrain] {self.handler.signal.name}: finished optimizer step {accelerator._steps}, saved the "
                  f"state to {folder}", file=sys.stderr, flush=True)
        raise SystemExit(requeue(self.root(), folder, accelerator._steps, accelerator.is_main_process,
                                 counts=self._counts()))

    def after_prepare(self):
        """In a job SLURM restarted after a pre-emption: load the saved state once everything it holds is prepared."""
        if self.restored:
            return
        record = _restarted_record(self.root())
        if record is None or record.get("counts") != self._counts():
            return
        self.restored = True
        if self.accelerator.is_main_process:
            print(f"[tasktrain] SLURM restart {os.environ['SLURM_RESTART_COUNT']} of job {job_id()}: loading the "
                  f"pre-emption state {record['path']}", flush=True)
        self.accelerator.load_state(record["path"])
