"""The Accelerator under a real MPI launcher, beside Accelerate 1.15's: MPICH's mpiexec (the `mpich` and `mpi4py`
wheels of requirements-dev.txt) starts 2 processes on this machine, with MPI's variables only (PMI_RANK, PMI_SIZE,
MPI_LOCALRANKID, MPI_LOCALNRANKS; no MASTER_ADDR). One launch (tests/mpi_scripts/accelerator_under_mpiexec.py: the
docs' example under tasktrain, then under Accelerate; Accelerator() without cpu=True), gloo on 127.0.0.1, bounded in
time. The variables' rules without a launch (Open MPI's, MVAPICH's, several hosts, torchrun's first) are checked on
join_mpi_world directly.
"""
import json
import os
import subprocess
import sys

import pytest

from ddp_scripts.common import child_env, free_port
from tasktrain.strategies import environment

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SCRIPT = os.path.join(HERE, "mpi_scripts", "accelerator_under_mpiexec.py")
TIMEOUT = 240  # (2 processes importing torch, tasktrain and accelerate on 2 cores: ~30 s; below pytest's 300 s, so
# that mpiexec and its ranks are killed and their output shown)


def _mpiexec():
    path = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if not os.access(path, os.X_OK):
        pytest.fail(f"No mpiexec beside {sys.executable}: `make setup` installs the `mpich` and `mpi4py` wheels "
                    "(requirements-dev.txt) into the venv; or `.venv/bin/python -m pip install -r "
                    "requirements-dev.txt`.")
    return path


@pytest.fixture(scope="module")
def launch(tmp_path_factory):
    out = tmp_path_factory.mktemp("accmpi")
    # MPI's own traffic on the loopback only (hydra's fork launcher on 127.0.0.1, UCX on lo; gloo binds lo too)
    command = [_mpiexec(), "-launcher", "fork", "-hosts", "127.0.0.1", "-iface", "lo", "-n", "2", sys.executable,
               SCRIPT]
    env = child_env(PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]), UCX_NET_DEVICES="lo",
                    GLOO_SOCKET_IFNAME="lo", MASTER_PORT=str(free_port()), SECOND_PORT=str(free_port()))
    for name in ("ACCELERATE_USE_CPU", "OMP_NUM_THREADS"):  # (OMP_NUM_THREADS unset: each rank's share, as Accelerate)
        env.pop(name, None)
    proc = subprocess.Popen(command, cwd=out, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        log = proc.communicate(timeout=TIMEOUT)[0]
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)  # (mpiexec, hydra's proxy and the ranks: one session)
        log = proc.communicate()[0]
        pytest.fail(f"mpiexec did not finish within {TIMEOUT} s:\n{log[-6000:]}")
    assert proc.returncode == 0, log[-6000:]
    return dict(seen=[json.load(open(out / f"rank{rank}.json")) for rank in range(2)], port=env["MASTER_PORT"],
                log=log)


@pytest.mark.world_size(2)
def test_accelerator_cpu_under_mpiexec_forms_accelerates_world_and_trains_as_it(launch):
    """Under `mpiexec -n 2`, the docs' example: tasktrain's Accelerator(cpu=True) and PartialState() report what
    Accelerate's report (process_index, num_processes, local_process_index, MULTI_CPU), set the variables Accelerate
    sets (RANK, ..., MASTER_PORT kept, MASTER_ADDR 127.0.0.1 on one host), form one gloo group of 2, and train the same
    weights on both ranks as Accelerate's Accelerator (gradients averaged: not a rank's own)."""
    seen = launch["seen"]
    for rank, ranks in enumerate(seen):
        ours, theirs = ranks["tasktrain"], ranks["accelerate"]
        assert ours["state"] == theirs["state"] == ours["partial"] == [rank, 2, rank, "MULTI_CPU"]
        # (the device: Accelerate's says cpu:0 under MULTI_CPU, torchrun's world too; tasktrain's cpu: the same device)
        assert ours["accelerator"] == [rank, 2, rank, "MULTI_CPU", "cpu"]
        assert theirs["accelerator"] == [rank, 2, rank, "MULTI_CPU", "cpu:0"]
        assert ours["group"] == theirs["group"] == [rank, 2, "gloo"] and theirs["backend"] == "gloo"
        assert ours["env"] == dict(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2",
                                   MASTER_ADDR="127.0.0.1", MASTER_PORT=launch["port"])
        assert theirs["env"] == dict(ours["env"], MASTER_PORT=theirs["env"]["MASTER_PORT"])
        assert _flat(ours["weights"]) == pytest.approx(_flat(theirs["weights"]), abs=1e-6)
        assert ours["weights"] == seen[0]["tasktrain"]["weights"]  # (the ranks' weights: equal, bit for bit)
    # one process on the global batches of 4 (each step: rank 0's 2 samples and rank 1's next 2, gradients averaged);
    # not what a world of one per process trains (all 8 samples in batches of 2), nor the start
    weights = _flat(seen[0]["tasktrain"]["weights"])
    assert weights == pytest.approx(_flat(_alone_weights((0, 4), size=4)), abs=1e-6)
    assert weights != pytest.approx(_flat(_alone_weights(range(0, 8, 2), size=2)), abs=1e-4)
    assert weights != pytest.approx(_flat(_initial_weights()), abs=1e-3)
    assert "2 processes, MULTI_CPU" in launch["log"]


@pytest.mark.world_size(2)
def test_accelerator_without_cpu_under_mpiexec_is_an_error_where_accelerate_trains_each_rank_alone(launch):
    """Accelerator() without cpu=True under `mpiexec -n 2`: Accelerate's reads no MPI variable (a world of one in each
    process, distributed_type NO); tasktrain's stops every rank, naming cpu=True."""
    for ranks in launch["seen"]:
        assert ranks["accelerate_without_cpu"] == ["NO", 1]
        kind, words = ranks["refused"]
        assert kind == "ValueError"
        assert words.startswith("mpirun / mpiexec started 2 processes (PMI_SIZE=2), but the Accelerator reads MPI's "
                                "ranks only on CPU") and "Accelerator(cpu=True)" in words


def _flat(weights):
    return [value for tensor in weights for value in tensor]


def _docs_model():
    import torch

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    return model, torch.arange(32.0).reshape(8, 4) / 32, torch.arange(8.0).reshape(8, 1) / 8


def _initial_weights():
    return [p.detach().flatten().tolist() for p in _docs_model()[0].parameters()]


def _alone_weights(starts, size):
    """The docs' example trained by one process alone on the batches of `size` starting at `starts`."""
    import torch

    model, x, y = _docs_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for start in starts:
        torch.nn.functional.mse_loss(model(x[start:start + size]), y[start:start + size]).backward()
        optimizer.step()
        optimizer.zero_grad()
    return [p.detach().flatten().tolist() for p in model.parameters()]


@pytest.mark.parametrize("given, place", [
    (dict(PMI_RANK="3", PMI_SIZE="4", MPI_LOCALRANKID="1", MPI_LOCALNRANKS="2"), ["3", "4", "1", "2"]),  # MPICH
    (dict(OMPI_COMM_WORLD_RANK="2", OMPI_COMM_WORLD_SIZE="4", OMPI_COMM_WORLD_LOCAL_RANK="0",
          OMPI_COMM_WORLD_LOCAL_SIZE="2"), ["2", "4", "0", "2"]),  # Open MPI
    (dict(MV2_COMM_WORLD_RANK="1", MV2_COMM_WORLD_SIZE="2", MV2_COMM_WORLD_LOCAL_RANK="1",
          MV2_COMM_WORLD_LOCAL_SIZE="2"), ["1", "2", "1", "2"]),  # MVAPICH
])
def test_mpi_variables_are_read_in_accelerates_order(given, place):
    """Each MPI's variables give torchrun's (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE) as Accelerate's
    get_cpu_distributed_information reads them; MASTER_PORT defaults to 29500, a given MASTER_ADDR is kept."""
    env = dict(given, MASTER_ADDR="node-a", OMP_NUM_THREADS="1")
    environment.join_mpi_world(cpu=True, env=env)
    assert [env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"]] == place
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("node-a", "29500")


def test_mpi_over_several_hosts_without_master_addr_is_accelerates_error():
    env = dict(PMI_RANK="0", PMI_SIZE="4", MPI_LOCALRANKID="0", MPI_LOCALNRANKS="2", OMP_NUM_THREADS="1")
    with pytest.raises(ValueError, match=r"started 4 processes on several hosts \(2 on this one\), but MASTER_ADDR is "
                                         r"not set.*-genv MASTER_ADDR"):
        environment.join_mpi_world(cpu=True, env=env)
    assert "RANK" not in env


@pytest.mark.parametrize("launcher", [dict(RANK="0", WORLD_SIZE="2", LOCAL_RANK="0"), dict(SLURM_PROCID="0"),
                                      dict(PMI_SIZE="1")])
def test_torchruns_slurms_or_a_world_of_one_leave_mpi_unread(launcher):
    """torchrun's variables (or SLURM's) win over MPI's; a world of one is no world to join (and no error without
    cpu=True)."""
    env = dict(dict(PMI_RANK="0", PMI_SIZE="2"), **launcher)
    before = dict(env)
    environment.join_mpi_world(cpu=False, env=env)
    assert env == before


class _Stop(Exception):
    pass


@pytest.mark.parametrize("make, variables, cpu", [
    ("Accelerator()", {}, False),
    ("Accelerator(cpu=True)", {}, True),
    ("Accelerator()", {"ACCELERATE_USE_CPU": "1"}, True),  # (what `accelerate launch --cpu` sets; Accelerate's
    ("Accelerator()", {"ACCELERATE_USE_CPU": "false"}, False),  # AcceleratorState reads it)
    ("Accelerator()", {"TASKTRAIN_LAUNCH": "1", "TASKTRAIN_USE_CPU": "1"}, True),  # (tasktrain launch, use_cpu)
    ("PartialState(cpu=True)", {}, True),
    ("PartialState()", {}, False),
])
def test_what_asks_for_mpis_world_on_cpu(monkeypatch, make, variables, cpu):
    """Whether the Accelerator / PartialState reads MPI's world as on CPU: cpu=True, ACCELERATE_USE_CPU (the
    Accelerator), or `tasktrain launch`'s use_cpu (stopped where it would join, before any process group)."""
    import tasktrain
    from tasktrain.compat.accelerate import state
    from tasktrain.trainer import runtime

    asked = []

    def join(cpu, env=None):
        asked.append(cpu)
        raise _Stop

    monkeypatch.setattr(runtime, "join_mpi_world", join)
    monkeypatch.setitem(state._SHARED, "strategy", None)
    for name in ("ACCELERATE_USE_CPU", "TASKTRAIN_LAUNCH", "TASKTRAIN_USE_CPU"):
        monkeypatch.delenv(name, raising=False)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(_Stop):
        eval(make, {"Accelerator": tasktrain.Accelerator, "PartialState": state.PartialState})
    assert asked == [cpu]


LAUNCHED = os.path.join(HERE, "mpi_scripts", "accelerator_under_launch_mpirun.py")


def _docs_mpirun_config():
    import re

    with open(os.path.join(ROOT, "docs", "launch.md")) as f:
        (text,) = re.findall(r"```yaml\n(# mpirun_cpu\.yaml.*?)```", f.read(), re.S)
    return text


@pytest.mark.world_size(2)
def test_tasktrain_launch_with_mpirun_config_starts_accelerates_mpirun_and_forms_one_world(tmp_path):
    """`tasktrain launch --config_file mpirun_cpu.yaml` (docs/launch.md's file: MULTI_CPU, 2 processes,
    mpirun_config.mpirun_hostfile of `127.0.0.1`) runs Accelerate's `mpirun -f hostfile -ppn 2 -n 2 python script`
    (the wheel's MPICH, found on PATH) with Accelerate's variables; the script, docs/accelerator.md's
    train_mpi_accelerator.py, forms one gloo world of MPI's 2 ranks (no torchrun: no RANK before the Accelerator) and
    trains the same weights on both, those of one process on the global batches of 4; then a Trainer's fit there
    (devices "auto") forms the same world through MPIEnvironment. Hydra kept on the loopback by its variables
    (HYDRA_LAUNCHER=fork, HYDRA_IFACE=lo): the command line stays Accelerate's."""
    port = str(free_port())
    text = _docs_mpirun_config()
    assert "main_process_port: 29500\n" in text
    (tmp_path / "mpirun_cpu.yaml").write_text(text.replace("main_process_port: 29500\n", f"main_process_port: {port}\n"))
    (tmp_path / "hostfile").write_text("127.0.0.1\n")
    env = child_env(PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]), UCX_NET_DEVICES="lo",
                    GLOO_SOCKET_IFNAME="lo", HYDRA_LAUNCHER="fork", HYDRA_IFACE="lo",
                    PATH=os.path.dirname(_mpiexec()) + os.pathsep + os.environ.get("PATH", ""),
                    TASKTRAIN_CONFIG_DIR=str(tmp_path / "no_default"))
    for name in ("ACCELERATE_USE_CPU", "MASTER_ADDR", "MASTER_PORT", "KMP_AFFINITY", "KMP_BLOCKTIME"):
        env.pop(name, None)
    command = [sys.executable, "-m", "tasktrain.cli.main", "launch", "--config_file", "mpirun_cpu.yaml", LAUNCHED]
    proc = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        log = proc.communicate(timeout=TIMEOUT)[0]
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)  # (tasktrain launch, mpirun, hydra's proxy and the ranks: one session)
        log = proc.communicate()[0]
        pytest.fail(f"tasktrain launch did not finish within {TIMEOUT} s:\n{log[-6000:]}")
    assert proc.returncode == 0, log[-6000:]
    hostfile = str(tmp_path / "hostfile")
    assert f"  mpirun command: mpirun -f {hostfile} -ppn 2 -n 2 {sys.executable} {LAUNCHED}\n" in log
    assert "2 processes, MULTI_CPU" in log
    seen = [json.load(open(tmp_path / f"rank{rank}.json")) for rank in range(2)]
    for rank, ranks in enumerate(seen):
        assert ranks["accelerator"] == [rank, 2, rank, "MULTI_CPU"] and ranks["group"] == [rank, 2, "gloo"]
        assert ranks["given"] == dict(
            ACCELERATE_USE_CPU="True", ACCELERATE_MIXED_PRECISION="no", ACCELERATE_DEBUG_MODE=None,
            MASTER_ADDR="127.0.0.1", MASTER_PORT=port, KMP_AFFINITY="granularity=fine,compact,1,0", KMP_BLOCKTIME="1",
            OMP_NUM_THREADS="1", TASKTRAIN_LAUNCH="1", TASKTRAIN_USE_CPU="1", TASKTRAIN_NUM_PROCESSES="2",
            PMI_RANK=str(rank), PMI_SIZE="2", MPI_LOCALNRANKS="2", RANK=None, WORLD_SIZE=None, LOCAL_RANK=None,
            TORCHELASTIC_RUN_ID=None)
        assert ranks["argv"] == [sys.executable, LAUNCHED]
        assert ranks["weights"] == seen[0]["weights"]  # (bit for bit)
    weights = _flat(seen[0]["weights"])
    assert weights == pytest.approx(_flat(_alone_weights((0, 4), size=4)), abs=1e-6)
    assert weights != pytest.approx(_flat(_alone_weights(range(0, 8, 2), size=2)), abs=1e-4)
    # then a Trainer's fit in the same processes (devices left to "auto"): MPI's world through MPIEnvironment
    for rank, ranks in enumerate(seen):
        fit = ranks["trainer"]
        assert fit["environment"] == "MPIEnvironment"
        assert fit["trainer"] == [rank, rank, 2, 2, "cpu"] and fit["group"] == [rank, 2]
        assert fit["weights"] == seen[0]["trainer"]["weights"]
    assert _flat(seen[0]["trainer"]["weights"]) != pytest.approx(_flat(_boring_initial_weights()), abs=1e-4)


def _boring_initial_weights():
    import torch

    from tasktrain.demos.boring_classes import BoringModel

    torch.manual_seed(0)
    return [p.detach().flatten().tolist() for p in BoringModel().parameters()]


def test_sigterm_to_a_launch_through_mpirun_stops_mpirun_and_its_processes(tmp_path):
    """SIGTERM to `tasktrain launch` (a scheduler's) while mpirun's 2 processes run: it goes on to mpirun, which stops
    them; the launch exits with 128 + 15 and no process is left running."""
    import signal
    import time

    (tmp_path / "hostfile").write_text("127.0.0.1\n")
    (tmp_path / "sleeper.py").write_text("import os, time\nopen(f\"started{os.environ['PMI_RANK']}\", 'w').write("
                                         "str(os.getpid()))\ntime.sleep(120)\n")
    env = child_env(PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]), UCX_NET_DEVICES="lo",
                    HYDRA_LAUNCHER="fork", HYDRA_IFACE="lo", TASKTRAIN_CONFIG_DIR=str(tmp_path / "no_default"),
                    PATH=os.path.dirname(_mpiexec()) + os.pathsep + os.environ.get("PATH", ""))
    command = [sys.executable, "-m", "tasktrain.cli.main", "launch", "--mpirun_hostfile", "hostfile", "--cpu",
               "--num_processes", "2", "sleeper.py"]
    proc = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not all((tmp_path / f"started{rank}").exists() for rank in range(2)):
            assert time.monotonic() < deadline and proc.poll() is None, "the 2 processes did not start"
            time.sleep(0.2)
        pids = [int((tmp_path / f"started{rank}").read_text()) for rank in range(2)]
        proc.send_signal(signal.SIGTERM)
        log = proc.communicate(timeout=30)[0]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.communicate()
    assert proc.returncode == 128 + signal.SIGTERM, log[-3000:]
    assert "tasktrain launch: stopped by SIGTERM; mpirun stopped its processes too" in log
    time.sleep(0.5)
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
