"""MPIEnvironment under a real MPI launcher: MPICH's mpiexec (the `mpich` wheel; mpi4py's wheel loads its library;
both in requirements-dev.txt) starts 4 processes on this machine, 2 of them in their own UTS namespace under another
host name (`unshare -u`, root), so that MPIEnvironment sees 2 hosts of 2 processes each. The other host's name sorts
first: its ranks (2, 3) are node 0, the first ranks node 1, so that ranks that Lightning's node_rank * devices +
local_rank would give differ from MPI's (MPI's win, as Lightning's). One launch (tests/mpi_scripts/fit_under_mpiexec.py:
the docs' example, the detected environment, Lightning's fit, a mismatched world), gloo on 127.0.0.1, bounded in time.
"""
import json
import os
import shutil
import socket
import subprocess
import sys

import pytest
import torch

from ddp_scripts.common import child_env

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SCRIPT = os.path.join(HERE, "mpi_scripts", "fit_under_mpiexec.py")
TIMEOUT = 240  # (4 processes importing torch, tasktrain and Lightning on 2 cores: ~40 s; below pytest's 300 s, so
# that mpiexec and its ranks are killed and their output shown rather than pytest-timeout's stack dump)


def _mpiexec():
    """MPICH's mpiexec beside this interpreter (the `mpich` wheel installs it into the venv's bin)."""
    path = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if not os.access(path, os.X_OK):
        pytest.fail(f"No mpiexec beside {sys.executable}: `make setup` installs the `mpich` and `mpi4py` wheels "
                    "(requirements-dev.txt) into the venv; or `.venv/bin/python -m pip install -r "
                    "requirements-dev.txt`.")
    return path


@pytest.fixture(scope="module")
def launch(tmp_path_factory):
    out = tmp_path_factory.mktemp("mpi")
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-u", "true"]).returncode != 0:
        pytest.fail("`unshare -u` (util-linux, as root) is needed to run 2 of the 4 ranks under another host name.")
    host = socket.gethostname()
    other = "0-" + host  # (sorts before it: the other host is node 0)
    python = [sys.executable, SCRIPT]
    # MPI's own traffic on the loopback only: hydra's fork launcher on 127.0.0.1, UCX on lo; gloo binds lo too (the
    # other host's name does not resolve); the group meets at rank 0's host name, this machine's.
    command = [_mpiexec(), "-launcher", "fork", "-hosts", "127.0.0.1", "-iface", "lo", "-n", "2", *python, ":",
               "-n", "2", "unshare", "-u", "sh", "-c", 'hostname "$0" && exec "$@"', other, *python]
    env = child_env(PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]), UCX_NET_DEVICES="lo",
                    GLOO_SOCKET_IFNAME="lo")
    proc = subprocess.Popen(command, cwd=out, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        log = proc.communicate(timeout=TIMEOUT)[0]
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)  # (mpiexec, hydra's proxy and the ranks: one session)
        log = proc.communicate()[0]
        pytest.fail(f"mpiexec did not finish within {TIMEOUT} s:\n{log[-6000:]}")
    assert proc.returncode == 0, log[-6000:]
    seen = [json.load(open(out / f"rank{rank}.json")) for rank in range(4)]
    return dict(out=out, host=host, other=other, seen=seen)


@pytest.mark.world_size(4)
def test_mpiexec_ranks_train_as_lightnings(launch):
    """Every rank's place is MPI's (world 4, global rank its MPI rank), the node its host's place among the sorted host
    names, the local rank its place on its host; tasktrain's MPIEnvironment reads as Lightning's, both detect MPI; the
    docs' example (the plugin) and the detected environment train the same weights on every rank as Lightning's fit,
    at rank 0's host name and one port for all ranks; rank 0 alone writes the checkpoints, as often as Lightning's,
    and one file is left; rank 0 alone logs the device notes at a Trainer's construction."""
    host, seen = launch["host"], launch["seen"]
    hosts = sorted([host, launch["other"]])
    node_of = {0: hosts.index(host), 1: hosts.index(host), 2: hosts.index(launch["other"]),
               3: hosts.index(launch["other"])}
    assert node_of[0] == 1  # (the other host's name sorts first: MPI's rank 0 is on node 1)
    for rank, ranks in enumerate(seen):
        place = [4, rank, rank % 2, node_of[rank]]
        ours, theirs = ranks["getters"]["tasktrain"], ranks["getters"]["lightning"]
        assert ours[0] == theirs[0] == host and ours[2:] == theirs[2:] == place
        assert ranks["detect"] == [True, True]
        for phase in ("docs", "detected", "lightning"):
            run = ranks[phase]
            assert run["environment"] == "MPIEnvironment"
            assert run["trainer"] == [rank, rank % 2, node_of[rank], 4, rank == 0]
            assert run["group"] == [rank, 4]
            assert run["master"][0] == host
            assert run["weights"] == seen[0]["lightning"]["weights"]
        assert ranks["detected"]["saves"] == ranks["lightning"]["saves"] == (seen[0]["lightning"]["saves"] if rank == 0
                                                                             else 0)
        # the device notes at each Trainer's construction: rank 0's alone, as Lightning's (2 Trainers of ours: the
        # docs' example, the first of the process, and the detected fit; 1 of Lightning's)
        assert ranks["device_lines"] == ([2, 1] if rank == 0 else [0, 0])
    # one port per environment object (a free one rank 0 picks when the run starts), the same on every rank
    for phase in ("docs", "detected", "lightning"):
        assert len({ranks[phase]["master"][1] for ranks in seen}) == 1
    assert len({ranks["getters"]["tasktrain"][1] for ranks in seen}) == 1
    assert seen[0]["lightning"]["saves"] > 0 and seen[0]["lightning"]["weights"] != _initial_weights()
    (checkpoint,) = (launch["out"] / "ckpt").iterdir()
    state = torch.load(checkpoint, weights_only=True)["state_dict"]
    assert [v.flatten().tolist() for v in state.values()] == seen[0]["detected"]["weights"]


def _initial_weights():
    from tasktrain.demos.boring_classes import BoringModel

    torch.manual_seed(0)
    return [p.detach().flatten().tolist() for p in BoringModel().parameters()]


@pytest.mark.world_size(4)
def test_a_world_mpiexec_formed_other_than_asked_is_an_error_naming_the_numbers(launch):
    """devices=1 x num_nodes=2 under `mpiexec -n 4` (2 hosts of 2): every rank raises before training, with MPI's
    numbers and the devices / num_nodes to pass (Lightning's fails later with an IndexError)."""
    host, other = launch["host"], launch["other"]
    for ranks in launch["seen"]:
        kind, words = ranks["mismatch"]
        assert kind == "ValueError"
        assert words == (f"MPIEnvironment(): mpiexec / mpirun started 4 processes on 2 host(s) ({other}: 2, "
                         f"{host}: 2), but the Trainer asked for devices=1 x num_nodes=2 = 2. Make them agree: pass "
                         "devices=2, num_nodes=2 to the Trainer, or start 2 processes (1 on each of 2 host(s)): "
                         "`mpiexec -n 2 python script.py`.")


def test_mpi_environment_outside_mpiexec_is_an_error_naming_mpiexec():
    """A script mpiexec did not start (MPI's singleton: a world of this one process) given plugins=[MPIEnvironment()]
    with devices=2: an error before training naming mpiexec (Lightning's trains a world of one on half the data)."""
    from tasktrain.demos.boring_classes import BoringModel, RandomDataset
    from tasktrain.plugins.environments import MPIEnvironment

    import tasktrain

    assert MPIEnvironment.detect() is False
    trainer = tasktrain.Trainer(accelerator="cpu", strategy="ddp", devices=2, plugins=[MPIEnvironment()], max_steps=1,
                                logger=False, enable_progress_bar=False, enable_checkpointing=False)
    with pytest.raises(ValueError, match=r"MPI's world is this one process .*devices=2 x num_nodes=1 = 2\. Start 2 "
                                         r"processes .*`mpiexec -n 2 python script.py`, or leave the plugin out"):
        trainer.fit(BoringModel(), torch.utils.data.DataLoader(RandomDataset(32, 16), batch_size=4))
