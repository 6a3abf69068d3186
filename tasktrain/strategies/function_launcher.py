"""Run a Python function on N processes from a running interpreter (a notebook, a REPL, a test): what
`notebook_launcher` (tasktrain/compat/accelerate/launchers.py) stands on.

    from tasktrain.strategies.function_launcher import launch_function
    results = launch_function(train, args=(config,), num_processes=2)   # {rank: train's return value}

The processes are started by torch's elastic launcher (`torch.distributed.launcher.api.elastic_launch`, the engine
of torchrun) with the start method "fork": the children are copies of this interpreter, so a function defined in a
notebook cell (which no other process could import) runs as it is, with its closures. Each child gets the torchrun
variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RESTART_COUNT), so an Accelerator,
a PartialState or a Trainer built inside the function joins the world as under `tasktrain launch`.

What forking asks of the parent (checked before anything starts, with an error that says what to do):
- CUDA must not be initialised in the parent: a forked child cannot use it ("Cannot re-initialize CUDA in forked
  subprocess"). The checks here count GPUs through NVML, which leaves CUDA untouched.
- no process group in the parent: the children would inherit its sockets.
- each child runs torch with one CPU thread: a child forked after the parent ran an OpenMP parallel region hangs in
  its first parallel op (measured, torch 2.13 / libgomp); one thread never enters the broken thread pool. A child
  may not raise it again (same hang), so for CPU-heavy work put the training in a script and use `tasktrain launch`.

A failure in any child stops the others (the agent's monitor) and raises torch's ChildFailedError here, whose
message carries the child's traceback. Restarts (max_restarts > 0) run the whole function again in every process;
TORCHELASTIC_RESTART_COUNT says which attempt it is.
"""
import contextlib
import functools
import os
import sys

import torch

RDZV_BACKENDS = ("static", "c10d")


def gpu_count() -> int:
    """GPUs visible to this process, counted through NVML (torch.cuda's plain count would load the CUDA driver
    here and spoil every fork)."""
    with patched_environment({"PYTORCH_NVML_BASED_CUDA_CHECK": "1"}):
        return torch.cuda.device_count() if torch.cuda.is_available() else 0


def check_can_fork(uses_gpus: bool):
    """Raise, before anything starts, when forked children could not work."""
    if not hasattr(os, "fork"):
        raise RuntimeError(f"Starting processes from a running interpreter forks it, and {sys.platform} has no fork. "
                           "Put the function in a script and run `tasktrain launch --num_processes N train.py`.")
    if torch.cuda.is_initialized():
        raise RuntimeError(
            "CUDA was initialised in this process before launching (a tensor was put on a GPU, or something called "
            "torch.cuda.*): processes forked from it cannot use CUDA. Restart the notebook's kernel and do every GPU "
            "step (models, tensors, torch.cuda calls) inside the launched function only."
            + (" " if uses_gpus else " (Even a CPU launch would fail there as soon as a child touched CUDA.)"))
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        raise RuntimeError("A torch.distributed process group exists in this process already; the launched "
                           "processes form their own world. Call torch.distributed.destroy_process_group() (or restart "
                           "the kernel) before launching.")


def launch_function(function, args=(), *, num_processes, num_nodes=1, node_rank=0, master_addr="127.0.0.1",
                    master_port=29500, rdzv_backend="static", rdzv_endpoint="", rdzv_conf=None, rdzv_id="none",
                    max_restarts=0, monitor_interval=0.1, log_line_prefix_template=None, env=None) -> dict:
    """Run function(*args) in num_processes forked processes of this machine (node node_rank of num_nodes) and
    return {global rank: return value} of this machine's processes. `env` adds variables to the children's
    environment (this process's environment is restored afterwards)."""
    if isinstance(num_processes, bool) or not isinstance(num_processes, int) or num_processes < 1:
        raise ValueError(f"num_processes={num_processes!r}: use a positive integer (processes on this machine).")
    if not (isinstance(num_nodes, int) and num_nodes >= 1 and isinstance(node_rank, int) and 0 <= node_rank < num_nodes):
        raise ValueError(f"node_rank={node_rank!r}, num_nodes={num_nodes!r}: the node rank counts from 0 and must be "
                         "smaller than the number of nodes.")
    if rdzv_backend not in RDZV_BACKENDS:
        raise ValueError(f"rdzv_backend={rdzv_backend!r}: use 'static' (a fixed set of nodes, the default) or 'c10d' "
                         "(torch's rendezvous on a TCP store).")
    if max_restarts < 0:
        raise ValueError(f"max_restarts={max_restarts}: use 0 (no restart) or a positive number.")
    uses_gpus = gpu_count() > 0
    check_can_fork(uses_gpus)
    if not uses_gpus:
        # torch.optim imports torch._dynamo at the first optimizer a process builds: many seconds, paid by every
        # child at once (measured: 40 s of a 42 s launch on 2 busy cores). Imported here once, the forks share it.
        # Not where GPUs are: an import that looked at CUDA here would spoil every fork.
        import torch._dynamo  # noqa: F401

    rdzv_conf = dict(rdzv_conf or {})
    rdzv_endpoint = rdzv_endpoint or f"{master_addr}:{master_port}"
    child_env = dict(env or {})
    if max_restarts:
        if rdzv_backend == "static":
            if num_nodes > 1:
                raise ValueError(f"max_restarts={max_restarts} with rdzv_backend='static' on {num_nodes} nodes: the "
                                 "static rendezvous keeps the first attempt's store, so restarted processes cannot "
                                 "meet again. Use rdzv_backend='c10d' with the same rdzv_endpoint on every node.")
            # One node: the static rendezvous would hand the restarted processes the first attempt's store (and its
            # stale addresses: they never connect, measured with torch 2.13); c10d's, hosted here at the same
            # endpoint, is a fresh one each round and means the same on a single node.
            rdzv_backend = "c10d"
        # torch 2.13: restarted processes must not reuse the agent's rendezvous store (see tasktrain/cli/main.py).
        child_env.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    if rdzv_backend == "static":
        rdzv_conf["rank"] = node_rank

    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    with patched_environment(child_env):
        with patched_environment({"PYTORCH_NVML_BASED_CUDA_CHECK": "1"}):  # LaunchConfig looks at the GPUs: not via CUDA
            config = LaunchConfig(min_nodes=num_nodes, max_nodes=num_nodes, nproc_per_node=num_processes,
                                  run_id=rdzv_id, rdzv_endpoint=rdzv_endpoint, rdzv_backend=rdzv_backend,
                                  rdzv_configs=rdzv_conf, max_restarts=max_restarts,
                                  monitor_interval=monitor_interval, start_method="fork",
                                  log_line_prefix_template=log_line_prefix_template)
        return elastic_launch(config=config, entrypoint=_in_child(function))(*args)


def _in_child(function):
    @functools.wraps(function)  # the agent names the failed function in its report
    def run(*args):
        torch.set_num_threads(1)  # see the module docstring: a forked child hangs in the parent's OpenMP pool
        return function(*args)

    return run


@contextlib.contextmanager
def patched_environment(values):
    """os.environ with `values` set inside the block, the old values (or their absence) restored after."""
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update({key: str(value) for key, value in values.items()})
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
