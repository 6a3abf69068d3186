"""The `tasktrain launch` configuration: one YAML file per cluster setup, Accelerate's format accepted as is.

    read_config_file(path)        YAML -> a checked dict of raw keys (an unknown key is an error, with a suggestion)
    resolve(file_values, flags)   raw keys from the file and from the command line -> LaunchSettings;
                                  a command-line flag beats the file, the file beats the default
    load_config(path, flags)      both at once

LaunchSettings knows the TASKTRAIN_* variables the workers get (worker_env, documented in
tasktrain/strategies/environment.py), the torch.distributed.run command line (torchrun_args), Accelerate's mpirun
command line and variables where the config has mpirun_config (mpirun_command, mpirun_env), and how to print
itself (describe). Nothing here imports torch: a bad config fails in a fraction of a second.
"""
import difflib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Optional

import yaml

from tasktrain.fsdp_options import IGNORED as FSDP_IGNORED
from tasktrain.fsdp_options import USED as FSDP_USED
from tasktrain.fsdp_options import fsdp_options, yaml_key
from tasktrain.names import (AUTO_STRATEGY, MIXED_PRECISION, ONE_PROCESS_STARTS, PRECISION_ALIASES, PRECISIONS,
                             STRATEGIES, deepspeed_name)


class ConfigError(ValueError):
    """A launch configuration that cannot work; the message says what to change."""


# ---------------------------------------------------------------------------------------------------------------------
# The schema

# Accelerate keys that change what we do, and our own keys.
USED_KEYS = (
    "compute_environment", "distributed_type", "num_processes", "num_machines", "machine_rank",
    "main_process_ip", "main_process_port", "mixed_precision", "use_cpu", "gpu_ids", "rdzv_backend",
    "debug", "num_cpu_threads_per_process", "deepspeed_config", "fsdp_config", "parallelism_config",
    "mpirun_config",  # Accelerate's launch through mpirun over a hostfile (CPU only: _resolve_mpirun)
    "strategy", "precision", "gradient_accumulation_steps",  # ours
)

# Accelerate keys that are accepted (so existing files work unchanged) but do nothing here, and why.
IGNORED_KEYS = {
    "same_network": "torchrun's rendezvous needs no hint about the network",
    "downcast_bf16": "TPU only",
    "main_training_function": "only for notebook launchers; the script runs as __main__",
    "enable_cpu_affinity": "NUMA pinning is not done by tasktrain launch",
    "dynamo_backend": "pass Accelerator(dynamo_backend=...) in the script instead",
    "dynamo_config": "pass Accelerator(dynamo_backend=...) or dynamo_plugin=TorchDynamoPlugin(...) in the script instead",
    "megatron_lm_config": "Megatron-LM is not supported",
    "fp8_config": "fp8 is not supported",
    "ipex_config": "the Intel extension is not used",
    "use_mps_device": "Apple MPS is not a launch setting",
    "commands": "TPU pod commands",
    "command_file": "TPU pod commands",
}
IGNORED_PREFIXES = {"tpu_": "TPU only"}

DEEPSPEED_USED_KEYS = (
    "zero_stage", "gradient_accumulation_steps", "gradient_clipping", "offload_optimizer_device",
    "offload_param_device", "zero3_init_flag", "zero3_save_16bit_model", "deepspeed_config_file",
    "offload_optimizer_nvme_path", "offload_param_nvme_path",
)
DEEPSPEED_IGNORED_KEYS = {
    "deepspeed_multinode_launcher": "torchrun runs on every machine: start the same command on each",
    "deepspeed_hostfile": "torchrun runs on every machine: start the same command on each",
    "deepspeed_inclusion_filter": "torchrun runs on every machine: start the same command on each",
    "deepspeed_exclusion_filter": "torchrun runs on every machine: start the same command on each",
    "deepspeed_moe_layer_cls_names": "MoE layers are the script's business",
}

# fsdp_config (distributed_type FSDP): Accelerate's keys, mapped onto FSDP(...) arguments by the table the Accelerator's
# FullyShardedDataParallelPlugin uses too (tasktrain/fsdp_options.py).
FSDP_KEYS = [yaml_key(field) for field in (*FSDP_USED, *FSDP_IGNORED)]

DISTRIBUTED_TYPES = ("NO", "MULTI_CPU", "MULTI_GPU", "DEEPSPEED", "FSDP")
# What each distributed_type runs when no strategy is named (the table's plain name of that kind).
STRATEGY_OF_TYPE = {"NO": "single_device", "MULTI_CPU": "ddp", "MULTI_GPU": "ddp", "DEEPSPEED": "deepspeed",
                    "FSDP": "fsdp"}
STRATEGY_CHOICES = (AUTO_STRATEGY, *STRATEGIES)
RDZV_BACKENDS = ("static", "c10d")
OFFLOAD_DEVICES = ("none", "cpu", "nvme")
DEFAULT_PORT = 29500  # torchrun's; every machine of a multi-machine run must agree on it

# Settings that are the same choice spelled two ways: when the command line sets one, the file's other
# spelling must not win over it.
SAME_SETTING = {
    "strategy": ("distributed_type",), "distributed_type": ("strategy",),
    "precision": ("mixed_precision",), "mixed_precision": ("precision",),
}


def default_config_dir() -> str:
    """$TASKTRAIN_CONFIG_DIR, else $XDG_CACHE_HOME/tasktrain, else ~/.cache/tasktrain."""
    if os.environ.get("TASKTRAIN_CONFIG_DIR"):
        return os.environ["TASKTRAIN_CONFIG_DIR"]
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "tasktrain")


def default_config_path() -> str:
    return os.path.join(default_config_dir(), "default_config.yaml")


# ---------------------------------------------------------------------------------------------------------------------
# Reading a file

def read_config_file(path: str) -> dict:
    """Parse a launch YAML (or JSON) file and check its keys; values are checked later, by resolve()."""
    if not os.path.isfile(path):
        raise ConfigError(
            f"config file {path!r} does not exist. Expected a YAML file written by `tasktrain config` or "
            f"`accelerate config`. Check the path, or run `tasktrain config --output {path}` to write one."
        )
    with open(path) as f:
        try:
            values = yaml.safe_load(f)
        except yaml.YAMLError as e:
            raise ConfigError(f"config file {path!r} is not valid YAML: {e}. Fix the syntax and try again.") from None
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise ConfigError(
            f"config file {path!r} holds a {type(values).__name__}, expected a mapping of keys such as "
            "`num_processes: 2`. See docs/launch.md for the format."
        )
    check_keys(values, where=f"config file {path!r}")
    return values


def check_keys(values: dict, where: str = "the configuration") -> None:
    valid = list(USED_KEYS) + list(IGNORED_KEYS)
    for key in values:
        if key in valid or any(str(key).startswith(p) for p in IGNORED_PREFIXES):
            continue
        raise ConfigError(_unknown("key", key, valid + ["tpu_*"], where))
    ds = values.get("deepspeed_config")
    if ds is None:
        return
    if not isinstance(ds, dict):
        raise ConfigError(
            f"deepspeed_config in {where} is {ds!r}, expected a mapping such as `deepspeed_config: "
            "{zero_stage: 2}`. Fix the value or remove the key."
        )
    ds_valid = list(DEEPSPEED_USED_KEYS) + list(DEEPSPEED_IGNORED_KEYS)
    for key in ds:
        if key not in ds_valid:
            raise ConfigError(_unknown("deepspeed_config key", key, ds_valid, where))


def _check_fsdp_config(fsdp, where="the configuration"):
    """(FSDP(...) keyword arguments, the keys ignored) of an fsdp_config mapping."""
    if not isinstance(fsdp, dict):
        raise ConfigError(f"fsdp_config in {where} is {fsdp!r}, expected a mapping such as `fsdp_config: "
                          "{fsdp_version: 2}`. Fix the value or remove the key.")
    for key in fsdp:
        if key not in FSDP_KEYS:
            raise ConfigError(_unknown("fsdp_config key", key, FSDP_KEYS, where))
    values = {key if key == "fsdp_version" else key[len("fsdp_"):]: value for key, value in fsdp.items()}
    try:
        kwargs, ignored = fsdp_options(values, f"fsdp_config in {where}", yaml=True)
    except ValueError as error:
        raise ConfigError(str(error)) from None
    return kwargs, [yaml_key(field) for field in ignored]


def _unknown(kind, key, valid, where):
    close = difflib.get_close_matches(str(key), valid, n=1, cutoff=0.6)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    return (
        f"unknown {kind} {key!r} in {where}.{hint} Valid keys: {', '.join(sorted(valid))}. "
        "Fix the spelling or remove the key."
    )


# ---------------------------------------------------------------------------------------------------------------------
# Value checks. YAML reads `NO`, `no`, `off` as False and `yes`, `on` as True: where a name is expected they
# mean the name (distributed_type: NO, mixed_precision: no), never a boolean.

def _name(value):
    if value is False:
        return "no"
    if value is True:
        return "yes"
    return None if value is None else str(value).strip()


def _choice(key, value, choices, upper=False, hint=""):
    name = _name(value)
    if name is None:
        return None
    name = name.upper() if upper else name.lower()
    if name not in choices:
        close = _closest(name, choices)
        suggestion = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
        raise ConfigError(
            f"{key}: {value!r} is not supported; expected one of {', '.join(choices)}.{suggestion}{hint}"
        )
    return name


def _closest(name, choices):
    """The choices nearest to a misspelt `name`: fewest edits among difflib's candidates, ties in table order
    ("dpp" -> "ddp" or "dp")."""
    candidates = difflib.get_close_matches(name, choices, n=4, cutoff=0.5)
    if not candidates:
        return []
    distance = {c: _edits(name, c) for c in candidates}
    best = min(distance.values())
    return [c for c in choices if distance.get(c) == best]


def _edits(a, b):
    """Levenshtein distance (insertions, deletions, substitutions)."""
    row = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        previous, row[0] = row[0], i
        for j, cb in enumerate(b, 1):
            previous, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, previous + (ca != cb))
    return row[-1]


def _integer(key, value, minimum=None, maximum=None):
    if value is None:
        return None
    if isinstance(value, bool) or not (isinstance(value, int) or (isinstance(value, str) and value.strip().isdigit())):
        raise ConfigError(f"{key}: {value!r} is not a whole number; expected for example `{key}: 2`.")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ConfigError(f"{key}: {value} is too small; expected a whole number >= {minimum}.")
    if maximum is not None and value > maximum:
        raise ConfigError(f"{key}: {value} is too large; expected a whole number <= {maximum}.")
    return value


def _number(key, value, minimum=0.0):
    if value is None:
        return None
    try:
        if isinstance(value, bool):
            raise ValueError
        value = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{key}: {value!r} is not a number; expected for example `{key}: 1.0`.") from None
    if value < minimum:
        raise ConfigError(f"{key}: {value} is negative; expected a number >= {minimum} (0 turns it off).")
    return value


def _flag(key, value):
    if value is None or isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "yes", "1", "on"):
        return True
    if text in ("false", "no", "0", "off"):
        return False
    raise ConfigError(f"{key}: {value!r} is not true or false; expected `{key}: true` or `{key}: false`.")


def _gpu_ids(value):
    # Accelerate writes `gpu_ids: all`, `gpu_ids: 0,1` (a string to YAML) or a single `gpu_ids: 0` (an int).
    if value is None or _name(value).lower() == "all":
        return None
    items = value if isinstance(value, (list, tuple)) else str(value).split(",")
    ids = [str(i).strip() for i in items if str(i).strip()]
    if not ids or not all(i.isdigit() for i in ids):
        raise ConfigError(f"gpu_ids: {value!r} is not understood; expected `all` or GPU numbers such as `0,1`.")
    return ",".join(ids)


def _precision(value):
    if value is None:
        return None
    key = value if isinstance(value, int) and not isinstance(value, bool) else _name(value)
    if key not in PRECISION_ALIASES:
        raise ConfigError(
            f"precision: {value!r} is not supported; expected one of {', '.join(PRECISIONS)} "
            f"(or mixed_precision: {' | '.join(MIXED_PRECISION)})."
        )
    return PRECISION_ALIASES[key]


# ---------------------------------------------------------------------------------------------------------------------
# The resolved configuration

@dataclass
class LaunchSettings:
    num_processes: int = 1              # over all machines
    num_machines: int = 1
    machine_rank: int = 0
    main_process_ip: str = "127.0.0.1"
    main_process_port: Optional[int] = None  # None on one machine: a free port is found by torchrun's rendezvous
    strategy: str = "single_device"     # a registry name, or "deepspeed" with the details in `deepspeed`
    precision: str = "32-true"
    use_cpu: bool = False
    gradient_accumulation_steps: Optional[int] = None
    gradient_clipping: Optional[float] = None
    deepspeed: Optional[dict] = None    # DeepSpeed(...) keyword arguments when the strategy is DeepSpeed
    fsdp: Optional[dict] = None         # FSDP(...) keyword arguments from fsdp_config (wrap, activation_checkpointing, ...)
    parallelism: Optional[dict] = None  # issue 39: parallelism_config's sizes {"dp_replicate": r, "dp_shard": s, "tp": t}
    rdzv_backend: str = "static"
    gpu_ids: Optional[str] = None       # "0,1" -> CUDA_VISIBLE_DEVICES; None: all
    num_cpu_threads_per_process: Optional[int] = None
    debug: bool = False
    mpirun_hostfile: Optional[str] = None  # Accelerate's mpirun_config: launch through mpirun over this hostfile
    config_file: Optional[str] = None
    sources: dict = field(default_factory=dict)   # setting -> "flag", "file", "default" or why
    ignored: list = field(default_factory=list)   # keys present but not applying here
    notes: list = field(default_factory=list)     # things the user should know, printed with the config

    @property
    def nproc_per_node(self) -> int:
        return self.num_processes // self.num_machines

    @property
    def is_deepspeed(self) -> bool:
        return self.deepspeed is not None

    def worker_env(self) -> dict:
        """Variables for the workers; a None value means "remove it" (a stale one from the shell must not leak)."""
        env = {
            "TASKTRAIN_LAUNCH": "1",
            "TASKTRAIN_STRATEGY": "deepspeed" if self.is_deepspeed else self.strategy,
            # Only a precision the user chose: the script's own precision= must not be "overridden" by a default.
            "TASKTRAIN_PRECISION": None if self.sources.get("precision") == "default" else self.precision,
            "TASKTRAIN_USE_CPU": "1" if self.use_cpu else "0",
            "TASKTRAIN_NUM_PROCESSES": str(self.num_processes),
            "TASKTRAIN_NUM_MACHINES": str(self.num_machines),
            "TASKTRAIN_GRADIENT_ACCUMULATION_STEPS": _text(self.gradient_accumulation_steps),
            "TASKTRAIN_GRADIENT_CLIPPING": _text(self.gradient_clipping),
            "TASKTRAIN_DEEPSPEED": json.dumps(self.deepspeed) if self.is_deepspeed else None,
            "TASKTRAIN_FSDP": json.dumps(self.fsdp) if self.fsdp else None,
            # parallelism_config (issue 39): Accelerate's variables, which ParallelismConfig() reads in the script
            "ACCELERATE_USE_PARALLELISM_CONFIG": "true" if self.parallelism else None,
        }
        for dim in ("dp_replicate", "dp_shard", "tp", "cp"):
            env[f"PARALLELISM_CONFIG_{dim.upper()}_SIZE"] = (str(self.parallelism.get(dim, 1)) if self.parallelism
                                                             else None)
        if self.gpu_ids and not self.use_cpu:
            env["CUDA_VISIBLE_DEVICES"] = self.gpu_ids
        if self.num_cpu_threads_per_process:
            env["OMP_NUM_THREADS"] = str(self.num_cpu_threads_per_process)
        if self.debug:
            # Checks that every rank calls the same collectives with the same shapes, and says which rank differs:
            # ours with call sites for the strategy's collectives; torch's for every collective (engines'
            # included), but not on CPU: torch 2.13's DDP segfaults when it is built under DETAIL with gloo.
            env["TASKTRAIN_DEBUG_COLLECTIVES"] = "1"
            if not self.use_cpu:
                env["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
        return env

    def torchrun_args(self, script: str, script_args=(), module: bool = False) -> list:
        args = ["--nnodes", str(self.num_machines), "--nproc-per-node", str(self.nproc_per_node)]
        if self.num_machines == 1 and self.main_process_port is None:
            # The rendezvous store binds a free loopback port and hands it to the workers: no race for a port.
            args += ["--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:0"]
        elif self.rdzv_backend == "c10d":
            # c10d numbers the machines in the order they join: no node rank to pass.
            endpoint = f"{self.main_process_ip}:{self.main_process_port or DEFAULT_PORT}"
            args += ["--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", "tasktrain"]
        else:
            args += [
                "--node-rank", str(self.machine_rank),
                "--rdzv-backend", "static",
                "--master-addr", self.main_process_ip,
                "--master-port", str(self.main_process_port or DEFAULT_PORT),
            ]
        if module:
            args.append("--module")
        return args + [script] + list(script_args)

    def mpirun_command(self, mpirun, script: str, script_args=(), module: bool = False, python=None) -> list:
        """Accelerate's command line (prepare_simple_launcher_cmd_env): `mpirun -f HOSTFILE -ppn P -n N python
        script` for MPICH / Intel MPI / MVAPICH, `mpirun --hostfile HOSTFILE --npernode P -n N --bind-to socket python
        script` for Open MPI. `mpirun` is find_mpirun()'s (program, hostfile, count, per-node, bind-to options)."""
        program, hostfile_arg, num_proc_arg, per_node_arg, bind_to_arg = mpirun
        command = [program, hostfile_arg, self.mpirun_hostfile, per_node_arg, str(self.nproc_per_node),
                   num_proc_arg, str(self.num_processes)]
        if bind_to_arg:
            command += [bind_to_arg, "socket"]  # (Accelerate's: its getattr(args, "bind-to", "socket"))
        command.append(python or sys.executable)
        if module:
            command.append("-m")
        return command + [script] + list(script_args)

    def mpirun_env(self, environ=None) -> dict:
        """worker_env() and the variables Accelerate's launcher gives the processes it starts through mpirun:
        ACCELERATE_USE_CPU (the Accelerator then joins MPI's world on CPU, tasktrain's and Accelerate's alike),
        MASTER_ADDR / MASTER_PORT where there are several processes, Intel OpenMP's KMP_AFFINITY / KMP_BLOCKTIME,
        ACCELERATE_MIXED_PRECISION, ACCELERATE_DEBUG_MODE with debug, and OMP_NUM_THREADS: num_cpu_threads_per_process,
        else the launcher's own OMP_NUM_THREADS, else each process's share of the physical cores (at least 1).
        Not set: Accelerate's ACCELERATE_DYNAMO_* (dynamo_backend is not a launch setting here: docs/launch.md)."""
        environ = os.environ if environ is None else environ
        env = self.worker_env()
        env["ACCELERATE_USE_CPU"] = "True"  # (Accelerate's str(args.cpu or args.use_cpu): only CPU launches get here)
        if self.debug:
            env["ACCELERATE_DEBUG_MODE"] = "true"
        if self.num_processes > 1 or self.num_machines > 1:
            env["MASTER_ADDR"] = self.main_process_ip
            env["MASTER_PORT"] = str(self.main_process_port or DEFAULT_PORT)
        env["KMP_AFFINITY"] = "granularity=fine,compact,1,0"
        env["KMP_BLOCKTIME"] = "1"
        env["ACCELERATE_MIXED_PRECISION"] = ACCELERATE_PRECISION.get(self.precision)  # (none for 64-true, *-true)
        threads = self.num_cpu_threads_per_process
        if threads is None:
            threads = _positive(environ.get("OMP_NUM_THREADS")) or max(1, physical_cores() // self.nproc_per_node)
        env["OMP_NUM_THREADS"] = str(threads)
        return env

    def strategy_description(self) -> str:
        if self.fsdp:  # fsdp_config's options beyond the name; class names as a set
            shown = [f"{k}={{{', '.join(v)}}}" if isinstance(v, list) else f"{k}={v!r}" for k, v in self.fsdp.items()]
            return f"{self.strategy} ({', '.join(shown)})"
        if not self.is_deepspeed:
            return self.strategy
        ds = self.deepspeed
        details = [f"stage {ds['stage']}"]
        for key, what in (("offload_optimizer", "offload optimizer"), ("offload_parameters", "offload parameters")):
            if ds[key]:
                details.append(f"{what} to disk ({ds.get('nvme_path') or 'the config file says where'})"
                               if ds[key] == "nvme" else what)
        if ds.get("config"):
            details.append(f"config {ds['config']}")
        return f"{self.strategy} ({', '.join(details)})"

    def describe(self) -> str:
        port = self.main_process_port
        if port is None:
            port = "a free port" if self.num_machines == 1 else DEFAULT_PORT
        rows = [
            ("config_file", self.config_file or "none"),
            ("num_processes", f"{self.num_processes} ({self.nproc_per_node} per machine)"),
            ("num_machines", self.num_machines),
            ("machine_rank", self.machine_rank),
            ("main_process_ip", self.main_process_ip),
            ("main_process_port", port),
            ("strategy", self.strategy_description()),
            ("precision", self.precision),
            ("use_cpu", self.use_cpu),
        ]
        optional = ("gradient_accumulation_steps", "gradient_clipping", "gpu_ids", "num_cpu_threads_per_process")
        rows += [(name, getattr(self, name)) for name in optional if getattr(self, name) is not None]
        if self.debug:
            rows.append(("debug", True))
        if self.mpirun_hostfile:
            rows.append(("mpirun_hostfile", self.mpirun_hostfile))
        if self.num_machines > 1 and self.rdzv_backend != "static" and not self.mpirun_hostfile:
            rows.append(("rdzv_backend", self.rdzv_backend))
        lines = ["tasktrain launch: resolved configuration"]
        for name, value in rows:
            source = self.sources.get(name)
            lines.append(f"  {name:<28} {value}" + (f"   [{source}]" if source else ""))
        if self.ignored:
            lines.append(f"  ignored (do not apply to tasktrain launch): {', '.join(self.ignored)}")
        for note in self.notes:
            lines.append(f"  note: {note}")
        return "\n".join(lines)


def _text(value):
    return None if value is None else str(value)


def _positive(text):
    return int(text) if text and text.strip().isdigit() and int(text) > 0 else None


ACCELERATE_PRECISION = {ours: theirs for theirs, ours in MIXED_PRECISION.items()}


def physical_cores() -> int:
    """The machine's physical cores, as Accelerate counts them (psutil), or its logical ones without psutil."""
    try:
        import psutil
    except ImportError:  # (not a tasktrain dependency)
        return os.cpu_count() or 1
    return psutil.cpu_count(logical=False) or os.cpu_count() or 1


def find_mpirun(which=shutil.which, version=None):
    """Accelerate's _get_mpirun_args: mpirun, else mpiexec, on PATH; `--version` says whether it is Open MPI's
    (--hostfile, --npernode, --bind-to) or another's: MPICH's hydra, Intel MPI's, MVAPICH's (-f, -ppn).
    -> (program, hostfile option, count option, per-node option, bind-to option or "")."""
    found = [name for name in ("mpirun", "mpiexec") if which(name)]
    if not found:
        raise ConfigError("mpirun_config / --mpirun_hostfile: neither mpirun nor mpiexec is on PATH. Install an MPI "
                          "(Open MPI, Intel MPI, MVAPICH, or MPICH: `pip install mpich`) and put its bin folder on "
                          "PATH, or remove mpirun_config to start the processes with torchrun.")
    program = found[0]
    if version is None:
        try:
            version = subprocess.run([program, "--version"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     timeout=60, check=False).stdout
        except (OSError, subprocess.TimeoutExpired) as error:
            raise ConfigError(f"`{program} --version` failed ({error}): tasktrain launch asks it which MPI it is, "
                              "as Accelerate's launcher does. Check the MPI installation on PATH.") from None
    if b"Open MPI" in version:
        return program, "--hostfile", "-n", "--npernode", "--bind-to"
    return program, "-f", "-n", "-ppn", ""


# ---------------------------------------------------------------------------------------------------------------------
# Resolving: file + flags + defaults -> LaunchSettings

def merge(file_values: dict, flags: dict):
    """Raw keys of the file overridden by the flags -> (merged, source of each key)."""
    merged = dict(file_values)
    sources = {key: "file" for key in merged}
    merged["deepspeed_config"] = dict(file_values.get("deepspeed_config") or {})
    for key, value in flags.items():
        if value is None:
            continue
        if key == "deepspeed_config":
            merged["deepspeed_config"].update(value)
            continue
        for other in SAME_SETTING.get(key, ()):
            if sources.get(other) == "file":
                # MULTI_CPU also says "on CPU"; overriding the strategy must not silently move the run to GPUs.
                if other == "distributed_type" and _name(merged[other]).upper() == "MULTI_CPU":
                    merged["use_cpu"], sources["use_cpu"] = True, "file: distributed_type MULTI_CPU"
                del merged[other], sources[other]
        merged[key], sources[key] = value, "flag"
    return merged, sources


def resolve(file_values: dict, flags: Optional[dict] = None, gpu_count: Optional[int] = None,
            config_file: Optional[str] = None) -> LaunchSettings:
    """The whole configuration, checked. gpu_count is how many GPUs this machine has (None: ask torch)."""
    flags = dict(flags or {})
    check_keys(flags, where="the command line")
    merged, sources = merge(file_values, flags)
    if gpu_count is None:
        gpu_count = count_gpus()
    s = LaunchSettings(config_file=config_file)
    env_kind = _name(merged.get("compute_environment"))
    if env_kind is not None and env_kind.upper() != "LOCAL_MACHINE":
        raise ConfigError(
            f"compute_environment: {env_kind!r} is not supported; expected LOCAL_MACHINE. tasktrain launch starts "
            "processes on the machines it runs on: run it on each machine of your cluster instead."
        )
    dist_type = _choice(
        "distributed_type", merged.get("distributed_type"), DISTRIBUTED_TYPES, upper=True,
        hint=" For sharded training use FSDP, or DEEPSPEED with zero_stage 3; for plain data parallel use MULTI_GPU or "
             "MULTI_CPU.",
    )
    _resolve_processes(s, merged, sources, dist_type, gpu_count)
    _resolve_strategy(s, merged, sources, dist_type)
    _resolve_parallelism(s, merged.get("parallelism_config"))
    _resolve_precision(s, merged, sources)
    _resolve_mpirun(s, merged.get("mpirun_config"), sources.get("mpirun_config"), dist_type)

    ga = _integer("gradient_accumulation_steps", merged.get("gradient_accumulation_steps"), minimum=1)
    if ga is not None:
        s.gradient_accumulation_steps, s.sources["gradient_accumulation_steps"] = ga, _source(sources,
                                                                                              "gradient_accumulation_steps")
    s.gpu_ids = _gpu_ids(merged.get("gpu_ids"))
    s.num_cpu_threads_per_process = _integer(
        "num_cpu_threads_per_process", merged.get("num_cpu_threads_per_process"), minimum=1)
    s.debug = bool(_flag("debug", merged.get("debug")))
    for key in merged:
        if key in IGNORED_KEYS or any(str(key).startswith(p) for p in IGNORED_PREFIXES):
            s.ignored.append(key)
    for key in merged["deepspeed_config"]:
        if key in DEEPSPEED_IGNORED_KEYS and s.is_deepspeed:
            s.ignored.append(f"deepspeed_config.{key}")
    _add_notes(s, dist_type, gpu_count, _flag("use_cpu", merged.get("use_cpu")))
    return s


def _source(sources, key, default_reason="default"):
    return sources.get(key, default_reason)


def _resolve_processes(s: LaunchSettings, merged: dict, sources: dict, dist_type, gpu_count: int):
    """Machines, processes, this machine's rank, the rendezvous, and whether it runs on CPU."""
    s.num_machines = _integer("num_machines", merged.get("num_machines"), minimum=1) or 1
    s.sources["num_machines"] = _source(sources, "num_machines")
    explicit_cpu = _flag("use_cpu", merged.get("use_cpu"))
    wants_gpu = dist_type in ("MULTI_GPU", "DEEPSPEED", "FSDP")
    s.use_cpu = bool(explicit_cpu) or dist_type == "MULTI_CPU"
    if explicit_cpu:
        s.sources["use_cpu"] = _source(sources, "use_cpu")
    elif dist_type == "MULTI_CPU":
        s.sources["use_cpu"] = f"{_source(sources, 'distributed_type')}: distributed_type MULTI_CPU"
    else:
        s.sources["use_cpu"] = _source(sources, "use_cpu")
    if not s.use_cpu and gpu_count == 0:
        s.use_cpu = True
        s.sources["use_cpu"] = "no GPU on this machine"

    num_processes = _integer("num_processes", merged.get("num_processes"), minimum=1)
    if num_processes is None:
        per_machine = gpu_count if (wants_gpu and not s.use_cpu and gpu_count > 0) else 1
        num_processes = 1 if dist_type == "NO" else s.num_machines * per_machine
        s.sources["num_processes"] = "default"
    else:
        s.sources["num_processes"] = _source(sources, "num_processes")
    s.num_processes = num_processes
    if s.num_processes % s.num_machines:
        raise ConfigError(
            f"num_processes {s.num_processes} is not divisible by num_machines {s.num_machines}; num_processes is "
            f"the total over all machines and every machine runs the same number. Set num_processes to a multiple "
            f"of {s.num_machines} (for example {_multiples(s.num_processes, s.num_machines)})."
        )
    if s.num_processes < s.num_machines:
        raise ConfigError(
            f"num_processes {s.num_processes} is smaller than num_machines {s.num_machines}; expected at least one "
            "process per machine. num_processes is the total over all machines."
        )
    s.machine_rank = _integer("machine_rank", merged.get("machine_rank"), minimum=0) or 0
    s.sources["machine_rank"] = _source(sources, "machine_rank")
    if s.machine_rank >= s.num_machines:
        raise ConfigError(
            f"machine_rank {s.machine_rank} is out of range for num_machines {s.num_machines}; expected 0 to "
            f"{s.num_machines - 1}. Give each machine its own --machine_rank, 0 on the main machine."
        )
    ip = _name(merged.get("main_process_ip"))
    if s.num_machines > 1 and not ip:
        raise ConfigError(
            f"num_machines is {s.num_machines} but main_process_ip is not set; every machine must know the address "
            "of machine 0. Pass --main_process_ip ADDRESS (the same on every machine) or set it in the file."
        )
    s.main_process_ip = ip or "127.0.0.1"
    s.sources["main_process_ip"] = _source(sources, "main_process_ip")
    s.main_process_port = _integer("main_process_port", merged.get("main_process_port"), minimum=1, maximum=65535)
    s.sources["main_process_port"] = _source(sources, "main_process_port")
    s.rdzv_backend = _choice("rdzv_backend", merged.get("rdzv_backend"), RDZV_BACKENDS) or "static"
    if s.rdzv_backend == "c10d" and s.num_machines > 1:
        s.notes.append("rdzv_backend c10d numbers the machines in the order they join: machine_rank is not used")


def _resolve_mpirun(s: LaunchSettings, mpirun, source: Optional[str], dist_type):
    """Accelerate's `mpirun_config: {mpirun_hostfile: ...}` (`accelerate config`'s "launch mpirun" for MULTI_CPU, or its
    --mpirun_hostfile flag): the script runs through mpirun / mpiexec over the hostfile's machines (mpirun_command,
    mpirun_env), launched once, from one machine. Accelerate takes that path for its CPU launcher only (a GPU, DeepSpeed
    or FSDP launch goes through torchrun there, the hostfile unread): here such a config is an error, as is a hostfile
    that does not exist. An empty mapping asks for nothing (as in Accelerate)."""
    if not mpirun:
        return
    if not isinstance(mpirun, dict) or set(mpirun) - {"mpirun_hostfile"}:
        raise ConfigError(f"mpirun_config is {mpirun!r}, expected a mapping with one key, such as `mpirun_config: "
                          "{mpirun_hostfile: ~/hostfile}` (Accelerate's), or remove the key.")
    given = mpirun.get("mpirun_hostfile")
    where = f"--mpirun_hostfile {given}" if source == "flag" else f"mpirun_config.mpirun_hostfile {given!r}"
    if not given:
        return  # (`mpirun_hostfile: null`: no mpirun, as Accelerate's `if args.mpirun_hostfile is not None`)
    hostfile = os.path.abspath(os.path.expanduser(str(given)))
    if not os.path.isfile(hostfile):
        raise ConfigError(f"{where}: the hostfile {hostfile!r} does not exist. Expected a file listing the machines "
                          "mpirun starts the processes on (one host name or address a line, e.g. `127.0.0.1` for "
                          "this machine). Check the path, or remove mpirun_config to start the processes with "
                          "torchrun.")
    gpu_kind = dist_type in ("MULTI_GPU", "DEEPSPEED", "FSDP") or s.is_deepspeed or \
        STRATEGIES[s.strategy].distributed_type in ("DEEPSPEED", "FSDP") or s.strategy in ONE_PROCESS_STARTS or \
        s.parallelism
    if gpu_kind or not s.use_cpu:
        what = f"distributed_type {dist_type}" if dist_type not in (None, "NO", "MULTI_CPU") else \
            f"strategy {s.strategy}" if s.use_cpu else "use_cpu false on a machine with GPUs"
        raise ConfigError(f"{where} with {what}: Accelerate launches through mpirun for CPU training only (its "
                          "MULTI_CPU launcher; `accelerate config` asks for a hostfile there only), with "
                          "DistributedDataParallel on gloo. Set `distributed_type: MULTI_CPU` and `use_cpu: true` "
                          "(--cpu), or remove mpirun_config (--mpirun_hostfile) to start GPU processes with torchrun, "
                          "running tasktrain launch on each machine.")
    if s.machine_rank:
        raise ConfigError(f"{where} with machine_rank {s.machine_rank}: mpirun starts the processes of every machine "
                          "from one command, run on one machine; running it on each would start the world once per "
                          "machine. Run it on one machine with machine_rank 0 (or remove the key), or remove "
                          "mpirun_config to run tasktrain launch on each machine with torchrun.")
    if s.rdzv_backend != "static":
        s.ignored.append(f"rdzv_backend {s.rdzv_backend} (mpirun starts the processes)")
    s.mpirun_hostfile = hostfile
    s.sources["mpirun_hostfile"] = source or "file"


def _resolve_strategy(s: LaunchSettings, merged: dict, sources: dict, dist_type):
    """`strategy` (ours, more exact) or `distributed_type` (Accelerate's); DeepSpeed's details from deepspeed_config."""
    strategy = _choice("strategy", merged.get("strategy"), STRATEGY_CHOICES)
    if strategy == AUTO_STRATEGY:
        strategy = None
    if strategy and dist_type and sources.get("strategy") == sources.get("distributed_type") \
            and STRATEGIES[strategy].distributed_type != dist_type.replace("MULTI_CPU", "MULTI_GPU"):
        s.notes.append(f"both strategy ({strategy}) and distributed_type ({dist_type}) are set: strategy decides")
    if strategy:
        s.sources["strategy"] = _source(sources, "strategy")
    elif dist_type == "NO" and s.num_processes > 1:
        if sources.get("num_processes") == "flag" and sources.get("distributed_type") == "file":
            strategy = "ddp"
            s.notes.append(f"--num_processes {s.num_processes} overrides distributed_type NO of the file: using ddp")
            s.sources["strategy"] = "flag --num_processes"
        else:
            raise ConfigError(
                f"distributed_type NO runs a single process, but num_processes is {s.num_processes}. Set "
                "distributed_type to MULTI_CPU or MULTI_GPU (or strategy: ddp) to run several, or num_processes: 1."
            )
    elif dist_type is not None:
        strategy = STRATEGY_OF_TYPE[dist_type]
        s.sources["strategy"] = f"{_source(sources, 'distributed_type')}: distributed_type {dist_type}"
    else:
        strategy = "ddp" if s.num_processes > 1 else "single_device"
        s.sources["strategy"] = "default for " + ("several processes" if s.num_processes > 1 else "one process")
    if STRATEGIES[strategy].distributed_type == "NO" and s.num_processes > 1:
        raise ConfigError(
            f"strategy {strategy} runs one process, but num_processes is {s.num_processes}: each process would "
            "train alone on its own copy. Use strategy ddp (or a deepspeed_* strategy), or num_processes 1."
        )
    fsdp = merged.get("fsdp_config") or {}
    if STRATEGIES[strategy].distributed_type == "FSDP":
        kwargs, ignored = _check_fsdp_config(fsdp)
        if kwargs.pop("cpu_offload", False):
            strategy = "fsdp_cpu_offload"
        s.fsdp = kwargs or None  # the other FSDP(...) arguments, for the workers (TASKTRAIN_FSDP)
        s.ignored.extend(f"fsdp_config.{key}" for key in ignored)
    elif "fsdp_config" in merged:
        s.ignored.append("fsdp_config (the strategy is not FSDP)")
    s.strategy = strategy
    ds_raw = merged["deepspeed_config"]
    if STRATEGIES[strategy].distributed_type == "DEEPSPEED":
        s.deepspeed = _deepspeed_kwargs(strategy, ds_raw, s)
    elif ds_raw:
        s.ignored.append("deepspeed_config (the strategy is not DeepSpeed)")


PARALLELISM_KEYS = ("parallelism_config_dp_replicate_size", "parallelism_config_dp_shard_size",
                    "parallelism_config_tp_size", "parallelism_config_cp_size")


def _resolve_parallelism(s: LaunchSettings, values):
    """Accelerate's parallelism_config block (issue 39): the sizes of a (dp_replicate, dp_shard, tp) device mesh. The
    workers get Accelerate's variables (ParallelismConfig() in the script reads them) and the strategy
    model_parallel (a Trainer's: tensor_parallel_size = tp, data parallel over the rest)."""
    if not values:
        return
    if not isinstance(values, dict):
        raise ConfigError(f"parallelism_config is {values!r}, expected a mapping such as `parallelism_config: "
                          "{parallelism_config_dp_shard_size: 2, parallelism_config_tp_size: 2}`.")
    for key in values:
        if key not in PARALLELISM_KEYS:
            raise ConfigError(_unknown("parallelism_config key", key, list(PARALLELISM_KEYS), "the configuration"))
    sizes = {key[len("parallelism_config_"):-len("_size")]: _integer(key, values.get(key), minimum=1) or 1
             for key in PARALLELISM_KEYS}
    if sizes["cp"] > 1 and s.use_cpu:
        raise ConfigError(f"parallelism_config_cp_size: {sizes['cp']}: context parallelism needs CUDA (torch's "
                          "context_parallel shards attention with the GPU attention kernels; on a CPU mesh "
                          "aten._scaled_dot_product_flash_attention_for_cpu has no sharding strategy), and this "
                          "launch runs on CPU. Use 1.")
    total = sizes["dp_replicate"] * sizes["dp_shard"] * sizes["cp"] * sizes["tp"]
    if total == 1:
        return
    if total != s.num_processes:
        raise ConfigError(f"parallelism_config: dp_replicate_size x dp_shard_size x cp_size x tp_size = {total}, but "
                          f"num_processes is {s.num_processes}. Make the product the number of processes.")
    if sizes["dp_replicate"] > 1 and sizes["dp_shard"] == 1:
        raise ConfigError("parallelism_config: dp_replicate_size > 1 with dp_shard_size 1 is pure data parallelism "
                          "(or, with tp_size > 1, a combination Accelerate refuses): set dp_shard_size > 1, or drop "
                          "parallelism_config and use distributed_type MULTI_CPU / MULTI_GPU.")
    if s.is_deepspeed:
        raise ConfigError("parallelism_config beside DeepSpeed: tensor parallelism runs on FSDP2 here; drop "
                          "deepspeed_config or parallelism_config.")
    s.parallelism = {"dp_replicate": sizes["dp_replicate"], "dp_shard": sizes["dp_shard"], "tp": sizes["tp"],
                     "cp": sizes["cp"]}
    s.strategy = "model_parallel"
    if s.fsdp:  # said, not dropped: fully_shard over the data-parallel dimensions is the mesh strategy's own
        s.ignored.append(f"fsdp_config options {sorted(s.fsdp)} (parallelism_config's strategy model_parallel "
                         "applies FSDP2 itself)")
    s.fsdp = None
    s.notes.append(f"parallelism_config: a (dp_replicate={sizes['dp_replicate']}, dp_shard={sizes['dp_shard']}, "
                   f"tp={sizes['tp']}) device mesh: strategy model_parallel (the Accelerator's ParallelismConfig() "
                   "reads these sizes; a Trainer's ModelParallelStrategy gets tensor_parallel_size="
                   f"{sizes['tp']} and data_parallel_replicate_size={sizes['dp_replicate']}: HSDP when it is > 1)")


def _resolve_precision(s: LaunchSettings, merged: dict, sources: dict):
    """`precision` is ours and more exact; mixed_precision is Accelerate's spelling."""
    if merged.get("precision") is not None:
        s.precision = _precision(merged["precision"])
        s.sources["precision"] = _source(sources, "precision")
        if merged.get("mixed_precision") is not None:
            s.notes.append(f"precision {s.precision} is used; mixed_precision is ignored")
    elif merged.get("mixed_precision") is not None:
        mp = _choice("mixed_precision", merged["mixed_precision"], tuple(MIXED_PRECISION),
                     hint=" fp8 is not supported.")
        s.precision = MIXED_PRECISION[mp]
        s.sources["precision"] = f"{_source(sources, 'mixed_precision')}: mixed_precision {mp}"
    else:
        s.sources["precision"] = "default"
    if s.is_deepspeed and s.precision in ("bf16-true", "16-true"):
        # The strategy refuses it too, in every worker: said once here, before anything starts.
        raise ConfigError(f"precision {s.precision} (parameters stored in half, no fp32 master copy) is not available "
                          "under DeepSpeed: its bf16/fp16 modes keep fp32 master weights. Use precision "
                          f"{s.precision.replace('true', 'mixed')} (or mixed_precision "
                          f"{'bf16' if s.precision.startswith('bf16') else 'fp16'}).")


def _add_notes(s: LaunchSettings, dist_type, gpu_count: int, explicit_cpu):
    """Things worth saying before anything starts."""
    wants_gpu = dist_type in ("MULTI_GPU", "DEEPSPEED", "FSDP")
    if wants_gpu and gpu_count == 0 and explicit_cpu is not True:
        s.notes.append(
            f"distributed_type {dist_type} asks for GPUs but this machine has none: starting "
            f"{s.nproc_per_node} CPU process(es) per machine on gloo instead (TASKTRAIN_USE_CPU=1)"
        )
    if gpu_count and not s.use_cpu and wants_gpu and s.nproc_per_node > gpu_count:
        s.notes.append(f"{s.nproc_per_node} processes per machine but only {gpu_count} GPU(s): some will share one")
    if s.debug and s.use_cpu:
        s.notes.append("debug: TASKTRAIN_DEBUG_COLLECTIVES=1 only; TORCH_DISTRIBUTED_DEBUG=DETAIL is left unset on "
                       "CPU, where torch 2.13's DistributedDataParallel crashes (SIGSEGV) when built under it on gloo")
    if s.use_cpu and s.precision == "16-mixed":
        s.notes.append("fp16 on CPU is usually much slower than fp32; bf16 is the fast mixed precision on CPU")
        if s.is_deepspeed:
            s.notes.append("DeepSpeed rejects fp16 on CPU ('Type fp16 is not supported'): use mixed_precision bf16")
    if s.num_machines > 1 and s.main_process_port is None:
        s.notes.append(f"no main_process_port given: using {DEFAULT_PORT} (the same must be used on every machine)")


def _multiples(n, m):
    lower, upper = (n // m) * m, (n // m + 1) * m
    return f"{lower} or {upper}" if lower else str(upper)


def _deepspeed_kwargs(strategy: str, ds: dict, s: LaunchSettings) -> dict:
    config_file = _name(ds.get("deepspeed_config_file"))
    if config_file and config_file.lower() == "none":
        config_file = None
    file_stage = None
    if config_file:
        config_file = os.path.abspath(os.path.expanduser(config_file))
        if not os.path.isfile(config_file):
            raise ConfigError(
                f"deepspeed_config_file {config_file!r} does not exist; expected a DeepSpeed JSON config. "
                "Check the path (it is relative to the directory you launch from)."
            )
        try:
            with open(config_file) as f:
                file_stage = (json.load(f).get("zero_optimization") or {}).get("stage")
        except (ValueError, AttributeError):
            raise ConfigError(f"deepspeed_config_file {config_file!r} is not a JSON object; fix the file.") from None

    named = STRATEGIES[strategy].kwargs  # what the strategy's name says (deepspeed_stage_3_offload: stage 3, ...)
    named_stage = named.get("stage")
    stage = _integer("deepspeed_config.zero_stage", ds.get("zero_stage"), minimum=0, maximum=3)
    if named_stage is not None:
        if stage is not None and stage != named_stage:
            s.notes.append(f"strategy {strategy} sets ZeRO stage {named_stage}; zero_stage {stage} is ignored")
        stage = named_stage
    if stage is None:
        stage = _integer("zero_optimization.stage", file_stage, minimum=0, maximum=3)
    if stage is None:
        stage = 2  # DeepSpeed's and Accelerate's usual choice

    offload_opt = _offload("deepspeed_config.offload_optimizer_device", ds.get("offload_optimizer_device"))
    offload_param = _offload("deepspeed_config.offload_param_device", ds.get("offload_param_device"))
    named_device = named.get("offload_device", "cpu")  # deepspeed_stage_3_offload_nvme: to disk
    if named.get("offload_optimizer"):
        offload_opt = named_device
    if named.get("offload_parameters"):
        offload_param = named_device
    if offload_param == "cpu" and stage != 3:
        s.notes.append(f"offload_param_device cpu only applies at zero_stage 3 (this is stage {stage}): not offloading")
        offload_param = "none"
    if "nvme" in (offload_opt, offload_param) and stage != 3:
        # DeepSpeed 0.19.8 ignores parameter offload below stage 3 and keeps an "nvme" optimizer offload in memory.
        raise ConfigError(f"offload to nvme (disk) needs zero_stage 3; this config runs stage {stage}. Set "
                          "deepspeed_config.zero_stage: 3, or offload to cpu.")
    nvme_path = None
    for device, key in ((offload_opt, "offload_optimizer_nvme_path"), (offload_param, "offload_param_nvme_path")):
        path = _name(ds.get(key))
        if path is not None and path.lower() == "none":
            path = None
        if device == "nvme" and path is None and not config_file:
            raise ConfigError(f"deepspeed_config.{key.replace('_nvme_path', '_device')} is nvme (offload to disk), "
                              f"which needs a folder for the swap files: set deepspeed_config.{key} (a folder on a "
                              "local disk).")
        if path is not None and device != "nvme":
            s.notes.append(f"{key} is not used: {key.replace('_nvme_path', '_device')} is {device}, not nvme")
            continue
        if path is not None:
            path = os.path.abspath(os.path.expanduser(path))
            if nvme_path not in (None, path):
                raise ConfigError("offload_optimizer_nvme_path and offload_param_nvme_path name two folders; tasktrain "
                                  "swaps both offloads into one (DeepSpeed keeps their files apart inside it): give "
                                  "both the same folder.")
            nvme_path = path

    kwargs = {
        "stage": stage,
        # True: to CPU memory (DeepSpeed(offload_device="cpu")); "nvme": to disk; False: none
        "offload_optimizer": "nvme" if offload_opt == "nvme" else offload_opt == "cpu",
        "offload_parameters": "nvme" if offload_param == "nvme" else offload_param == "cpu",
        "zero3_init": bool(_flag("deepspeed_config.zero3_init_flag", ds.get("zero3_init_flag"))),
        "save_16bit_model": bool(_flag("deepspeed_config.zero3_save_16bit_model", ds.get("zero3_save_16bit_model"))),
        "config": config_file,
    }
    if nvme_path is not None:
        kwargs["nvme_path"] = nvme_path
    s.strategy = deepspeed_name(stage, kwargs["offload_optimizer"], kwargs["offload_parameters"], nvme_path)

    ga = _integer("deepspeed_config.gradient_accumulation_steps", ds.get("gradient_accumulation_steps"), minimum=1)
    if ga is not None:
        s.gradient_accumulation_steps, s.sources["gradient_accumulation_steps"] = ga, "deepspeed_config"
    clip = _number("deepspeed_config.gradient_clipping", ds.get("gradient_clipping"))
    if clip is not None:
        s.gradient_clipping, s.sources["gradient_clipping"] = clip, "deepspeed_config"
    return kwargs


def _device_name(offload):
    """DeepSpeed(offload_...=) as Accelerate's device name: True/"cpu" -> cpu, "nvme", False -> none."""
    return offload if offload in ("cpu", "nvme") else "cpu" if offload else "none"


def _offload(key, value):
    # `offload_param_device: no` (YAML: False) means no offload, like `none`.
    return "none" if value is False else _choice(key, value, OFFLOAD_DEVICES)


def count_gpus() -> int:
    import torch  # here, not at the top: reading and checking a file must not pay for torch
    return torch.cuda.device_count()


def load_config(path: Optional[str] = None, flags: Optional[dict] = None,
                gpu_count: Optional[int] = None) -> LaunchSettings:
    """Read `path` (or nothing when None) and resolve it with the command-line `flags`."""
    values = read_config_file(path) if path else {}
    return resolve(values, flags, gpu_count=gpu_count, config_file=path)


# ---------------------------------------------------------------------------------------------------------------------
# Writing a file (`tasktrain config`): Accelerate's keys, so the same file serves both tools.

def config_values(answers: dict) -> dict:
    """Answers (config keys: num_processes, strategy, mixed_precision, ...) -> the checked YAML mapping."""
    # The file describes the user's choice, not this machine: resolve as if a GPU were present, so that use_cpu
    # stays what was asked and a file written on a CPU login node still means "GPUs" on the cluster.
    return settings_to_values(resolve({}, answers, gpu_count=1))


def settings_to_values(settings: LaunchSettings) -> dict:
    dist_type = STRATEGIES[settings.strategy].distributed_type
    if dist_type == "MULTI_GPU" and settings.use_cpu:
        dist_type = "MULTI_CPU"
    # A strategy that distributed_type alone does not name (ddp_spawn, dp, ...) is written as our own key too.
    plain = settings.is_deepspeed or STRATEGY_OF_TYPE[dist_type] == settings.strategy
    reverse = {v: k for k, v in MIXED_PRECISION.items()}
    several = settings.num_machines > 1
    values = {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": dist_type,
        "mixed_precision": reverse.get(settings.precision),
        "precision": None if settings.precision in reverse else settings.precision,  # 64-true has no Accelerate name
        "num_processes": settings.num_processes,
        "num_machines": settings.num_machines,
        "machine_rank": settings.machine_rank,
        "main_process_ip": settings.main_process_ip if several else None,
        # Written out for several machines: every machine must use the same port.
        "main_process_port": settings.main_process_port or (DEFAULT_PORT if several else None),
        "use_cpu": settings.use_cpu,
        "gpu_ids": settings.gpu_ids or "all",
        "rdzv_backend": settings.rdzv_backend,
        "strategy": None if plain else settings.strategy,
    }
    if dist_type == "FSDP" and STRATEGIES[settings.strategy].cls == "FSDP":  # others (model_parallel): own key
        values["fsdp_config"] = {"fsdp_version": 2,
                                 "fsdp_offload_params": bool(STRATEGIES[settings.strategy].kwargs.get("cpu_offload"))}
        values["strategy"] = None
    if settings.is_deepspeed:
        ds = settings.deepspeed
        values["deepspeed_config"] = {
            "zero_stage": ds["stage"],
            "offload_optimizer_device": _device_name(ds["offload_optimizer"]),
            "offload_param_device": _device_name(ds["offload_parameters"]),
            "zero3_init_flag": ds["zero3_init"],
            "zero3_save_16bit_model": ds["save_16bit_model"],
        }
        if ds.get("config"):
            values["deepspeed_config"]["deepspeed_config_file"] = ds["config"]
        for key, device in (("offload_optimizer_nvme_path", ds["offload_optimizer"]),
                            ("offload_param_nvme_path", ds["offload_parameters"])):
            if device == "nvme" and ds.get("nvme_path"):
                values["deepspeed_config"][key] = ds["nvme_path"]
        if settings.gradient_clipping is not None:
            values["deepspeed_config"]["gradient_clipping"] = settings.gradient_clipping
    if settings.gradient_accumulation_steps is not None:
        values["gradient_accumulation_steps"] = settings.gradient_accumulation_steps
    return {k: v for k, v in values.items() if v is not None}


def write_config(values: dict, path: str) -> str:
    """Write a config file atomically (a crash never leaves half a file under the real name)."""
    path = os.path.abspath(os.path.expanduser(path))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        yaml.safe_dump(values, f, sort_keys=False)
    os.replace(tmp, path)
    return path


def yaml_text(values: dict) -> str:
    return yaml.safe_dump(values, sort_keys=False)


def ask_questions(ask=input, gpu_count: int = 0) -> dict:
    """The interactive `tasktrain config`: one question per setting, Enter keeps the default in brackets."""
    answers = {}
    machines = _ask(ask, "How many machines?", 1, lambda t: _integer("num_machines", t, minimum=1))
    answers["num_machines"] = machines
    if machines > 1:
        answers["machine_rank"] = _ask(ask, "Rank of this machine (0 on the main one)?", 0,
                                       lambda t: _integer("machine_rank", t, minimum=0, maximum=machines - 1))
        answers["main_process_ip"] = _ask(ask, "Address of machine 0 (the same on every machine)?", None, _address)
        answers["main_process_port"] = _ask(ask, "Port on machine 0?", DEFAULT_PORT,
                                            lambda t: _integer("main_process_port", t, minimum=1, maximum=65535))
    use_cpu = _ask(ask, "Train on CPU only (yes/no)?", "yes" if gpu_count == 0 else "no",
                   lambda t: _flag("use_cpu", t))
    answers["use_cpu"] = use_cpu
    per_machine = gpu_count if (gpu_count and not use_cpu) else 1
    processes = _ask(ask, "How many processes in total, over all machines?", machines * per_machine,
                     lambda t: _integer("num_processes", t, minimum=1))
    answers["num_processes"] = processes
    choices = [name for name in STRATEGIES if name != "deepspeed"]
    answers["strategy"] = _ask(ask, f"Strategy ({', '.join(choices)})?", "ddp" if processes > 1 else "single_device",
                               lambda t: _choice("strategy", t, tuple(choices)))
    default_mp = "no"
    answers["mixed_precision"] = _ask(
        ask, "Mixed precision (no, fp16, bf16; on CPU bf16 is the fast one)?", default_mp,
        lambda t: _choice("mixed_precision", t, tuple(MIXED_PRECISION)))
    return answers


def _address(text):
    if not text.strip():
        raise ConfigError("an address is needed, for example 10.0.0.1 or node001")
    return text.strip()


def _ask(ask, question, default, convert):
    while True:
        text = ask(f"{question} [{'' if default is None else default}]: ").strip()
        if not text and default is not None:
            return convert(str(default))
        try:
            return convert(text)
        except ConfigError as e:
            print(f"  {e}")
