"""The run's set-up, shared by the Trainer and the Accelerator, so that their rules cannot drift apart.

    build_runtime(...)          the launch config merged with the script's arguments, the strategy built and
                                configured (it builds its own precision plugin), the accumulation checked, the
                                watchdog's stall_timeout
    broadcast_seed(strategy)    the data-order seed, the same on every rank
    rng_restore_of_this_rank(...) what puts this rank's random generators back on a resume, on any number
                                of processes (and what it says when the number changed)

The rules, the same for both:
- An argument the script leaves out (None, or the Trainer's default value) is filled from `tasktrain launch`'s
  config (TASKTRAIN_* variables); one the script gives wins, with a warning when the config said otherwise.
- A precision given to a strategy object (DDP(precision=...)) is kept: it is a conflict with the script's
  own precision= if they differ, and wins over a launch config's, with a warning.
- The launcher formed the world: a strategy that runs one process alone (single_device, dp) under a launcher
  that started several is an error, since every rank would train on its own.
"""
import warnings
from dataclasses import dataclass
from typing import Optional

from tasktrain.checkpoint_io import restore_rng_states
from tasktrain.exceptions import MisconfigurationException
from tasktrain.names import AUTO_STRATEGY, normalize_precision
from tasktrain.strategies.base import MultiProcess, Sharded, Strategy
from tasktrain.strategies.environment import (ClusterEnvironment, check_slurm_allocation, detect_environment,
                                              join_mpi_world, launch_config, mpi_world_size,
                                              refuse_unstarted_slurm_tasks)
from tasktrain.strategies.registry import (refuse_no_devices, resolve_accelerator, resolve_devices, resolve_strategy,
                                           strategy_of_launch)
from tasktrain.strategies.watchdog import DEFAULT_STALL_TIMEOUT, resolve_stall_timeout
from tasktrain.trainer.seed import get_seed, seed_rank_streams

# How the Trainer and the Accelerator spell each choice, for messages.
TRAINER_NAMES = {"precision": "precision", "accumulation": "accumulate_grad_batches", "clipping": "gradient_clip_val"}
ACCELERATOR_NAMES = {"precision": "mixed_precision", "accumulation": "gradient_accumulation_steps",
                     "clipping": "gradient_clipping"}


@dataclass
class Runtime:
    strategy: Strategy  # configured: its precision plugin is built
    env: ClusterEnvironment
    devices: int
    num_nodes: int
    accumulate_grad_batches: int
    gradient_clip_val: Optional[float]  # None: no clipping asked for (by the script or the launch config)
    stall_timeout: Optional[float]  # the watchdog's (issue 19): seconds without progress, or None (off)


def build_runtime(*, accelerator="auto", strategy=None, devices="auto", num_nodes=None, precision=None,
                  accumulate_grad_batches=None, gradient_clip_val=None, stall_timeout=DEFAULT_STALL_TIMEOUT,
                  names=TRAINER_NAMES, custom_loop=False, fp16_on_cpu_as_bf16=False) -> Runtime:
    """The strategy and the run's numbers. None means "not given" for every choice (the Trainer passes its
    defaults as None; strategy "auto" is not given either); custom_loop=True for the Accelerator, whose strategy
    must wrap a model's own forward. fp16_on_cpu_as_bf16: Lightning's Trainer rule for its precision= (below)."""
    if gradient_clip_val is not None and (isinstance(gradient_clip_val, bool) or
                                          not isinstance(gradient_clip_val, (int, float))):
        raise TypeError(f"`gradient_clip_val` should be an int or a float. Got {gradient_clip_val}.")  # Lightning's
    launch = launch_config()
    if custom_loop:  # mpirun's world, on CPU, as Accelerate's PartialState(cpu=True) reads it (sets RANK, ...)
        join_mpi_world(cpu=accelerator == "cpu" or bool(launch.launched and launch.use_cpu))
    env = detect_environment(lightning=not custom_loop)  # (the Trainer reads the variables as Lightning's)
    if isinstance(strategy, str):
        strategy = strategy.lower()  # (names are case-insensitive, as Lightning's: "DDP")
    if isinstance(strategy, str) and strategy == AUTO_STRATEGY:
        strategy = None  # "auto" asks for the default choice: not given
    try:
        precision = None if precision is None else normalize_precision(precision)
    except MisconfigurationException as error:
        if custom_loop:  # (Accelerate's mixed_precision= refusal is a plain ValueError; the Trainer's is Lightning's)
            raise ValueError(str(error)) from None
        raise
    from_launch = set()  # the choices the launch config made
    if launch.launched:
        if strategy is None:
            strategy = strategy_of_launch(launch)
        else:
            strategy = _launch_choice("strategy", strategy, launch.strategy)
            if launch.fsdp:  # said, not dropped: the script's own strategy does not get the config's FSDP options
                warnings.warn(f"The script passes strategy={strategy!r}, so fsdp_config's {launch.fsdp} from the "
                              "launch config are not used: pass them to FSDP(...) in the script, or leave strategy out.")
        if precision is None and launch.precision is not None:
            from_launch.add("precision")
        precision = _launch_choice(names["precision"], precision, launch.precision)
        accumulate_grad_batches = _launch_choice(names["accumulation"], accumulate_grad_batches,
                                                 launch.gradient_accumulation_steps)
        gradient_clip_val = _launch_choice(names["clipping"], gradient_clip_val, launch.gradient_clipping)
        if launch.use_cpu and accelerator in (None, "auto"):
            accelerator = "cpu"
    accumulate_grad_batches = check_accumulation(names["accumulation"], accumulate_grad_batches)

    if isinstance(strategy, Strategy) and strategy.given_parallel_devices:
        accelerator, devices = _parallel_devices_choice(strategy, accelerator, devices)
    if accelerator != "gpu":  # (Lightning picks a GPU backend first, whose absence is then the error)
        refuse_no_devices(devices, accelerator)
    accelerator = resolve_accelerator(accelerator)
    if devices in (None, "auto") and launch.launched and env.launcher is None and mpi_world_size() > 1 and \
            launch.num_processes:
        # `tasktrain launch` through mpirun (mpirun_config): no torchrun variables for "auto" to read; the launch's
        # processes per machine are mpirun's -ppn (the ranks are MPI's: MPIEnvironment, detected below the strategy)
        devices = launch.num_processes // max(1, launch.num_machines or 1)
    devices = resolve_devices(devices, accelerator, env)
    if num_nodes is None:
        # Not given: what the launcher formed (torchrun's nodes = world / processes per node), else 1.
        if launch.launched and launch.num_machines:
            num_nodes = launch.num_machines
        elif env.launcher is not None:
            num_nodes = max(1, env.world_size // max(1, env.local_world_size))
        else:
            num_nodes = 1
    num_nodes = int(num_nodes)
    if custom_loop:  # the Accelerator's construction starts its run (it joins the process group); the Trainer's
        check_run_allocation(env, devices, num_nodes, source="The Accelerator")  # runs check at their start
    strategy = resolve_strategy(AUTO_STRATEGY if strategy is None else strategy, accelerator, devices, num_nodes, env)
    # (a batch script without srun: its world never formed, and its run is refused where it starts, see above)
    if env.world_size > 1 and not isinstance(strategy, MultiProcess) and not env.slurm_tasks_not_started:
        raise ValueError(
            f"The launcher started {env.world_size} processes, but strategy {strategy.name!r} runs one process on "
            "its own: every rank would train alone. Use strategy='ddp' (or a DeepSpeed strategy), or launch a "
            "single process."
        )
    if custom_loop and not strategy.supports_custom_loop:
        raise ValueError(f"strategy {strategy.name!r} wraps modules for the Trainer only (it cannot wrap a model's "
                         "own forward): use 'single_device', 'ddp' or a DeepSpeed strategy with the Accelerator.")
    own = strategy.requested_precision
    if own is not None and "precision" in from_launch:
        if own != precision:
            warnings.warn(f"The script's {type(strategy).__name__}(precision={own!r}) overrides "
                          f"{names['precision']}={precision!r} from the launch config.")
        precision = None
    if fp16_on_cpu_as_bf16 and precision == "16-mixed" and accelerator == "cpu" and own is None \
            and "precision" not in from_launch and not isinstance(strategy, Sharded):
        # Lightning's Trainer runs fp16 AMP on a CPU as bf16-mixed (its DeepSpeed and FSDP keep fp16; its
        # ModelParallelStrategy refuses 16-mixed, ours runs it as FSDP does); its MixedPrecision("16-mixed", "cpu")
        # plugin keeps fp16, and so does Trainer(plugins=[...]) here. The Accelerator keeps fp16 (Accelerate's).
        if env.global_rank == 0:
            warnings.warn("You passed `Trainer(accelerator='cpu', precision='16-mixed')` but AMP with fp16 is not "
                          "supported on CPU. Using `precision='bf16-mixed'` instead.", stacklevel=3)
        precision = "bf16-mixed"
    if isinstance(strategy, MultiProcess) and not custom_loop:
        strategy.lightning_ranks = True  # (its ranks from the launcher's variables as Lightning's, as `env` above)
    strategy.configure(accelerator, devices, num_nodes, precision)
    stall_timeout = resolve_stall_timeout(stall_timeout)
    strategy.stall_timeout = stall_timeout  # read by its setup_environment, which starts the watchdog
    return Runtime(strategy=strategy, env=env, devices=devices, num_nodes=num_nodes,
                   accumulate_grad_batches=accumulate_grad_batches,
                   gradient_clip_val=None if gradient_clip_val is None else float(gradient_clip_val),
                   stall_timeout=stall_timeout)


def check_run_allocation(env, devices, num_nodes, source="The Trainer"):
    """What a SLURM allocation must agree with before a run forms its process group, the same on every rank: srun
    started its tasks (a batch script run without it would wait for them), and the devices and nodes asked for are
    the job step's (Lightning's SLURMEnvironment.validate_settings, which its launcher calls at the run's start too).
    The Trainer calls it at each run's start (its construction reads the world as Lightning's does); the Accelerator
    at its construction, where it joins the group."""
    refuse_unstarted_slurm_tasks(env)
    check_slurm_allocation(env, devices, num_nodes, source=source)


def _parallel_devices_choice(strategy, accelerator, devices):
    """Lightning's connector: a strategy's parallel_devices set the accelerator (another one given is its
    MisconfigurationException, its words) and the number of processes of a node, over the devices given (which
    Lightning drops silently: said here). Returns (accelerator, devices)."""
    given, cls = strategy.given_parallel_devices, strategy.parallel_devices_of or type(strategy).__name__
    kind = given[0].type
    if isinstance(accelerator, str) and accelerator not in ("auto", kind) and not (kind, accelerator) == (
            "cuda", "gpu"):
        from tasktrain.exceptions import MisconfigurationException

        raise MisconfigurationException(
            f"{'CPU' if kind == 'cpu' else 'GPU'} parallel_devices set through {cls} class, but "
            f"accelerator set to {accelerator}, please choose one device type")
    count = len(devices) if isinstance(devices, (list, tuple)) else devices
    if count not in (None, "auto", -1, len(given), str(len(given))):
        warnings.warn(f"devices={devices!r} is not used: {cls}(parallel_devices=...) gives "
                      f"{len(given)} devices, which win (as under Lightning). Give the same number, or leave devices "
                      "out.", UserWarning, stacklevel=4)
    return kind, len(given)


def _launch_choice(name, given, launched):
    """The launch config fills a choice the script left out (None); an explicit one wins, with a warning when the
    config said something else."""
    if launched is None or given is None:
        return launched if given is None else given
    if str(getattr(given, "name", given)) != str(launched):
        warnings.warn(f"The script passes {name}={given!r}, which overrides {name}={launched!r} from the launch "
                      "config.")
    return given


def check_accumulation(name, value) -> int:
    """Micro-batches per optimizer step: a positive integer (None: 1)."""
    if value is None:
        return 1
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}={value!r}: use a positive integer (the number of micro-batches per optimizer "
                         "step).")
    return value


def broadcast_seed(strategy, seed=None) -> int:
    """The data order is a function of (seed, epoch): every rank draws it from rank 0's seed (`seed`; None: get_seed's,
    seed_everything's or a draw)."""
    return int(strategy.broadcast(get_seed() if seed is None else seed))


def rng_restore_of_this_rank(states, strategy, source, seed, global_step):
    """What puts this rank's random generators back on a resume: a function to call once the loop is about to
    continue (None when the checkpoint saved no random state).

    A rank the checkpoint has a state for gets it back. A rank it has none for (a resume on more processes than
    wrote it) starts streams derived from (seed, global step, rank): the same each time the run is resumed, but not
    what an uninterrupted run would draw there. When the numbers of processes differ, rank 0 says which happened."""
    if not states:
        return None
    saved, world, rank = len(states), strategy.world_size, strategy.global_rank
    if saved != world and strategy.is_global_zero:
        kept = min(saved, world)
        said = [f"{_ranks(0, kept)} continue{'s' if kept == 1 else ''} {'its' if kept == 1 else 'their'} own random "
                "state"]
        if world > saved:
            said.append(f"{_ranks(saved, world)} start{'s' if world - saved == 1 else ''} random streams derived "
                        f"from (seed={seed}, global step={global_step}, rank)")
        else:
            said.append(f"the random state of {_ranks(world, saved)} is not used")
        print(f"[tasktrain] {source} was saved by {saved} processes and is resumed by {world}: {'; '.join(said)}. "
              "Random draws (dropout, augmentation) differ from an uninterrupted run from here on.", flush=True)
    if rank < saved:
        state = states[rank]
        return lambda: restore_rng_states(state)
    return lambda: seed_rank_streams(seed, global_step, rank)


def _ranks(first, end):
    return f"rank {first}" if end - first == 1 else f"ranks {first}-{end - 1}"


# -- the process's rank, for layers above the core ------------------------------------------------------------------
# A run that starts tells its global rank here; compatibility layers that keep their own copy (Lightning's
# rank_zero_only.rank, tasktrain/compat/lightning) listen, so that the core never imports them.
_RANK_LISTENERS = []
_KNOWN_RANK = []


def announce_rank(rank: int):
    """This process's global rank, now that a run knows it: every listener hears it."""
    _KNOWN_RANK[:] = [int(rank)]
    for listener in _RANK_LISTENERS:
        listener(int(rank))


def known_rank(default: int) -> int:
    """The global rank the last run announced, else `default` (what a launcher's variables say, before any run)."""
    return _KNOWN_RANK[0] if _KNOWN_RANK else default


def on_rank_known(listener):
    """`listener(rank)` at every run's start (and now, if a run already told it)."""
    _RANK_LISTENERS.append(listener)
    if _KNOWN_RANK:
        listener(_KNOWN_RANK[0])
