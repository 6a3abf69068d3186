"""strategy="ddp_spawn": the Trainer starts the workers with torch.multiprocessing (start method "spawn").

    trainer = Trainer(strategy="ddp_spawn", devices=2)
    trainer.fit(module, train_loader, val_loader)   # returns when every child is done

The parent process does not train. strategy.launch(run, *loaders) pickles `run` (the Trainer's stage: the
trainer and the module) privately for each child and sends the loaders through torch.multiprocessing, starts
one child per rank (each sets RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT and calls run(*loaders)
through the DDP strategy), waits, and hands `run.restore` what `run.collect` returned on rank 0 (the Trainer's:
the trained weights, the callback metrics, the loop state, the callbacks' state and the stage's return value).
So after `fit` the parent's module is trained and `trainer.callback_metrics` is filled, as with the other
strategies. Nothing here knows what a trainer is.

Limits, compared with strategy="ddp" (which re-runs the script instead):
- the module, its hyper-parameters, the loaders and their datasets, and the callbacks must be picklable;
  classes defined in the script must be importable by the children, so guard the script's entry point with
  `if __name__ == "__main__":`;
- each child starts a fresh interpreter and imports torch (a second or two per run), and whatever the
  children change other than the above (attributes set on the module, files opened, globals) stays there;
- predict(gather=False) returns rank 0's predictions only; use gather=True for all of them.
"""
import os
import pickle
import tempfile

import torch

from tasktrain.exceptions import MisconfigurationException
from tasktrain.strategies.launcher import find_free_port, threads_per_process
from tasktrain.tree import apply_to_leaves


class SpawnLauncher:
    """Lightning's strategy.launcher under start_method="spawn": the processes are started by strategy.launch
    (run_spawned) when an entry point runs; this object only answers what Lightning's _MultiProcessingLauncher does."""

    is_interactive_compatible = False  # Lightning's: True for "fork" only, which tasktrain refuses
    start_method = "spawn"
    _start_method = "spawn"  # (Lightning's attribute's name)

    def __init__(self, num_processes):
        self.num_processes = num_processes
        self._already_fit = False  # (Lightning's: a fit ran, so the Trainer refuses another: trainer.py's _run)

    def launch(self, *args, **kwargs):
        from tasktrain.strategies.launcher import _refuse_lightning_launch

        _refuse_lightning_launch()


def run_spawned(strategy, run, args):
    """strategy.launch for start_method="spawn": run(*args) in one new process per rank; returns
    run.restore(what run.collect returned on rank 0)."""
    if strategy.num_nodes > 1:
        raise ValueError(
            f"strategy='ddp_spawn' starts processes on this machine only, but num_nodes={strategy.num_nodes}. On "
            "several machines use strategy='ddp' under torchrun / `tasktrain launch` on each machine."
        )
    nprocs = strategy.devices
    with tempfile.TemporaryDirectory(prefix="tasktrain-spawn-") as tmp:
        result_path = os.path.join(tmp, "rank0.pt")
        env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(find_free_port()), "WORLD_SIZE": str(nprocs),
               "LOCAL_WORLD_SIZE": str(nprocs), "GROUP_RANK": "0", "TASKTRAIN_LAUNCHER": "spawn"}
        threads = threads_per_process(nprocs)
        if threads is not None:
            env["OMP_NUM_THREADS"] = threads  # each child sets it (it imported torch before it reads env)
        # torch.multiprocessing would put the module's tensors in memory shared by all children, so every rank
        # would step the same weights: each child gets its own copy of `run` (the trainer and the module)
        # instead; the arguments (the loaders) may stay shared.
        try:
            private = pickle.dumps(run)
        except (pickle.PicklingError, AttributeError, TypeError) as err:
            raise TypeError(f"strategy='ddp_spawn' sends the trainer and the module to its children by pickling, "
                            f"and that failed: {err}. Make them picklable (no lambdas, open files or local "
                            "classes as attributes), or use strategy='ddp', which re-runs the script.") from err
        try:
            torch.multiprocessing.start_processes(_child, args=(env, private, args, result_path), nprocs=nprocs,
                                                  join=True, start_method="spawn")
        except (pickle.PicklingError, AttributeError, TypeError) as err:  # raised while starting: the loaders
            raise TypeError(f"strategy='ddp_spawn' could not send the data loaders to its children: {err}. Make "
                            "the loaders, datasets and collate functions picklable (defined at module level), or "
                            "use strategy='ddp'.") from err
        except torch.multiprocessing.ProcessRaisedException as err:
            # Lightning's launcher lets torch's exception reach the user: its text is the child's traceback
            raise ProcessRaisedException(err.msg, err.error_index, err.error_pid) from None
        except torch.multiprocessing.ProcessExitedException as err:
            raise ProcessExitedException(err.msg, err.error_index, err.error_pid, err.exit_code,
                                         err.signal_name) from None
        # Written by our own child into our private directory: plain tensors and python objects.
        collected = torch.load(result_path, map_location="cpu", weights_only=False)
    return run.restore(collected)


class ProcessRaisedException(torch.multiprocessing.ProcessRaisedException, RuntimeError):
    """A child raised: torch's exception, as Lightning's ddp_spawn raises it (its text: "-- Process 1 terminated with
    the following error:" and the child's traceback; `error_index` the rank, `error_pid` its process), and a
    RuntimeError as tasktrain raised before."""


class SpawnedRunRefused(ProcessRaisedException, MisconfigurationException):
    """A configuration a spawned run cannot work with, refused in the parent before any process starts, where
    Lightning refuses it inside its children (its user catches torch's ProcessRaisedException around the call):
    both that exception and tasktrain's MisconfigurationException, with Lightning's words."""

    def __init__(self, msg, error_index=0, error_pid=None):
        super().__init__(msg, error_index, os.getpid() if error_pid is None else error_pid)


class ProcessExitedException(torch.multiprocessing.ProcessExitedException, RuntimeError):
    """A child died without raising (a signal, os._exit): torch's exception, as Lightning raises it ("process 1
    terminated with signal SIGKILL"; `exit_code`, `signal_name`), and a RuntimeError as tasktrain raised before."""


def _child(rank, env, private, args, result_path):
    os.environ.update(env, RANK=str(rank), LOCAL_RANK=str(rank))
    if "OMP_NUM_THREADS" in env:
        torch.set_num_threads(int(env["OMP_NUM_THREADS"]))
    run = pickle.loads(private)
    value = run(*args)
    if rank == 0:
        torch.save(to_cpu(run.collect(value)), result_path)


def to_cpu(value):
    return apply_to_leaves(value, lambda t: t.detach().cpu() if isinstance(t, torch.Tensor) else t)
