"""The `tasktrain` command: a thin dispatcher over `launch`, `config`, `env` and `convert`.

    tasktrain launch [--config_file F] [--num_processes N] [--num_machines M] [--machine_rank R] ... train.py [args]
    tasktrain config [--num_processes N ...] [--output F]     (no flags on a terminal: asks questions)
    tasktrain env
    tasktrain convert CHECKPOINT_DIR OUTPUT.ckpt              (a DeepSpeed ZeRO or FSDP checkpoint -> one file)
    tasktrain convert CHECKPOINT_DIR OUTPUT.ckpt --to ckpt    (... -> one resumable file, optimizer state included)
    tasktrain convert CHECKPOINT.ckpt OUTPUT_DIR --to deepspeed  (one file -> a DeepSpeed checkpoint, any stage)
    tasktrain convert CHECKPOINT.ckpt OUTPUT_DIR --to fsdp    (one file -> an FSDP checkpoint, any world size)
    tasktrain convert CHECKPOINT OUT_DIR --format safetensors (any checkpoint -> Hugging Face shards)

The work is in tasktrain/cli/config.py (the YAML schema and resolution); this file only parses arguments, and
runs torch.distributed.run in-process so the launcher costs one Python start, not two (or, for Accelerate's
mpirun_config, the mpirun on PATH as a child process). torch is imported only
once a configuration has been checked: a bad config is reported at once.
"""
import argparse
import os
import pickle
import shlex
import signal
import subprocess
import sys
import uuid

from tasktrain.cli import config as cfg


def _option(parser, name, **kwargs):
    # Accelerate users write --num_processes; torchrun users write --num-processes: take both.
    names = ["--" + name] + (["--" + name.replace("_", "-")] if "_" in name else [])
    parser.add_argument(*names, dest=name, **kwargs)


# ---------------------------------------------------------------------------------------------------------------------
# launch

def _add_launch(subparsers):
    p = subparsers.add_parser(
        "launch", help="run a training script on one or many machines",
        description="Start `script` once per process through torch.distributed.run, with the choices of a YAML "
                    "config (Accelerate's format works) and of these flags. A flag beats the file; the file beats "
                    "the default. Without --config_file the default config is used if it exists ("
                    + cfg.default_config_path() + ").",
    )
    _option(p, "config_file", metavar="FILE", help="launch YAML (default: the file written by `tasktrain config`)")
    _option(p, "num_processes", type=int, metavar="N", help="total number of processes, over all machines")
    _option(p, "num_machines", type=int, metavar="M", help="number of machines (run this command on each)")
    _option(p, "machine_rank", type=int, metavar="R", help="this machine's rank, 0 to M-1 (0 hosts the rendezvous)")
    _option(p, "main_process_ip", metavar="IP", help="address of machine 0, the same on every machine")
    _option(p, "main_process_port", type=int, metavar="PORT", help="port on machine 0 (default: free port / 29500)")
    _option(p, "mixed_precision", metavar="{" + ",".join(cfg.MIXED_PRECISION) + "}",
            help="mixed precision (Accelerate's names)")
    _option(p, "precision", metavar="NAME", help="precision by our names: " + ", ".join(cfg.PRECISIONS))
    _option(p, "strategy", metavar="NAME", help=", ".join(cfg.STRATEGY_CHOICES))
    p.add_argument("--use_cpu", "--use-cpu", "--cpu", dest="use_cpu", action="store_true", default=None,
                   help="train on CPU even where GPUs exist")
    p.add_argument("--multi_gpu", "--multi-gpu", dest="multi_gpu", action="store_true",
                   help="same as distributed_type MULTI_GPU")
    p.add_argument("--use_deepspeed", "--use-deepspeed", dest="use_deepspeed", action="store_true",
                   help="same as distributed_type DEEPSPEED")
    _option(p, "zero_stage", type=int, metavar="S", help="DeepSpeed ZeRO stage 0-3")
    _option(p, "offload_optimizer_device", metavar="{none,cpu}", help="DeepSpeed optimizer offload")
    _option(p, "offload_param_device", metavar="{none,cpu}", help="DeepSpeed parameter offload (stage 3)")
    _option(p, "zero3_init_flag", metavar="{true,false}", help="DeepSpeed zero.Init for stage 3")
    _option(p, "zero3_save_16bit_model", metavar="{true,false}", help="DeepSpeed: save a 16-bit model at stage 3")
    _option(p, "deepspeed_config_file", metavar="FILE", help="a DeepSpeed JSON config")
    _option(p, "gradient_accumulation_steps", type=int, metavar="N", help="micro-batches per optimizer step")
    _option(p, "gradient_clipping", type=float, metavar="NORM", help="DeepSpeed gradient clipping (0 = off)")
    _option(p, "gpu_ids", metavar="IDS", help="GPUs to use, e.g. 0,1 (CUDA_VISIBLE_DEVICES); default all")
    _option(p, "rdzv_backend", metavar="{static,c10d}", help="torchrun rendezvous for several machines")
    _option(p, "num_cpu_threads_per_process", type=int, metavar="T", help="OMP_NUM_THREADS of each worker")
    _option(p, "max_restarts", type=int, metavar="N",
            help="restart all workers up to N times after a failure, a lost rank or a watchdog stall (torch's "
                 "elastic agent, torchrun --max-restarts); each restart resumes from the newest complete "
                 "checkpoint of this launch (docs/checkpointing.md). Default 0")
    _option(p, "mpirun_hostfile", metavar="FILE",
            help="launch through mpirun / mpiexec (the one on PATH) over the machines this hostfile lists, as "
                 "Accelerate's launcher does: CPU training only (use_cpu, MULTI_CPU), run on one machine")
    p.add_argument("--debug", action="store_true", default=None,
                   help="check that all ranks run the same collectives (TORCH_DISTRIBUTED_DEBUG=DETAIL, "
                        "TASKTRAIN_DEBUG_COLLECTIVES=1)")
    p.add_argument("-m", "--module", action="store_true", help="run `script` as a module, like python -m")
    p.add_argument("script", help="the training script (or module with -m)")
    p.add_argument("script_args", nargs=argparse.REMAINDER, help="arguments for the script")
    p.set_defaults(func=_launch)


LAUNCH_KEYS = (
    "num_processes", "num_machines", "machine_rank", "main_process_ip", "main_process_port", "mixed_precision",
    "precision", "strategy", "use_cpu", "gradient_accumulation_steps", "gpu_ids", "rdzv_backend",
    "num_cpu_threads_per_process", "debug",
)
DEEPSPEED_FLAGS = (
    "zero_stage", "offload_optimizer_device", "offload_param_device", "zero3_init_flag", "zero3_save_16bit_model",
    "deepspeed_config_file", "gradient_clipping",
)


def launch_flags(args) -> dict:
    """The flags the user gave, as config keys (argparse's None means "not given")."""
    flags = {key: getattr(args, key) for key in LAUNCH_KEYS if getattr(args, key, None) is not None}
    if getattr(args, "multi_gpu", False):
        flags.setdefault("distributed_type", "MULTI_GPU")
    if getattr(args, "use_deepspeed", False):
        flags["distributed_type"] = "DEEPSPEED"
    ds = {key: getattr(args, key) for key in DEEPSPEED_FLAGS if getattr(args, key, None) is not None}
    if ds:
        flags["deepspeed_config"] = ds
    if getattr(args, "mpirun_hostfile", None) is not None:
        flags["mpirun_config"] = {"mpirun_hostfile": args.mpirun_hostfile}
    return flags


def _launch(args) -> int:
    path, where = args.config_file, "flag"
    if path is None and os.path.isfile(cfg.default_config_path()):
        path, where = cfg.default_config_path(), "default location"
    settings = cfg.load_config(path, launch_flags(args))
    if path:
        settings.sources["config_file"] = where
    if not args.module and not os.path.isfile(args.script):
        raise cfg.ConfigError(
            f"script {args.script!r} not found (looked from {os.getcwd()}); expected a Python file. "
            "Check the path, or pass -m to run a module."
        )
    max_restarts = args.max_restarts or 0
    if max_restarts < 0:
        raise cfg.ConfigError(f"--max_restarts {max_restarts}: use 0 (no restart) or a positive number.")
    if settings.mpirun_hostfile:
        if max_restarts:
            raise cfg.ConfigError(f"--max_restarts {max_restarts} with mpirun_config: restarts are torchrun's elastic "
                                  "agent's, and mpirun starts these processes. Drop --max_restarts, or remove "
                                  "mpirun_config to start the processes with torchrun.")
        mpirun = cfg.find_mpirun()
        print(settings.describe(), flush=True)
        return run_mpirun(settings, mpirun, args.script, args.script_args, module=args.module)
    from tasktrain.strategies import requeue
    from tasktrain.strategies.environment import SlurmAllocationError, check_launch_in_slurm

    try:
        check_launch_in_slurm(settings.num_machines, settings.num_processes)  # issue 40: srun'd once per node
    except SlurmAllocationError as err:
        raise cfg.ConfigError(str(err)) from None
    requeue.ignore_in_launcher()  # issue 40: the workers save and requeue on SLURM's signal; the launcher waits
    print(settings.describe(), flush=True)
    if max_restarts:
        print(f"  max_restarts: {max_restarts} (each restart resumes from the newest complete checkpoint)", flush=True)
    return run_workers(settings, args.script, args.script_args, module=args.module, max_restarts=max_restarts)


def run_workers(settings, script, script_args=(), module=False, max_restarts=0) -> int:
    """Run torch.distributed.run in this process; return the workers' exit code (the first failure's)."""
    for key, value in settings.worker_env().items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    args = settings.torchrun_args(script, script_args, module)
    if max_restarts:
        # The elastic agent restarts every worker of this machine after any of them fails; the restarted workers see
        # TORCHELASTIC_RESTART_COUNT > 0, and fit resumes from the newest checkpoint this launch (its run id) recorded.
        args = ["--max-restarts", str(max_restarts)] + args
        # torch 2.13: with the c10d rendezvous store shared with the workers (its default), restarted workers read the
        # previous attempt's gloo addresses from it and fail to connect ("Connection refused"); a store per round
        # (hosted by the new rank 0) has none.
        os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
        if "--rdzv-id" not in args:
            args = ["--rdzv-id", uuid.uuid4().hex] + args  # this launch's own id: another launch's pointer is not ours
    torchrun_args = get_args_parser().parse_args(args)
    try:
        run(torchrun_args)
    except ChildFailedError as e:
        print(e, file=sys.stderr, flush=True)
        code = _root_exit_code(e.failures)
        return 128 - code if code < 0 else (code or 1)  # killed by signal N -> 128+N, as shells report it
    except SignalException as e:
        print(f"tasktrain launch: stopped by {e.sigval.name}; the workers were stopped too", file=sys.stderr)
        return 128 + int(e.sigval)
    return 0


def run_mpirun(settings, mpirun, script, script_args=(), module=False) -> int:
    """Accelerate's launch through mpirun (its simple launcher with --mpirun_hostfile): one mpirun / mpiexec for every
    process on every machine of the hostfile, with Accelerate's variables and tasktrain's (settings.mpirun_env);
    the exit code is mpirun's (killed by signal N -> 128+N)."""
    command = settings.mpirun_command(mpirun, script, script_args, module)
    env = dict(os.environ)
    for key, value in settings.mpirun_env().items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    print(f"  mpirun command: {shlex.join(command)}", flush=True)
    process = subprocess.Popen(command, env=env)
    # SIGTERM to the launcher (a scheduler's, `kill`) goes on to mpirun, which stops its processes on every machine:
    # none is left running without its launcher. (Ctrl-C on a terminal reaches mpirun itself, in the same group.)
    stopped_by = []

    def forward(signum, frame):
        stopped_by.append(signum)
        process.send_signal(signum)

    previous = signal.signal(signal.SIGTERM, forward)
    try:
        while True:
            try:
                code = process.wait()
                break
            except KeyboardInterrupt:
                continue
    finally:
        signal.signal(signal.SIGTERM, previous)
    if stopped_by:  # (as the torchrun launch: 128 + the signal, whatever code mpirun chose; MPICH's is the signal's)
        print(f"tasktrain launch: stopped by {signal.Signals(stopped_by[0]).name}; mpirun stopped its processes too",
              file=sys.stderr)
        return 128 + stopped_by[0]
    return 128 - code if code < 0 else code


def _root_exit_code(failures) -> int:
    # When one worker dies, torchrun stops the others with SIGTERM and lists them as failures too, with timestamps
    # in whole seconds: the worker that was not stopped by the launcher is the one whose code matters.
    own = [f for f in failures.values() if f.exitcode != -signal.SIGTERM] or list(failures.values())
    return min(own, key=lambda f: f.timestamp).exitcode


# ---------------------------------------------------------------------------------------------------------------------
# config

def _add_config(subparsers):
    p = subparsers.add_parser(
        "config", help="write a launch YAML",
        description="Write a launch config (Accelerate's keys, so `accelerate launch` reads it too). With no answer "
                    "flags on a terminal, asks questions; otherwise the flags are the answers and the rest are "
                    f"defaults. Default file: {cfg.default_config_path()} ($TASKTRAIN_CONFIG_DIR or "
                    "$XDG_CACHE_HOME/tasktrain or ~/.cache/tasktrain).",
    )
    _option(p, "num_processes", type=int, metavar="N", help="total number of processes, over all machines")
    _option(p, "num_machines", type=int, metavar="M")
    _option(p, "machine_rank", type=int, metavar="R")
    _option(p, "main_process_ip", metavar="IP")
    _option(p, "main_process_port", type=int, metavar="PORT")
    _option(p, "mixed_precision", metavar="{" + ",".join(cfg.MIXED_PRECISION) + "}")
    _option(p, "strategy", metavar="NAME", help=", ".join(cfg.STRATEGY_CHOICES))
    p.add_argument("--use_cpu", "--use-cpu", "--cpu", dest="use_cpu", action="store_true", default=None)
    _option(p, "gradient_accumulation_steps", type=int, metavar="N")
    p.add_argument("--defaults", action="store_true", help="write the defaults without asking")
    p.add_argument("-o", "--output", metavar="FILE", help="where to write (default: the default config file)")
    p.set_defaults(func=_config)


CONFIG_KEYS = (
    "num_processes", "num_machines", "machine_rank", "main_process_ip", "main_process_port", "mixed_precision",
    "strategy", "use_cpu", "gradient_accumulation_steps",
)


def _config(args) -> int:
    answers = {key: getattr(args, key) for key in CONFIG_KEYS if getattr(args, key) is not None}
    if not answers and not args.defaults:
        if sys.stdin.isatty():
            answers = cfg.ask_questions(input, gpu_count=cfg.count_gpus())
        else:
            print("tasktrain config: not a terminal and no answers given as flags: writing the defaults")
    values = cfg.config_values(answers)
    path = cfg.write_config(values, args.output or cfg.default_config_path())
    print(f"tasktrain config: wrote {path}")
    print(cfg.yaml_text(values), end="")
    return 0


# ---------------------------------------------------------------------------------------------------------------------
# env

def _add_env(subparsers):
    p = subparsers.add_parser("env", help="print versions, devices and the default config (for bug reports)")
    p.set_defaults(func=_env)


def _env(args) -> int:
    import platform
    from importlib import metadata

    def version(name):
        try:
            return metadata.version(name)  # deepspeed is not imported: that takes seconds and may compile things
        except metadata.PackageNotFoundError:
            return "not installed"

    import torch
    from tasktrain.version import __version__

    if torch.cuda.is_available():
        names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        devices = f"{len(names)} GPU(s): {', '.join(names)} (CUDA {torch.version.cuda})"
    else:
        devices = "no GPU (CPU only)"
    rows = [
        ("tasktrain", __version__),
        ("python", f"{platform.python_version()} ({sys.executable})"),
        ("platform", platform.platform()),
        ("torch", torch.__version__),
        ("deepspeed", version("deepspeed")),
        ("pyyaml", version("pyyaml")),
        ("devices", devices),
        ("cpu cores", os.cpu_count()),
        ("distributed backends", ", ".join(b for b, ok in (
            ("gloo", torch.distributed.is_gloo_available()), ("nccl", torch.distributed.is_nccl_available()),
        ) if ok) or "none"),
    ]
    for name, value in rows:
        print(f"{name:<22} {value}")
    path = cfg.default_config_path()
    if os.path.isfile(path):
        print(f"{'default config':<22} {path}")
        with open(path) as f:
            print("  " + f.read().rstrip().replace("\n", "\n  "))
    else:
        print(f"{'default config':<22} {path} (not written yet: `tasktrain config`)")
    launch_vars = {k: v for k, v in sorted(os.environ.items()) if k.startswith("TASKTRAIN_")}
    for key, value in launch_vars.items():
        print(f"{key:<22} {value}")
    return 0


# ---------------------------------------------------------------------------------------------------------------------
# convert

def _add_convert(subparsers):
    p = subparsers.add_parser(
        "convert", help="consolidate a DeepSpeed or FSDP checkpoint into one file, or export a checkpoint to safetensors",
        description="With --format ckpt (the default): gather the ZeRO shards of a checkpoint directory written under "
                    "the DeepSpeed strategy (or the DCP shards of one written under FSDP) into one state dict, saved in tasktrain's checkpoint format (weights "
                    "only): TaskModule.load_from_checkpoint(OUTPUT) and torch.load(OUTPUT, weights_only=True) read "
                    "it. With --format safetensors or bin: write the weights of a checkpoint file (a Trainer "
                    "checkpoint or a state dict) or of a DeepSpeed checkpoint directory to the folder OUTPUT in the "
                    "Hugging Face layout (model.safetensors, or shards plus model.safetensors.index.json), which "
                    "load_checkpoint_and_dispatch and transformers' from_pretrained read. With --to: a whole run "
                    "(weights, optimizer state, loop state) between strategies: --to ckpt (a DeepSpeed or FSDP "
                    "directory -> one file; the Accelerator's FSDP save_state directory -> its layout without "
                    "FSDP), --to deepspeed / --to fsdp (one file -> that strategy's directory). Runs in one process "
                    "and needs the whole model's fp32 size in memory for a sharded directory.",
    )
    p.add_argument("checkpoint_dir", metavar="CHECKPOINT",
                   help="a DeepSpeed or FSDP checkpoint directory (e.g. checkpoints/last.ckpt), or, for "
                        "safetensors/bin, --to deepspeed and --to fsdp, a checkpoint file")
    p.add_argument("output", help="the file to write (e.g. model.ckpt), or the folder for safetensors/bin, --to "
                                  "deepspeed, --to fsdp and an Accelerator's directory")
    p.add_argument("--format", choices=("ckpt", "safetensors", "bin"), default="ckpt",
                   help="ckpt: one tasktrain checkpoint file; safetensors / bin: Hugging Face shards (default: ckpt)")
    p.add_argument("--to", choices=("ckpt", "deepspeed", "fsdp"), default=None,
                   help="move a run between strategies with its optimizer state: ckpt: a DeepSpeed or FSDP "
                        "checkpoint directory -> one resumable checkpoint file (one process or DDP); deepspeed: a "
                        "checkpoint file -> a DeepSpeed checkpoint directory any ZeRO stage resumes on any number "
                        "of processes; fsdp: a checkpoint file -> an FSDP checkpoint directory (DCP) FSDP resumes "
                        "on any number of processes (default: the weights only, as --format says)")
    _option(p, "max_shard_size", metavar="SIZE",
            help="safetensors/bin: the largest shard, e.g. 2GB (10**9 bytes), 500MiB (default: 2GB)")
    p.add_argument("--prefix", metavar="NAME",
                   help="safetensors/bin: export only the weights under this submodule, with the prefix removed "
                        "(e.g. --prefix model for the network a TaskModule holds as self.model)")
    p.set_defaults(func=_convert)


def _convert(args) -> int:
    from tasktrain.checkpoint_io import CheckpointError

    if args.to is not None:
        return _convert_run(args, CheckpointError)
    if args.format == "ckpt":
        given = [flag for flag, value in (("--max-shard-size", args.max_shard_size), ("--prefix", args.prefix))
                 if value is not None]
        if given:
            print(f"tasktrain convert: error: {' and '.join(given)} apply to --format safetensors or bin; the default "
                  f"--format ckpt writes one file of the whole state dict.", file=sys.stderr)
            return 2
        try:
            checkpoint = _consolidate(args.checkpoint_dir, args.output)
        except (CheckpointError, FileNotFoundError, ValueError) as e:
            print(f"tasktrain convert: error: {e}", file=sys.stderr)
            return 2
        state = checkpoint["state_dict"]
        numel = sum(t.numel() for t in state.values())
        print(f"tasktrain convert: wrote {args.output} ({len(state)} tensors, {numel:,} values, fp32)")
        return 0
    return _export(args, CheckpointError)


def _consolidate(checkpoint_dir, output=None):
    """One checkpoint dict of the whole weights from a sharded checkpoint directory: FSDP's (DCP) or DeepSpeed's."""
    from tasktrain.strategies.fsdp import convert_fsdp_checkpoint, is_fsdp_checkpoint

    if os.path.isdir(checkpoint_dir) and is_fsdp_checkpoint(checkpoint_dir):
        return convert_fsdp_checkpoint(checkpoint_dir, output)
    from tasktrain.strategies.deepspeed import convert_zero_checkpoint

    return convert_zero_checkpoint(checkpoint_dir, output)


def _convert_run(args, CheckpointError) -> int:
    """--to: a whole checkpoint (weights, optimizer state, loop state) from one strategy's layout into another's."""
    given = [flag for flag, value in (("--format", args.format != "ckpt" and args.format),
                                      ("--max-shard-size", args.max_shard_size), ("--prefix", args.prefix)) if value]
    if given:
        print(f"tasktrain convert: error: {' and '.join(given)} do not apply with --to, which writes a whole "
              "checkpoint (weights, optimizer and loop state) for another strategy.", file=sys.stderr)
        return 2
    from tasktrain.strategies.fsdp import convert_fsdp_checkpoint, convert_to_fsdp, is_fsdp_checkpoint

    try:
        if args.to == "ckpt" and _is_accelerator_fsdp_state(args.checkpoint_dir):
            from tasktrain.strategies.fsdp import convert_fsdp_state_dir
            from tasktrain.trainer.accelerator import STATE_FILE

            convert_fsdp_state_dir(args.checkpoint_dir, args.output, STATE_FILE)
            print(f"tasktrain convert: wrote {args.output} (the Accelerator's save_state layout without FSDP: whole "
                  "weights, optimizer state, loaders' positions): accelerator.load_state it on one process or DDP")
        elif args.to == "ckpt":
            if os.path.isdir(args.checkpoint_dir) and is_fsdp_checkpoint(args.checkpoint_dir):
                checkpoint = convert_fsdp_checkpoint(args.checkpoint_dir, args.output, optimizer=True)
            else:
                from tasktrain.strategies.deepspeed import convert_zero_checkpoint

                checkpoint = convert_zero_checkpoint(args.checkpoint_dir, args.output, optimizer=True)
            steps = checkpoint["loops"]["train_state"].get("global_step")
            print(f"tasktrain convert: wrote {args.output} (weights, optimizer state and loop state at global step "
                  f"{steps}): resume from it on one process or DDP (any number of processes), or convert it "
                  "--to deepspeed or --to fsdp")
        elif args.to == "fsdp":
            convert_to_fsdp(args.checkpoint_dir, args.output)
            print(f"tasktrain convert: wrote {args.output} (FSDP's sharded layout: DCP files and tasktrain_state.pt, "
                  "optimizer state included): resume from it under FSDP, on any number of processes")
        else:
            if os.path.isdir(args.checkpoint_dir):
                raise CheckpointError(f"{args.checkpoint_dir!r} is a directory: --to deepspeed takes one checkpoint "
                                      "file (a Trainer checkpoint of one process or DDP). An FSDP checkpoint "
                                      "directory goes to one file first: tasktrain convert DIR run.ckpt --to ckpt.")
            from tasktrain.strategies.deepspeed import convert_to_deepspeed

            convert_to_deepspeed(args.checkpoint_dir, args.output)
            print(f"tasktrain convert: wrote {args.output} (DeepSpeed's universal layout, optimizer state included): "
                  "resume from it with any ZeRO stage, on any number of processes")
    except (CheckpointError, FileNotFoundError, ValueError, OSError) as e:
        print(f"tasktrain convert: error: {e}", file=sys.stderr)
        return 2
    return 0


def _is_accelerator_fsdp_state(path):
    from tasktrain.trainer.accelerator import STATE_FILE

    return os.path.isfile(os.path.join(path, ".metadata")) and os.path.isfile(os.path.join(path, STATE_FILE))


def _export(args, CheckpointError) -> int:
    from tasktrain.inference.checkpoint_files import read_state_dict
    from tasktrain.inference.saving import describe_saved, save_model

    try:
        if os.path.isdir(args.checkpoint_dir):
            state = _consolidate(args.checkpoint_dir)["state_dict"]
        else:
            state = read_state_dict(args.checkpoint_dir)
        prefix = (args.prefix or "").rstrip(".")
        if prefix:
            kept = {k[len(prefix) + 1:]: v for k, v in state.items() if k.startswith(prefix + ".")}
            if not kept:
                tops = sorted({k.split(".", 1)[0] for k in state})
                raise ValueError(f"no weight of {args.checkpoint_dir!r} is under '{prefix}.'; its top-level names "
                                 f"are {tops[:10]}.")
            state = kept
        paths = save_model(state, args.output, max_shard_size=args.max_shard_size or "2GB",
                           safe_serialization=args.format == "safetensors")
    except (CheckpointError, OSError, ValueError, RuntimeError, pickle.UnpicklingError) as e:
        print(f"tasktrain convert: error: {e}", file=sys.stderr)
        return 2
    print(f"tasktrain convert: wrote {args.output} ({len(state)} tensors in {describe_saved(paths)}, "
          f"{args.format})")
    return 0


# ---------------------------------------------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tasktrain", description="tasktrain command line")
    subparsers = parser.add_subparsers(dest="command", metavar="{launch,config,env,convert}")
    _add_launch(subparsers)
    _add_config(subparsers)
    _add_env(subparsers)
    _add_convert(subparsers)
    return parser



def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help()
        return 2
    try:
        return args.func(args)
    except cfg.ConfigError as e:
        print(f"tasktrain {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
