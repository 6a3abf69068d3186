"""`tasktrain launch`, `tasktrain config`, `tasktrain env` and the launch YAML schema.

The launch tests run the real command in a subprocess (which runs torch.distributed.run) and check the world the
workers formed from the files tests/launch_worker.py writes. Every subprocess runs in its own session and is
killed with its workers when it overruns; addresses are loopback only, ports are chosen at run time.
"""
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from tasktrain.cli import config as cfg
from tasktrain.cli.config import ConfigError, load_config, resolve
from tasktrain.cli.main import build_parser, launch_flags

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
WORKER = os.path.join(HERE, "launch_worker.py")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def clean_env(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TASKTRAIN_", "MASTER_", "RANK", "WORLD_SIZE"))}
    env["TASKTRAIN_CONFIG_DIR"] = str(tmp_path / "config_dir")  # never the developer's own default config
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def start(args, tmp_path, command="launch"):
    return subprocess.Popen(
        [sys.executable, "-m", "tasktrain.cli.main", command, *args], cwd=tmp_path, env=clean_env(tmp_path),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )


def finish(procs, timeout):
    """Wait for all; on timeout kill every launcher with its workers (their own session) and fail."""
    outputs, deadline = [], time.monotonic() + timeout
    try:
        for p in procs:
            outputs.append(p.communicate(timeout=max(0.1, deadline - time.monotonic()))[0])
    except subprocess.TimeoutExpired:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.communicate()
        pytest.fail(f"tasktrain launch did not finish within {timeout} s")
    return outputs


def run_cli(args, tmp_path, command="launch", timeout=75):
    p = start(args, tmp_path, command)
    output = finish([p], timeout)[0]
    return p.returncode, output


def results(out_dir, world):
    files = sorted(f for f in os.listdir(out_dir) if f.endswith(".json"))
    assert len(files) == world, (files, world)
    return [json.load(open(os.path.join(out_dir, f"rank{r}.json"))) for r in range(world)]


def expected_sgd_weights(world):
    """What tests/launch_worker.py's averaged-gradient SGD step must give, computed in one process."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    x = torch.cat([torch.arange(6, dtype=torch.float32).reshape(2, 3) + r for r in range(world)])
    model(x).pow(2).mean().backward()
    torch.optim.SGD(model.parameters(), lr=0.01).step()
    return model.weight.detach().flatten().tolist() + model.bias.detach().tolist()


def check_world(seen, world):
    assert [s["rank"] for s in seen] == list(range(world))
    assert all(s["world_size"] == world for s in seen)
    # Every rank holds the same weights, and they are those of one step on all the data.
    first = seen[0]["weight"] + seen[0]["bias"]
    assert all(s["weight"] + s["bias"] == first for s in seen)
    assert first == pytest.approx(expected_sgd_weights(world), rel=1e-5, abs=1e-6)


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


ACCELERATE_MULTI_CPU = """\
    compute_environment: LOCAL_MACHINE
    debug: false
    distributed_type: MULTI_CPU
    downcast_bf16: 'no'
    enable_cpu_affinity: false
    gpu_ids: all
    machine_rank: 0
    main_training_function: main
    mixed_precision: bf16
    num_machines: 1
    num_processes: 2
    rdzv_backend: static
    same_network: true
    tpu_env: []
    tpu_use_cluster: false
    tpu_use_sudo: false
    use_cpu: true
"""

ACCELERATE_MULTI_GPU = """\
    compute_environment: LOCAL_MACHINE
    debug: false
    distributed_type: MULTI_GPU
    downcast_bf16: 'no'
    gpu_ids: all
    machine_rank: 0
    main_training_function: main
    mixed_precision: no
    num_machines: 1
    num_processes: 2
    rdzv_backend: static
    same_network: true
    tpu_env: []
    tpu_use_cluster: false
    tpu_use_sudo: false
    use_cpu: false
"""

ACCELERATE_DEEPSPEED_ZERO3 = """\
    compute_environment: LOCAL_MACHINE
    debug: false
    deepspeed_config:
      gradient_accumulation_steps: 4
      gradient_clipping: 1.0
      offload_optimizer_device: cpu
      offload_param_device: cpu
      zero3_init_flag: true
      zero3_save_16bit_model: true
      zero_stage: 3
      deepspeed_multinode_launcher: standard
    distributed_type: DEEPSPEED
    downcast_bf16: 'no'
    machine_rank: 0
    main_training_function: main
    mixed_precision: bf16
    num_machines: 1
    num_processes: 2
    rdzv_backend: static
    same_network: true
    tpu_env: []
    tpu_use_cluster: false
    tpu_use_sudo: false
    use_cpu: false
"""


# ---------------------------------------------------------------------------------------------------------------------
# Launches (each starts real processes)

@pytest.fixture(scope="module")
def multi_cpu_launch(tmp_path_factory):
    """One launch of Accelerate's MULTI_CPU config (2 processes, bf16) for two tests: the workers form the world and
    check it, then train with Trainer(strategy="auto") in the same processes and process group
    (launch_worker.py's world+trainer): a launcher and two workers (~10 s of CPU) fewer than a launch each."""
    tmp_path = tmp_path_factory.mktemp("multi_cpu")
    config = write(tmp_path, "multi_cpu.yaml", ACCELERATE_MULTI_CPU)
    # Script arguments that look like launcher flags belong to the script.
    code, output = run_cli(["--config_file", config, WORKER, str(tmp_path), "world+trainer", "--num_processes", "9"],
                           tmp_path, timeout=110)
    return tmp_path, code, output


@pytest.mark.timeout(130)
@pytest.mark.world_size(2)
def test_multi_cpu_two_processes_form_one_world(multi_cpu_launch):
    tmp_path, code, output = multi_cpu_launch
    assert code == 0, output
    assert output.count("tasktrain launch: resolved configuration") == 1
    assert "ignored (do not apply to tasktrain launch): downcast_bf16, enable_cpu_affinity" in output
    seen = results(tmp_path, 2)
    check_world(seen, 2)
    for s in seen:
        assert s["argv"] == [str(tmp_path), "world+trainer", "--num_processes", "9"]
        assert s["env"]["TASKTRAIN_LAUNCH"] == "1"
        assert s["env"]["TASKTRAIN_STRATEGY"] == "ddp"
        assert s["env"]["TASKTRAIN_PRECISION"] == "bf16-mixed"
        assert s["env"]["TASKTRAIN_USE_CPU"] == "1"
        assert s["env"]["TASKTRAIN_NUM_PROCESSES"] == "2"
        assert s["env"]["TASKTRAIN_NUM_MACHINES"] == "1"
        assert "TASKTRAIN_DEEPSPEED" not in s["env"]


@pytest.mark.timeout(100)
@pytest.mark.world_size(2)
def test_multi_gpu_config_on_a_machine_without_gpus_runs_cpu_processes(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has GPUs: the CPU fallback does not apply")
    config = write(tmp_path, "multi_gpu.yaml", ACCELERATE_MULTI_GPU)
    code, output = run_cli(["--config_file", config, WORKER, str(tmp_path)], tmp_path)
    assert code == 0, output
    assert "asks for GPUs but this machine has none: starting 2 CPU process(es)" in output
    seen = results(tmp_path, 2)
    check_world(seen, 2)  # one world of 2, not two processes that each believe they are alone
    assert all(s["env"]["TASKTRAIN_USE_CPU"] == "1" for s in seen)
    assert all(s["env"]["TASKTRAIN_PRECISION"] == "32-true" for s in seen)  # `mixed_precision: no` is not False


@pytest.mark.timeout(100)
@pytest.mark.world_size(2)
def test_deepspeed_zero3_config_reaches_the_workers(tmp_path):
    config = write(tmp_path, "ds.yaml", ACCELERATE_DEEPSPEED_ZERO3)
    code, output = run_cli(["--config_file", config, WORKER, str(tmp_path)], tmp_path)
    assert code == 0, output
    assert "deepspeed_stage_3_offload" in output
    assert "deepspeed_config.deepspeed_multinode_launcher" in output  # reported as ignored
    seen = results(tmp_path, 2)
    check_world(seen, 2)
    for s in seen:
        assert s["env"]["TASKTRAIN_STRATEGY"] == "deepspeed"
        assert json.loads(s["env"]["TASKTRAIN_DEEPSPEED"]) == {
            "stage": 3, "offload_optimizer": True, "offload_parameters": True,
            "zero3_init": True, "save_16bit_model": True, "config": None,
        }
        assert s["env"]["TASKTRAIN_GRADIENT_ACCUMULATION_STEPS"] == "4"
        assert s["env"]["TASKTRAIN_GRADIENT_CLIPPING"] == "1.0"
        assert s["env"]["TASKTRAIN_PRECISION"] == "bf16-mixed"


def _launch_machines(tmp_path, num_processes):
    port = free_port()
    procs = [
        start(["--num_machines", "2", "--machine_rank", str(rank), "--num_processes", str(num_processes),
               "--main_process_ip", "127.0.0.1", "--main_process_port", str(port), "--use_cpu",
               WORKER, str(tmp_path)], tmp_path)
        for rank in (0, 1)
    ]
    outputs = finish(procs, timeout=80)
    for p, output in zip(procs, outputs):
        assert p.returncode == 0, output
    return results(tmp_path, num_processes)


@pytest.mark.timeout(100)
@pytest.mark.world_size(2)
def test_two_machines_one_process_each_on_loopback(tmp_path):
    seen = _launch_machines(tmp_path, 2)
    check_world(seen, 2)
    assert [s["group_rank"] for s in seen] == [0, 1]
    assert all(s["master_addr"] == "127.0.0.1" for s in seen)
    assert all(s["env"]["TASKTRAIN_NUM_MACHINES"] == "2" for s in seen)


@pytest.mark.timeout(120)
@pytest.mark.world_size(4)
def test_two_machines_two_processes_each_on_loopback(tmp_path):
    seen = _launch_machines(tmp_path, 4)
    check_world(seen, 4)
    assert [s["group_rank"] for s in seen] == [0, 0, 1, 1]
    assert [s["local_rank"] for s in seen] == [0, 1, 0, 1]
    assert all(s["env"]["TASKTRAIN_NUM_PROCESSES"] == "4" for s in seen)


@pytest.mark.timeout(100)
@pytest.mark.world_size(2)
def test_launcher_exits_with_the_failing_workers_code(tmp_path):
    # Rank 1 exits with 3 before importing torch; rank 0 is stopped by the launcher (SIGTERM), which is not the
    # failure to report.
    started = time.monotonic()
    code, output = run_cli(["--num_processes", "2", "--use_cpu", WORKER, str(tmp_path), "fail", "3"], tmp_path)
    assert code == 3, output
    assert time.monotonic() - started < 55  # rank 0 did not sleep its 60 s out


@pytest.mark.timeout(100)
@pytest.mark.world_size(1)
def test_config_command_writes_the_default_file_that_launch_uses(tmp_path):
    code, output = run_cli(["--num_processes", "2", "--mixed_precision", "bf16", "--use_cpu"], tmp_path,
                           command="config")
    assert code == 0, output
    default = tmp_path / "config_dir" / "default_config.yaml"
    assert default.is_file()
    # No --config_file: the default file is used; a flag still beats it (1 process: cheap to run).
    code, output = run_cli(["--num_processes", "1", WORKER, str(tmp_path), "env"], tmp_path)
    assert code == 0, output
    assert f"{default}   [default location]" in output
    (seen,) = results(tmp_path, 1)
    assert seen["env"]["TASKTRAIN_PRECISION"] == "bf16-mixed"  # from the file
    assert seen["env"]["TASKTRAIN_NUM_PROCESSES"] == "1"  # from the flag


@pytest.mark.timeout(130)
@pytest.mark.world_size(2)
def test_trainer_auto_under_launch_trains_with_world_size_two(multi_cpu_launch):
    # (tests/launch_trainer_worker.py, run by the MULTI_CPU launch's workers: 2 CPU processes, bf16, from the config)
    tmp_path, code, output = multi_cpu_launch
    assert code == 0, output
    seen = results(tmp_path / "trainer", 2)
    assert [s["world_size"] for s in seen] == [2, 2]
    assert [s["global_rank"] for s in seen] == [0, 1]
    assert all(s["precision"] == "bf16-mixed" for s in seen)
    assert seen[0]["weights"] == seen[1]["weights"]  # DDP kept the replicas equal
    assert all(s["global_step"] == s["expected_steps"] for s in seen)


# ---------------------------------------------------------------------------------------------------------------------
# The command line itself (cheap)

@pytest.mark.timeout(30)
def test_cli_reports_a_bad_config_and_exits_2(tmp_path):
    config = write(tmp_path, "bad.yaml", "num_process: 2\n")
    code, output = run_cli(["--config_file", config, WORKER], tmp_path)
    assert code == 2
    assert "unknown key 'num_process'" in output and "Did you mean 'num_processes'?" in output
    assert "Traceback" not in output


@pytest.mark.timeout(30)
def test_importing_the_cli_stays_light():
    code = ("import sys, tasktrain.cli.main, tasktrain.cli.config; "
            "heavy = [m for m in ('torch', 'deepspeed', 'tensorboard') if m in sys.modules]; "
            "assert not heavy, heavy")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=30, cwd=ROOT)


@pytest.mark.timeout(60)
def test_env_command_prints_versions_without_importing_deepspeed(tmp_path):
    code = ("import sys; from tasktrain.cli.main import main; rc = main(['env']); "
            "assert 'deepspeed' not in sys.modules; sys.exit(rc)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path,
                       env=clean_env(tmp_path))
    assert p.returncode == 0, p.stderr
    for name in ("tasktrain", "python", "torch", "deepspeed", "devices", "default config"):
        assert any(line.startswith(name) for line in p.stdout.splitlines()), (name, p.stdout)
    assert "not written yet" in p.stdout


def test_launch_flags_become_config_keys():
    args = build_parser().parse_args([
        "launch", "--num-processes", "4", "--use_deepspeed", "--zero_stage", "3", "--cpu",
        "train.py", "--lr", "0.1",
    ])
    assert launch_flags(args) == {
        "num_processes": 4, "use_cpu": True, "distributed_type": "DEEPSPEED", "deepspeed_config": {"zero_stage": 3},
    }
    assert args.script == "train.py" and args.script_args == ["--lr", "0.1"]


def test_convert_has_a_place_in_the_parser():
    from tasktrain.cli import main

    assert callable(main._add_convert)


# ---------------------------------------------------------------------------------------------------------------------
# The schema (in-process, no processes started)

def load(tmp_path, text, flags=None, gpu_count=0):
    return load_config(write(tmp_path, "c.yaml", text), flags, gpu_count=gpu_count)


def test_unknown_key_is_an_error_with_the_closest_key(tmp_path):
    with pytest.raises(ConfigError, match="unknown key 'mixed_precison'.*Did you mean 'mixed_precision'"):
        load(tmp_path, "mixed_precison: bf16\n")
    with pytest.raises(ConfigError, match="unknown deepspeed_config key 'zero_stag'.*Did you mean 'zero_stage'"):
        load(tmp_path, "distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stag: 3\n")


def test_yaml_booleans_are_read_as_the_names_they_spell(tmp_path):
    # YAML 1.1 reads NO / no as False; where a name is expected it means the name.
    s = load(tmp_path, "distributed_type: NO\nmixed_precision: no\ndowncast_bf16: no\nnum_processes: 1\n")
    assert s.strategy == "single_device" and s.precision == "32-true"
    assert s.worker_env()["TASKTRAIN_PRECISION"] == "32-true"
    s = load(tmp_path, "distributed_type: DEEPSPEED\ndeepspeed_config:\n  offload_optimizer_device: no\n")
    assert s.deepspeed["offload_optimizer"] is False


@pytest.mark.parametrize("text, message", [
    ("num_processes: 3\nnum_machines: 2\nmain_process_ip: 10.0.0.1\n", "not divisible by num_machines 2"),
    ("num_processes: 4\nnum_machines: 2\nmachine_rank: 2\nmain_process_ip: 10.0.0.1\n",
     "machine_rank 2 is out of range for num_machines 2; expected 0 to 1"),
    ("num_processes: 2\nnum_machines: 2\n", "main_process_ip is not set"),
    ("num_processes: 0\n", "num_processes: 0 is too small"),
    ("num_processes: two\n", "num_processes: 'two' is not a whole number"),
    ("num_processes: yes\n", "num_processes: True is not a whole number"),
    ("mixed_precision: fp8\n", "mixed_precision: 'fp8' is not supported; expected one of no, fp16, bf16"),
    ("precision: 8-true\n", "precision: '8-true' is not supported"),
    ("distributed_type: XLA\n", "distributed_type: 'XLA' is not supported.*FSDP, or DEEPSPEED with zero_stage 3"),
    ("distributed_type: FSDP\nfsdp_config: {fsdp_version: 1}\n", "fsdp_version: 1.*FSDP2.*fsdp_version: 2"),
    ("distributed_type: FSDP\nfsdp_config: {fsdp_state_dict_type: LOCAL_STATE_DICT}\n",
     "fsdp_state_dict_type: 'LOCAL_STATE_DICT'.*SHARDED_STATE_DICT.*FULL_STATE_DICT"),
    ("distributed_type: FSDP\nfsdp_config: {fsdp_auto_wrap_policy: SIZE_BASED_WRAP}\n",
     "fsdp_auto_wrap_policy: 'SIZE_BASED_WRAP'.*TRANSFORMER_BASED_WRAP"),
    ("distributed_type: FSDP\nfsdp_config: {fsdp_offload_param: true}\n", "fsdp_offload_param.*fsdp_offload_params"),
    ("distributed_type: MULTI_GPUS\n", "Did you mean 'MULTI_GPU'"),
    ("strategy: dpp\n", "strategy: 'dpp' is not supported.*Did you mean 'ddp'"),
    ("strategy: single_device\nnum_processes: 2\n", "would train alone"),
    ("distributed_type: NO\nnum_processes: 2\n", "distributed_type NO runs a single process"),
    ("compute_environment: AMAZON_SAGEMAKER\n", "expected LOCAL_MACHINE"),
    ("main_process_port: 70000\n", "main_process_port: 70000 is too large"),
    ("use_cpu: maybe\n", "use_cpu: 'maybe' is not true or false"),
    ("distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 4\n", "zero_stage: 4 is too large"),
    ("distributed_type: DEEPSPEED\ndeepspeed_config:\n  offload_optimizer_device: nvme\n", "needs zero_stage 3"),
    ("distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 3\n  offload_param_device: nvme\n",
     "offload_param_nvme_path"),
    ("distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 3\n  offload_optimizer_device: nvme\n"
     "  offload_param_device: nvme\n  offload_optimizer_nvme_path: /a\n  offload_param_nvme_path: /b\n", "two folders"),
    ("distributed_type: DEEPSPEED\ndeepspeed_config:\n  deepspeed_config_file: missing.json\n", "does not exist"),
    ("- num_processes: 2\n", "expected a mapping"),
    ("num_processes: [\n", "not valid YAML"),
])
def test_invalid_values_say_what_was_wrong_and_what_was_expected(tmp_path, text, message):
    with pytest.raises(ConfigError, match=message):
        load(tmp_path, text)


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="does not exist.*tasktrain config --output"):
        load_config(str(tmp_path / "nope.yaml"), gpu_count=0)


def test_flag_beats_file_beats_default(tmp_path):
    text = "distributed_type: MULTI_CPU\nnum_processes: 4\nmixed_precision: fp16\n"
    s = load(tmp_path, text, flags={"num_processes": 2, "mixed_precision": "bf16"})
    assert (s.num_processes, s.precision, s.strategy, s.num_machines) == (2, "bf16-mixed", "ddp", 1)
    assert s.sources["num_processes"] == "flag" and s.sources["num_machines"] == "default"
    assert s.sources["strategy"] == "file: distributed_type MULTI_CPU"
    # Our `precision` flag overrides the file's Accelerate spelling of the same setting, and vice versa.
    assert load(tmp_path, "precision: 64-true\n", flags={"mixed_precision": "fp16"}).precision == "16-mixed"
    assert load(tmp_path, "mixed_precision: fp16\n", flags={"precision": "bf16-mixed"}).precision == "bf16-mixed"
    # --strategy beats distributed_type; MULTI_CPU still keeps the run on CPU.
    s = load(tmp_path, "distributed_type: MULTI_CPU\nnum_processes: 2\n", flags={"strategy": "deepspeed_stage_2"})
    assert s.deepspeed["stage"] == 2 and s.use_cpu
    # --num_processes on a single-process file means ddp, said in a note.
    s = load(tmp_path, "distributed_type: NO\nnum_processes: 1\n", flags={"num_processes": 2})
    assert s.strategy == "ddp" and any("overrides distributed_type NO" in n for n in s.notes)
    # Defaults.
    s = load(tmp_path, "")
    assert (s.num_processes, s.strategy, s.precision, s.main_process_port) == (1, "single_device", "32-true", None)


@pytest.mark.parametrize("text, name, stage, offload_optimizer, offload_parameters", [
    ("strategy: deepspeed_stage_1\n", "deepspeed_stage_1", 1, False, False),
    ("strategy: deepspeed_stage_2_offload\n", "deepspeed_stage_2_offload", 2, True, False),
    ("strategy: deepspeed_stage_3_offload\n", "deepspeed_stage_3_offload", 3, True, True),
    ("distributed_type: DEEPSPEED\n", "deepspeed_stage_2", 2, False, False),
    ("distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 2\n  offload_optimizer_device: cpu\n",
     "deepspeed_stage_2_offload", 2, True, False),
    ("distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 3\n  offload_optimizer_device: cpu\n",
     "deepspeed", 3, True, False),
    # Parameter offload exists only at stage 3 (DeepSpeed silently ignores it at stage 2): said, not passed on.
    ("distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 2\n  offload_param_device: cpu\n",
     "deepspeed_stage_2", 2, False, False),
    # Offload to disk (Accelerate's keys): the folder goes to the strategy; one offload may stay in memory
    ("distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 3\n  offload_optimizer_device: nvme\n"
     "  offload_param_device: nvme\n  offload_optimizer_nvme_path: /swap\n  offload_param_nvme_path: /swap\n",
     "deepspeed", 3, "nvme", "nvme"),
    ("distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 3\n  offload_optimizer_device: nvme\n"
     "  offload_param_device: cpu\n  offload_optimizer_nvme_path: /swap\n", "deepspeed", 3, "nvme", True),
])
def test_deepspeed_choices_map_to_stage_and_offload(tmp_path, text, name, stage, offload_optimizer,
                                                    offload_parameters):
    s = load(tmp_path, "num_processes: 2\n" + text)
    assert s.strategy == name
    assert (s.deepspeed["stage"], s.deepspeed["offload_optimizer"], s.deepspeed["offload_parameters"]) == (
        stage, offload_optimizer, offload_parameters)
    env = s.worker_env()
    assert env["TASKTRAIN_STRATEGY"] == "deepspeed" and json.loads(env["TASKTRAIN_DEEPSPEED"]) == s.deepspeed
    if "nvme" in (offload_optimizer, offload_parameters):
        assert s.deepspeed["nvme_path"] == "/swap"
        from tasktrain.strategies.registry import strategy_from_name

        zero = strategy_from_name("deepspeed", **s.deepspeed).resolved_config(4)["zero_optimization"]
        assert zero["offload_optimizer"]["nvme_path"] == "/swap" and zero["offload_optimizer"]["device"] == "nvme"
        assert zero["offload_param"]["device"] == ("cpu" if offload_parameters is True else offload_parameters)
        back = load_config(cfg.write_config(cfg.settings_to_values(s), str(tmp_path / "back.yaml")), gpu_count=0)
        assert back.deepspeed == s.deepspeed  # `tasktrain config` writes the same keys back


def test_the_launcher_accepts_every_name_the_library_does(tmp_path):
    """One table of names (tasktrain/names.py): every strategy and precision alias the Trainer takes is a valid
    launch value, and a config written for it reads back as the same choice."""
    from tasktrain.names import PRECISION_ALIASES, STRATEGIES
    from tasktrain.strategies.precision import normalize_precision

    for alias, name in PRECISION_ALIASES.items():
        assert load(tmp_path, f"precision: {json.dumps(alias)}\n").precision == name == normalize_precision(alias)
    for name, entry in STRATEGIES.items():
        processes = 1 if entry.distributed_type == "NO" else 2
        if entry.kwargs.get("offload_device") == "nvme":  # offload to disk: the name needs its folder
            with pytest.raises(ConfigError, match="offload_optimizer_nvme_path"):
                load(tmp_path, f"strategy: {name}\nnum_processes: 2\n")
            s = load(tmp_path, f"strategy: {name}\nnum_processes: 2\ndeepspeed_config:\n"
                               "  offload_optimizer_nvme_path: /swap\n  offload_param_nvme_path: /swap\n")
            assert s.deepspeed["offload_optimizer"] == s.deepspeed["offload_parameters"] == "nvme", name
            assert s.deepspeed["stage"] == 3 and s.deepspeed["nvme_path"] == "/swap", name
            continue
        s = load(tmp_path, f"strategy: {name}\nnum_processes: {processes}\n")
        assert s.strategy == name or (entry.distributed_type == "DEEPSPEED" and s.is_deepspeed), name
        if entry.distributed_type == "DEEPSPEED":
            assert s.deepspeed["stage"] == entry.kwargs.get("stage", 2), name  # the stage read from the table
        back = load_config(cfg.write_config(cfg.config_values({"strategy": name, "num_processes": processes}),
                                            str(tmp_path / f"{name}.yaml")), gpu_count=1)
        assert back.strategy == s.strategy and not any("strategy decides" in n for n in back.notes), name
    with pytest.raises(ConfigError, match="strategy dp runs one process"):
        load(tmp_path, "strategy: dp\nnum_processes: 2\n")


def test_deepspeed_config_file_is_passed_and_its_stage_read(tmp_path):
    (tmp_path / "ds.json").write_text(json.dumps({"zero_optimization": {"stage": 3}}))
    s = load(tmp_path, f"distributed_type: DEEPSPEED\ndeepspeed_config:\n  deepspeed_config_file: {tmp_path}/ds.json\n")
    assert s.deepspeed["stage"] == 3 and s.deepspeed["config"] == str(tmp_path / "ds.json")


def test_ignored_keys_are_reported_and_do_nothing(tmp_path):
    text = ("fsdp_config: {}\nmegatron_lm_config: {}\ndynamo_backend: 'NO'\ntpu_name: x\nsame_network: true\n"
            "num_processes: 2\ndistributed_type: MULTI_CPU\ndeepspeed_config: {zero_stage: 3}\n")
    s = load(tmp_path, text)
    assert s.strategy == "ddp"
    for key in ("fsdp_config (the strategy is not FSDP)", "megatron_lm_config", "dynamo_backend", "tpu_name", "same_network",
                "deepspeed_config (the strategy is not DeepSpeed)"):
        assert key in s.ignored
    assert "ignored (do not apply to tasktrain launch)" in s.describe()


def _accelerates_mpirun_launch(config_path, script_args):
    """Accelerate 1.15's own command and environment for `accelerate launch --config_file CONFIG train.py ARGS`
    (its _validate_launch_command, then prepare_simple_launcher_cmd_env: the simple launcher's mpirun branch)."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_simple_launcher_cmd_env

    args = launch_command_parser().parse_args(["--config_file", str(config_path), "train.py", *script_args])
    args = _validate_launch_command(args)[0]
    return prepare_simple_launcher_cmd_env(args)


def _set(env):
    return {key: value for key, value in env.items() if os.environ.get(key) != value}


@pytest.mark.parametrize("mpi, text", [
    ("mpich", "distributed_type: MULTI_CPU\nuse_cpu: true\nnum_processes: 2\nnum_machines: 1\nmain_process_port: "
              "29511\nmixed_precision: 'no'\nrdzv_backend: static\nmpirun_config:\n  mpirun_hostfile: hosts\n"),
    ("openmpi", "distributed_type: MULTI_CPU\nuse_cpu: true\nnum_processes: 4\nnum_machines: 2\nmain_process_ip: "
                "node-a\nmain_process_port: 29512\nmixed_precision: bf16\ndebug: true\nmpirun_config:\n  "
                "mpirun_hostfile: hosts\n"),
])
def test_mpirun_config_launches_accelerates_mpirun_command_with_its_variables(tmp_path, monkeypatch, mpi, text):
    """`accelerate config`'s "launch mpirun" (mpirun_config.mpirun_hostfile): the command and the variables tasktrain
    launch builds are the ones Accelerate's own builder (prepare_simple_launcher_cmd_env) makes of the same file, for
    MPICH's hydra (the mpirun of requirements-dev.txt's wheel: -f, -ppn) and for Open MPI (a stand-in mpirun whose
    --version says so: --hostfile, --npernode, --bind-to socket); tasktrain's TASKTRAIN_* variables besides, and not
    Accelerate's ACCELERATE_DYNAMO_* (dynamo_backend is no launch setting here)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "hosts").write_text("127.0.0.1\n")
    path = write(tmp_path, "c.yaml", text)
    bin_dir = os.path.dirname(sys.executable)
    if mpi == "openmpi":
        bin_dir = str(tmp_path / "bin")
        os.mkdir(bin_dir)
        with open(os.path.join(bin_dir, "mpirun"), "w") as f:
            f.write("#!/bin/sh\necho 'mpirun (Open MPI) 4.1.6'\n")
        os.chmod(os.path.join(bin_dir, "mpirun"), 0o755)
    monkeypatch.setenv("PATH", bin_dir + os.pathsep + os.environ["PATH"])
    for name in [k for k in os.environ if k.startswith(("TASKTRAIN_", "ACCELERATE_", "PARALLELISM_CONFIG_"))] + [
            "OMP_NUM_THREADS", "MASTER_ADDR", "MASTER_PORT", "KMP_AFFINITY", "KMP_BLOCKTIME"]:
        monkeypatch.delenv(name, raising=False)
    their_command, their_env = _accelerates_mpirun_launch(path, ["--lr", "1"])

    settings = load_config(path, {}, gpu_count=0)
    command = settings.mpirun_command(cfg.find_mpirun(), "train.py", ["--lr", "1"])
    ours = settings.mpirun_env()
    hostfile = str(tmp_path / "hosts")
    assert command == [hostfile if word == "hosts" else word for word in their_command]  # (the hostfile: absolute)
    if mpi == "mpich":
        assert command == ["mpirun", "-f", hostfile, "-ppn", "2", "-n", "2", sys.executable, "train.py", "--lr", "1"]
    else:
        assert command[:9] == ["mpirun", "--hostfile", hostfile, "--npernode", "2", "-n", "4", "--bind-to", "socket"]
    theirs = _set(their_env)
    assert sorted(key for key in theirs if key.startswith("ACCELERATE_DYNAMO_")) == [
        "ACCELERATE_DYNAMO_BACKEND", "ACCELERATE_DYNAMO_MODE", "ACCELERATE_DYNAMO_USE_DYNAMIC",
        "ACCELERATE_DYNAMO_USE_FULLGRAPH", "ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION"]
    assert {k: v for k, v in _set(ours).items() if not k.startswith("TASKTRAIN_") and v is not None} == {
        k: v for k, v in theirs.items() if not k.startswith("ACCELERATE_DYNAMO_")}
    assert theirs["ACCELERATE_USE_CPU"] == "True" and theirs["MASTER_PORT"] == text.split("port: ")[1][:5]
    assert ours["TASKTRAIN_LAUNCH"] == "1" and ours["TASKTRAIN_USE_CPU"] == "1"
    assert ours["TASKTRAIN_NUM_PROCESSES"] == str(settings.num_processes)
    assert f"mpirun_hostfile              {hostfile}   [file]" in settings.describe()


def test_mpirun_hostfile_flag_is_accelerates_too(tmp_path, monkeypatch):
    """--mpirun_hostfile (Accelerate's flag) beside --cpu --num_processes 2: the same launch as the file's key."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "hosts").write_text("127.0.0.1\n")
    args = build_parser().parse_args(["launch", "--mpirun_hostfile", "hosts", "--num_processes", "2", "--cpu", "t.py"])
    s = resolve({}, launch_flags(args), gpu_count=1)
    assert s.mpirun_hostfile == str(tmp_path / "hosts") and s.sources["mpirun_hostfile"] == "flag"
    assert s.mpirun_command(("mpiexec", "-f", "-n", "-ppn", ""), "t.py", module=True, python="py") == [
        "mpiexec", "-f", str(tmp_path / "hosts"), "-ppn", "2", "-n", "2", "py", "-m", "t.py"]
    empty = load(tmp_path, "distributed_type: MULTI_CPU\nnum_processes: 2\nmpirun_config: {}\n")
    assert empty.strategy == "ddp" and empty.mpirun_hostfile is None and "mpirun_config" not in empty.ignored


@pytest.mark.parametrize("text, gpus, words", [
    ("distributed_type: MULTI_CPU\nnum_processes: 2\nmpirun_config: {mpirun_hostfile: nowhere}\n", 0,
     r"^mpirun_config.mpirun_hostfile 'nowhere': the hostfile '.*/nowhere' does not exist\. Expected a file listing"),
    ("distributed_type: MULTI_GPU\nnum_processes: 2\nmpirun_config: {mpirun_hostfile: hosts}\n", 2,
     r"^mpirun_config.mpirun_hostfile 'hosts' with distributed_type MULTI_GPU: Accelerate launches through mpirun "
     r"for CPU training only .*`use_cpu: true`"),
    ("num_processes: 2\nmpirun_config: {mpirun_hostfile: hosts}\n", 2,
     r"with use_cpu false on a machine with GPUs: Accelerate launches through mpirun for CPU training only"),
    ("distributed_type: DEEPSPEED\nuse_cpu: true\nnum_processes: 2\nmpirun_config: {mpirun_hostfile: hosts}\n", 0,
     r"with distributed_type DEEPSPEED: Accelerate launches through mpirun for CPU training only"),
    ("distributed_type: MULTI_CPU\nnum_processes: 4\nnum_machines: 2\nmain_process_ip: a\nmachine_rank: 1\n"
     "mpirun_config: {mpirun_hostfile: hosts}\n", 0, r"with machine_rank 1: mpirun starts the processes of every "
     r"machine from one command"),
    ("distributed_type: MULTI_CPU\nmpirun_config: {hostfile: hosts}\n", 0,
     r"^mpirun_config is \{'hostfile': 'hosts'\}, expected a mapping with one key"),
])
def test_mpirun_config_errors(tmp_path, monkeypatch, text, gpus, words):
    """Where Accelerate's mpirun launch cannot be what was asked: a hostfile that is not there (mpirun's own error
    there), a GPU / DeepSpeed config (Accelerate launches those through torchrun, the hostfile unread), a machine_rank
    (the one mpirun starts every machine), an unknown key: errors before anything starts."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "hosts").write_text("127.0.0.1\n")
    with pytest.raises(ConfigError, match=words):
        load(tmp_path, text, gpu_count=gpus)


def test_mpirun_launch_without_mpirun_on_path_or_with_max_restarts_is_an_error(tmp_path, monkeypatch):
    """No mpirun / mpiexec on PATH: Accelerate's OSError, here a ConfigError naming what to install; --max_restarts
    (torchrun's elastic agent) beside mpirun_config: an error."""
    with pytest.raises(ConfigError, match=r"neither mpirun nor mpiexec is on PATH\. Install an MPI"):
        cfg.find_mpirun(which=lambda name: None)
    assert cfg.find_mpirun(which=lambda name: name == "mpiexec", version=b"HYDRA build details") == (
        "mpiexec", "-f", "-n", "-ppn", "")
    (tmp_path / "hosts").write_text("127.0.0.1\n")
    (tmp_path / "t.py").write_text("")
    proc = start(["--mpirun_hostfile", "hosts", "--cpu", "--num_processes", "2", "--max_restarts", "1", "t.py"],
                 tmp_path)
    out = finish([proc], 60)[0]
    assert proc.returncode == 2 and "--max_restarts 1 with mpirun_config: restarts are torchrun's" in out


def test_accelerate_fsdp_configs(tmp_path):
    """Accelerate's FSDP YAML as written: the keys that mean what tasktrain's FSDP does are used, the ones that do
    nothing here are reported, the others fail (test_invalid_values_say_what_was_wrong_and_what_was_expected)."""
    text = ("distributed_type: FSDP\nnum_processes: 2\nuse_cpu: true\nfsdp_config:\n  fsdp_version: 2\n"
            "  fsdp_offload_params: false\n  fsdp_reshard_after_forward: true\n"
            "  fsdp_state_dict_type: SHARDED_STATE_DICT\n  fsdp_activation_checkpointing: false\n"
            "  fsdp_cpu_ram_efficient_loading: false\n  fsdp_sync_module_states: true\n  fsdp_use_orig_params: true\n")
    s = load(tmp_path, text)
    assert s.strategy == "fsdp" and s.num_processes == 2
    assert "fsdp_config.fsdp_sync_module_states" in s.ignored and "fsdp_config.fsdp_use_orig_params" in s.ignored
    assert s.fsdp == {"reshard_after_forward": True, "state_dict_type": "sharded"}
    s = load(tmp_path, "distributed_type: FSDP\nuse_cpu: true\nfsdp_config: {fsdp_offload_params: true}\n")
    assert s.strategy == "fsdp_cpu_offload" and s.worker_env()["TASKTRAIN_FSDP"] is None
    # The options of FSDP(...) reach the workers (the table FullyShardedDataParallelPlugin uses too).
    s = load(tmp_path, "distributed_type: FSDP\nuse_cpu: true\nfsdp_config:\n  fsdp_reshard_after_forward: false\n"
                       "  fsdp_state_dict_type: FULL_STATE_DICT\n  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n"
                       "  fsdp_transformer_layer_cls_to_wrap: Block,Head\n")
    kwargs = json.loads(s.worker_env()["TASKTRAIN_FSDP"])
    assert kwargs == {"reshard_after_forward": False, "state_dict_type": "full", "wrap": ["Block", "Head"]}
    assert s.strategy_description() == "fsdp (reshard_after_forward=False, state_dict_type='full', wrap={Block, Head})"
    from tasktrain.strategies.environment import launch_config
    from tasktrain.strategies.registry import strategy_of_launch

    strategy = strategy_of_launch(launch_config({**s.worker_env(), "TASKTRAIN_LAUNCH": "1"}))
    assert (strategy.reshard_after_forward, strategy.state_dict_type, strategy.wrap) == (False, "full", ["Block", "Head"])
    with pytest.raises(ConfigError, match=r"fsdp_activation_checkpointing: true needs fsdp_transformer_layer_cls_to_wrap"):
        load(tmp_path, "distributed_type: FSDP\nuse_cpu: true\nfsdp_config: {fsdp_activation_checkpointing: true}\n")
    with pytest.raises(ConfigError, match="TRANSFORMER_BASED_WRAP needs fsdp_transformer_layer_cls_to_wrap"):
        load(tmp_path, "distributed_type: FSDP\nuse_cpu: true\nfsdp_config: {fsdp_auto_wrap_policy: "
                       "TRANSFORMER_BASED_WRAP}\n")
    with pytest.raises(ConfigError, match="NO_WRAP and fsdp_transformer_layer_cls_to_wrap Block say two things"):
        load(tmp_path, "distributed_type: FSDP\nuse_cpu: true\nfsdp_config: {fsdp_auto_wrap_policy: NO_WRAP, "
                       "fsdp_transformer_layer_cls_to_wrap: Block}\n")


def test_fsdp_config_block_classes_and_activation_checkpointing_reach_the_strategy(tmp_path, monkeypatch):
    """Accelerate's transformer-block wrap and activation checkpointing: the class names travel to the workers
    (TASKTRAIN_FSDP) and become FSDP(wrap=..., activation_checkpointing=...) by name, which a Trainer run with the
    launch config's strategy applies (one process here: the same strategy the workers build)."""
    import torch

    from tasktrain import TaskModule, Trainer
    from tasktrain.strategies.environment import launch_config
    from tasktrain.strategies.registry import strategy_of_launch

    text = ("distributed_type: FSDP\nuse_cpu: true\nnum_processes: 1\nfsdp_config:\n"
            "  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n  fsdp_transformer_layer_cls_to_wrap: Block, Head\n"
            "  fsdp_activation_checkpointing: true\n")
    s = load(tmp_path, text)
    assert s.fsdp == {"wrap": ["Block", "Head"], "activation_checkpointing": ["Block", "Head"]}
    assert "fsdp (wrap={Block, Head}, activation_checkpointing={Block, Head})" in s.describe()
    env = {k: v for k, v in s.worker_env().items() if v is not None}
    strategy = strategy_of_launch(launch_config({**env, "TASKTRAIN_LAUNCH": "1"}))
    assert strategy.wrap == ["Block", "Head"] and strategy.activation_checkpointing == ["Block", "Head"]

    class Block(torch.nn.Linear):
        calls = 0

        def forward(self, x):
            Block.calls += 1
            return super().forward(x)

    class Net(TaskModule):
        def __init__(self):
            super().__init__()
            self.blocks = torch.nn.Sequential(Block(4, 4), Block(4, 4))
            self.out = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            return self.out(self.blocks(batch[0])).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=0.01)

    for key, value in {**env, "TASKTRAIN_LAUNCH": "1"}.items():
        monkeypatch.setenv(key, value)
    trainer = Trainer(max_steps=2, logger=False, enable_progress_bar=False, enable_checkpointing=False)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 4)), batch_size=4)
    trainer.fit(Net(), data)
    assert trainer.strategy.wrapped_names == ["blocks.0", "blocks.1", ""]  # "Head" matches nothing, "Block" does
    assert trainer.strategy.checkpointed_names == ["blocks.0", "blocks.1"] and Block.calls == 2 * 2 * 2
    with pytest.warns(UserWarning, match="strategy='fsdp', so fsdp_config's .* are not used"):
        Trainer(strategy="fsdp", logger=False)


def test_multi_gpu_without_gpus_falls_back_to_cpu_and_says_so(tmp_path):
    s = load(tmp_path, "distributed_type: MULTI_GPU\nnum_processes: 2\n", gpu_count=0)
    assert s.use_cpu and s.worker_env()["TASKTRAIN_USE_CPU"] == "1"
    assert any("this machine has none" in n for n in s.notes)
    s = load(tmp_path, "distributed_type: MULTI_GPU\ngpu_ids: 0,1\n", gpu_count=2)
    assert not s.use_cpu and s.num_processes == 2  # default: one process per GPU
    assert s.worker_env()["CUDA_VISIBLE_DEVICES"] == "0,1" and s.worker_env()["TASKTRAIN_USE_CPU"] == "0"


def test_worker_env_removes_stale_variables_and_maps_extras(tmp_path):
    s = load(tmp_path, "num_processes: 2\ndebug: true\nnum_cpu_threads_per_process: 3\n", gpu_count=2)
    env = s.worker_env()
    assert env["TASKTRAIN_DEEPSPEED"] is None and env["TASKTRAIN_GRADIENT_ACCUMULATION_STEPS"] is None
    assert env["TORCH_DISTRIBUTED_DEBUG"] == "DETAIL" and env["OMP_NUM_THREADS"] == "3"
    assert env["TASKTRAIN_DEBUG_COLLECTIVES"] == "1"  # and tasktrain's own check, with call sites (issue 19)
    # On CPU torch's DETAIL mode crashes DDP (torch 2.13, gloo): only tasktrain's check, and the printout says so.
    cpu = load(tmp_path, "num_processes: 2\ndebug: true\nuse_cpu: true\n", gpu_count=2)
    assert "TORCH_DISTRIBUTED_DEBUG" not in cpu.worker_env() and cpu.worker_env()["TASKTRAIN_DEBUG_COLLECTIVES"] == "1"
    assert any("DETAIL is left unset on CPU" in note for note in cpu.notes)


def test_torchrun_arguments(tmp_path):
    one = load(tmp_path, "num_processes: 2\n").torchrun_args("train.py", ["--lr", "1"])
    assert one == ["--nnodes", "1", "--nproc-per-node", "2",
                   "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:0", "train.py", "--lr", "1"]
    many = load(tmp_path, "num_processes: 8\nnum_machines: 2\nmachine_rank: 1\nmain_process_ip: 10.1.2.3\n")
    assert many.torchrun_args("train.py") == [
        "--nnodes", "2", "--nproc-per-node", "4", "--node-rank", "1",
        "--rdzv-backend", "static", "--master-addr", "10.1.2.3", "--master-port", "29500", "train.py"]
    assert any("29500" in n for n in many.notes)
    c10d = load(tmp_path, "num_processes: 2\nnum_machines: 2\nmain_process_ip: h\nmain_process_port: 1234\n"
                          "rdzv_backend: c10d\n")
    assert c10d.torchrun_args("train", module=True) == [
        "--nnodes", "2", "--nproc-per-node", "1",
        "--rdzv-backend", "c10d", "--rdzv-endpoint", "h:1234", "--rdzv-id", "tasktrain", "--module", "train"]


def test_default_config_location(monkeypatch, tmp_path):
    monkeypatch.delenv("TASKTRAIN_CONFIG_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cfg.default_config_path() == str(tmp_path / "xdg" / "tasktrain" / "default_config.yaml")
    monkeypatch.setenv("TASKTRAIN_CONFIG_DIR", str(tmp_path / "mine"))
    assert cfg.default_config_path() == str(tmp_path / "mine" / "default_config.yaml")
    monkeypatch.delenv("TASKTRAIN_CONFIG_DIR")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cfg.default_config_path() == str(tmp_path / "home" / ".cache" / "tasktrain" / "default_config.yaml")


def test_written_config_reads_back_the_same_and_is_accelerate_shaped(tmp_path):
    for answers in ({"num_processes": 2, "mixed_precision": "bf16"},
                    {"num_processes": 4, "strategy": "deepspeed_stage_3_offload", "use_cpu": True},
                    {"num_processes": 4, "num_machines": 2, "main_process_ip": "10.0.0.1", "machine_rank": 1},
                    {}):
        values = cfg.config_values(answers)
        assert values["compute_environment"] == "LOCAL_MACHINE"
        path = cfg.write_config(values, str(tmp_path / "out" / "c.yaml"))
        text = open(path).read()
        assert "mixed_precision: 'no'" in text or "mixed_precision: bf16" in text  # quoted: YAML would say False
        back = load_config(path, gpu_count=1)
        want = resolve({}, answers, gpu_count=1)
        for name in ("num_processes", "num_machines", "machine_rank", "strategy", "precision", "use_cpu",
                     "deepspeed", "main_process_ip"):
            assert getattr(back, name) == getattr(want, name), (answers, name)


def test_interactive_questions_use_defaults_and_ask_again_on_bad_answers(capsys):
    replies = iter(["2", "1", "", "10.9.8.7", "", "no", "nine", "4", "deepspeed_stage_3", "bf16"])
    answers = cfg.ask_questions(lambda prompt: next(replies), gpu_count=0)
    assert answers == {
        "num_machines": 2, "machine_rank": 1, "main_process_ip": "10.9.8.7", "main_process_port": 29500,
        "use_cpu": False, "num_processes": 4, "strategy": "deepspeed_stage_3", "mixed_precision": "bf16",
    }
    said = capsys.readouterr().out
    assert "an address is needed" in said and "num_processes: 'nine' is not a whole number" in said


def test_worker_env_reads_back_through_launch_config(tmp_path):
    from tasktrain.strategies.environment import launch_config

    s = load(tmp_path, textwrap.dedent(ACCELERATE_DEEPSPEED_ZERO3), gpu_count=0)
    seen = launch_config({k: v for k, v in s.worker_env().items() if v is not None})
    assert seen.launched and seen.strategy == "deepspeed" and seen.deepspeed == s.deepspeed
    assert (seen.precision, seen.use_cpu, seen.num_processes, seen.num_machines) == ("bf16-mixed", True, 2, 1)
    assert (seen.gradient_accumulation_steps, seen.gradient_clipping) == (4, 1.0)


def test_true_half_precision_in_a_launch_config(tmp_path):
    """bf16-true / 16-true are our names (Accelerate has none): `precision:` takes them for DDP and FSDP, and a
    DeepSpeed config is refused before anything starts, naming the mixed mode DeepSpeed has."""
    for strategy in ("ddp", "fsdp"):
        s = load(tmp_path, f"strategy: {strategy}\nnum_processes: 2\nprecision: bf16-true\n")
        assert s.precision == "bf16-true" and s.worker_env()["TASKTRAIN_PRECISION"] == "bf16-true"
    with pytest.raises(ConfigError, match="precision 16-true .*not available under DeepSpeed.*Use precision 16-mixed"):
        load(tmp_path, "distributed_type: DEEPSPEED\nnum_processes: 2\nprecision: 16-true\n")
