"""Accelerate's `accelerate.launchers` (`from tasktrain import notebook_launcher`): run a training function on
several processes from a notebook, over tasktrain/strategies/function_launcher.py (torch's elastic launcher, fork).

    def train(learning_rate):
        accelerator = Accelerator()          # built inside: it sees the launched world
        ...

    notebook_launcher(train, args=(1e-3,), num_processes=2)
"""

from tasktrain.names import MIXED_PRECISION


def notebook_launcher(function, args=(), num_processes=None, mixed_precision="no", use_port="29500",
                      master_addr="127.0.0.1", node_rank=0, num_nodes=1, rdzv_backend="static", rdzv_endpoint="",
                      rdzv_conf=None, rdzv_id="none", max_restarts=0, monitor_interval=0.1,
                      log_line_prefix_template=None):
    """Run function(*args) on num_processes processes of this machine (one per GPU where there are GPUs, else CPU
    processes on gloo), node node_rank of num_nodes, and return when all are done; an error in any of them raises
    torch's ChildFailedError here, with that process's traceback in its message.

    num_processes=None means one per GPU, or one process on a machine without GPUs; one process (and one node) runs
    the function right here, in this process. mixed_precision ("no", "fp16", "bf16") is the default precision of
    the Accelerator built inside the function. use_port / master_addr give the rendezvous endpoint unless
    rdzv_endpoint does; rdzv_backend is "static" or "c10d"; max_restarts > 0 runs the function again in every
    process after a failure (TORCHELASTIC_RESTART_COUNT tells the attempt); monitor_interval is how often (seconds)
    the processes are checked; log_line_prefix_template prefixes the children's log lines (torch's elastic
    template, e.g. "[${rank}] "). Build the Accelerator (and every CUDA tensor) inside the function only:
    processes forked from a parent that initialised CUDA cannot use it, and that is refused up front.
    """
    from tasktrain.strategies.function_launcher import gpu_count, launch_function, patched_environment  # (torch)

    precision = str(mixed_precision).lower()
    if precision not in MIXED_PRECISION:
        raise ValueError(f"Unknown mixed_precision mode: {mixed_precision!r}. Choose between "
                         f"{list(MIXED_PRECISION)}.")
    gpus = gpu_count()
    if num_processes is None:
        num_processes = max(gpus, 1)
    if gpus and num_processes > gpus:
        raise ValueError(f"num_processes={num_processes}, but this machine shows {gpus} GPU(s): one process per GPU. "
                         "Ask for at most that many, or hide the GPUs (CUDA_VISIBLE_DEVICES='' before importing torch) "
                         "for CPU processes.")
    env = {"TASKTRAIN_LAUNCH": "1", "TASKTRAIN_NUM_PROCESSES": str(num_processes * num_nodes),
           "TASKTRAIN_NUM_MACHINES": str(num_nodes)}
    if precision != "no":  # only a precision asked for: Accelerator(mixed_precision=...) in the function may differ
        env["TASKTRAIN_PRECISION"] = MIXED_PRECISION[precision]
    device = "GPU" if gpus else "CPU"

    if num_processes == 1 and num_nodes == 1:
        # One process: nothing to start, as with Accelerate; the function runs here with the same launch choices.
        print(f"Launching training on one {device}.")
        with patched_environment(env):
            return function(*args)

    from tasktrain.compat.accelerate import state

    if state._SHARED["strategy"] is not None:
        raise ValueError("An Accelerator or PartialState exists in this process already, so the launched processes "
                         "would inherit its one-process state. Restart the notebook's kernel and build the "
                         "Accelerator inside the launched function only.")
    print(f"Launching training on {num_processes} {device}s.")
    launch_function(function, args, num_processes=num_processes, num_nodes=num_nodes, node_rank=node_rank,
                    master_addr=master_addr, master_port=int(use_port), rdzv_backend=rdzv_backend,
                    rdzv_endpoint=rdzv_endpoint, rdzv_conf=rdzv_conf, rdzv_id=rdzv_id, max_restarts=max_restarts,
                    monitor_interval=monitor_interval, log_line_prefix_template=log_line_prefix_template, env=env)
