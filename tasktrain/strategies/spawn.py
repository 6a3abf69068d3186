"""strategy="ddp_spawn": the Trainer starts the workers with torch.multiprocessing (start method "spawn").

    trainer = Trainer(strategy="ddp_spawn", devices=2)
    trainer.fit(module, train_loader, val_loader)   # returns when every child is done

The parent process does not train. It pickles the trainer, the module and the loaders, starts one child per
rank (each sets RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT and runs the same stage through
the DDP strategy), waits, and loads back what rank 0 wrote: the trained weights, the callback metrics, the
loop state, the callbacks' state and the stage's return value. So after `fit` the parent's module is trained
and `trainer.callback_metrics` is filled, as with the other strategies.

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

from tasktrain.strategies.launcher import find_free_port
from tasktrain.tree import apply_to_leaves


def run_spawned(trainer, stage, module, train_loader, eval_loader, ckpt_path, gather):
    strategy = trainer.strategy
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
        # torch.multiprocessing would put the module's tensors in memory shared by all children, so every rank
        # would step the same weights: each child gets its own copy instead (the loaders may stay shared).
        try:
            private = pickle.dumps((trainer, module))
        except (pickle.PicklingError, AttributeError, TypeError) as err:
            raise TypeError(f"strategy='ddp_spawn' sends the trainer and the module to its children by pickling, "
                            f"and that failed: {err}. Make them picklable (no lambdas, open files or local "
                            "classes as attributes), or use strategy='ddp', which re-runs the script.") from err
        args = (env, private, stage, train_loader, eval_loader, ckpt_path, gather, result_path)
        try:
            torch.multiprocessing.start_processes(_child, args=args, nprocs=nprocs, join=True, start_method="spawn")
        except (pickle.PicklingError, AttributeError, TypeError) as err:  # raised while starting: the loaders
            raise TypeError(f"strategy='ddp_spawn' could not send the data loaders to its children: {err}. Make "
                            "the loaders, datasets and collate functions picklable (defined at module level), or "
                            "use strategy='ddp'.") from err
        except torch.multiprocessing.ProcessRaisedException as err:
            # err's text is the child's traceback; its last line is the error itself.
            error = str(err).strip().splitlines()[-1]
            raise RuntimeError(f"ddp_spawn: rank {err.error_index} (pid {err.error_pid}) failed: {error}; the other "
                               f"ranks were stopped. Its traceback:{err}") from None
        except torch.multiprocessing.ProcessExitedException as err:
            raise RuntimeError(f"ddp_spawn: rank {err.error_index} (pid {err.error_pid}) {_exit_words(err)}; the "
                               "other ranks were stopped.") from None
        # Written by our own child into our private directory: plain tensors and python objects.
        out = torch.load(result_path, map_location="cpu", weights_only=False)
    module.load_state_dict(out["state_dict"])
    module.trainer = trainer
    trainer.module = module
    trainer.state.load_state_dict(out["train_state"])
    trainer._callback_metrics_cache = out["callback_metrics"]
    trainer._logged_metrics = out["logged_metrics"]
    for cb in trainer.callbacks:
        if cb.state_key in out["callbacks"]:
            cb.load_state_dict(out["callbacks"][cb.state_key])
    return out["result"]


def _exit_words(err):
    if err.signal_name:
        return f"was killed by {err.signal_name}"
    return f"exited with code {err.exit_code}"


def _child(rank, env, private, stage, train_loader, eval_loader, ckpt_path, gather, result_path):
    os.environ.update(env, RANK=str(rank), LOCAL_RANK=str(rank))
    trainer, module = pickle.loads(private)
    result = trainer._run(stage, module, train_loader, eval_loader, ckpt_path=ckpt_path, gather=gather)
    if rank != 0:
        return
    torch.save({
        "state_dict": {k: v.detach().cpu() for k, v in module.state_dict().items()},
        "train_state": trainer.state.state_dict(),
        "callback_metrics": {k: _to_cpu(v) for k, v in trainer.callback_metrics.items()},
        "logged_metrics": dict(trainer.logged_metrics),
        "callbacks": {cb.state_key: cb.state_dict() for cb in trainer.callbacks},
        "result": _to_cpu(result),
    }, result_path)


def _to_cpu(value):
    return apply_to_leaves(value, lambda t: t.detach().cpu() if isinstance(t, torch.Tensor) else t)
