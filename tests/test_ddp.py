"""DDP with real processes (gloo on 127.0.0.1): self-launch, torchrun, two "machines" on loopback, ddp_spawn.

Each run of 2 processes costs seconds, so one script run (tests/ddp_scripts/facts.py) records many facts per
rank to JSON, and the tests below read them back.
"""
import json
import os
import socket
import subprocess
import sys

import pytest
import torch
from torch.utils.data import DistributedSampler, TensorDataset

from ddp_scripts.common import child_env, free_port, process_gone, reference_params, run, script, torchrun

RUN_TIMEOUT = 150


def _facts(out):
    return [json.load(open(os.path.join(out, f"rank{r}.json"))) for r in (0, 1)]


@pytest.fixture(scope="module")
def self_launched(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("ddp_self"))
    code, stdout, stderr, _ = run([sys.executable, script("facts.py"), out], RUN_TIMEOUT, out)
    assert code == 0, f"stdout:\n{stdout}\nstderr:\n{stderr}"
    return out, _facts(out), stdout, stderr


@pytest.fixture(scope="module")
def under_torchrun(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("ddp_torchrun"))
    args = torchrun("--standalone", "--nproc_per_node", "2", script("facts.py"), out, "--devices", "auto",
                    "--check-mismatch")
    code, stdout, stderr, _ = run(args, RUN_TIMEOUT, out)
    assert code == 0, f"stdout:\n{stdout}\nstderr:\n{stderr}"
    return out, _facts(out), stdout, stderr


launchers = pytest.mark.parametrize("world", ["self_launched", "under_torchrun"], indirect=True)


@pytest.fixture
def world(request):
    return request.getfixturevalue(request.param)


@pytest.mark.timeout(RUN_TIMEOUT + 30)
@launchers
def test_two_ranks_equal_one_process_on_the_combined_batch(world):
    _, facts, _, _ = world
    expected = reference_params(batch_size=8, steps=4)
    for rank_facts in facts:
        assert rank_facts["plain_steps"] == 4
        for got, want in zip(rank_facts["plain_params"], expected):
            assert got == pytest.approx(want, abs=1e-6)
    # each rank logs the loss of its own shard; they differ, so the shards do
    assert facts[0]["plain_train_loss"] != facts[1]["plain_train_loss"]


@pytest.mark.timeout(RUN_TIMEOUT + 30)
@launchers
def test_accumulation_skips_the_all_reduce_on_non_stepping_micro_batches(world):
    _, facts, _, _ = world
    expected = reference_params(batch_size=8, steps=4)  # 2 ranks x 2 micro-batches x 2 samples per step
    for rank_facts in facts:
        assert rank_facts["accum_steps"] == 4
        # 8 micro-batches, one gradient bucket: 4 all-reduces with no_sync, 8 without
        assert rank_facts["accum_allreduce_calls"] == 4
        for got, want in zip(rank_facts["accum_params"], expected):
            assert got == pytest.approx(want, abs=1e-6)


@pytest.mark.timeout(RUN_TIMEOUT + 30)
@launchers
def test_each_rank_trains_on_its_own_shard_in_a_seeded_order(world):
    _, facts, _, _ = world
    indices = TensorDataset(torch.arange(40))
    for epoch in ("0", "1"):
        shards = [f["shard_indices"][epoch] for f in facts]
        assert sorted(shards[0] + shards[1]) == list(range(40))  # disjoint and complete
        for rank, shard in enumerate(shards):
            sampler = DistributedSampler(indices, num_replicas=2, rank=rank, shuffle=True, seed=123)
            sampler.set_epoch(int(epoch))
            assert shard == list(sampler)  # the loader's shuffle=True kept; order from (seed, epoch)
    assert facts[0]["shard_indices"]["0"] != facts[0]["shard_indices"]["1"]  # set_epoch was called
    assert facts[0]["data_seed"] == facts[1]["data_seed"] == 123


@pytest.mark.timeout(RUN_TIMEOUT + 30)
@launchers
def test_a_users_distributed_sampler_is_left_alone_and_gets_set_epoch(world):
    _, facts, _, _ = world
    indices = TensorDataset(torch.arange(40))
    for rank, rank_facts in enumerate(facts):
        for epoch in (0, 1):
            sampler = DistributedSampler(indices, num_replicas=2, rank=rank, shuffle=True, seed=7)
            sampler.set_epoch(epoch)
            assert rank_facts["user_sampler_indices"][str(epoch)] == list(sampler)


@pytest.mark.timeout(RUN_TIMEOUT + 30)
@launchers
def test_validation_metrics_are_exact_over_a_set_not_divisible_by_the_world(world):
    _, facts, _, _ = world
    for rank_facts in facts:  # 11 samples 0..10: mean 5, counted once each
        assert rank_facts["validate"] == [{"val_count": 11.0, "val_mean_x": 5.0}]
        assert rank_facts["validate_one"] == [{"val_count": 1.0, "val_mean_x": 7.0}]


@pytest.mark.timeout(RUN_TIMEOUT + 30)
@launchers
def test_predict_gathers_every_ranks_predictions_in_dataset_order(world):
    _, facts, _, _ = world
    for rank_facts in facts:
        assert rank_facts["predict_gathered"] == [10.0 * i for i in range(11)]
        assert rank_facts["predict_frozen"] == [10.0 * i for i in range(11)]
    assert facts[0]["predict_local"] == [10.0 * i for i in range(0, 11, 2)]
    assert facts[1]["predict_local"] == [10.0 * i for i in range(1, 11, 2)]


@pytest.mark.timeout(RUN_TIMEOUT + 30)
@launchers
def test_a_stop_asked_on_rank_zero_stops_both_ranks_at_the_same_step(world):
    _, facts, _, _ = world
    # rank 0 alone sets should_stop at step 3; log_every_n_steps=2: both stop at step 4
    assert [f["stopped_at_step"] for f in facts] == [4, 4]


@pytest.mark.timeout(RUN_TIMEOUT + 30)
@launchers
def test_collectives_and_rank_properties(world):
    _, facts, _, _ = world
    for rank, f in enumerate(facts):
        assert f["reduce_sum"] == 3.0 and f["reduce_mean"] == 1.5 and f["reduce_max"] == 2.0
        assert f["all_gather"] == [[0, 0], [1, 10]]
        assert f["module_all_gather"] == {"r": [0, 1]}
        assert f["broadcast"] == {"from": 0}
        # Lightning's signatures (issue 37): reduce by position; all_gather(sync_grads=True) differentiable, each
        # rank's tensor getting the gradient of its row summed over the ranks' losses (sum(w * gathered) on both)
        assert f["lightning_reduce_sum"] == 3.0 and f["lightning_reduce_max"] == 2.0
        assert f["sync_grads_gathered"] == [[1.0, 2.0], [2.0, 4.0]]
        assert f["sync_grads_grad"] == ([[2.0, 2.0], [20.0, 20.0]][rank])
        assert f["plain_gather_requires_grad"] is False and f["module_sync_grads"] is True
        assert f["lightning_members"] == {"is_distributed": True, "module_is_lightning_module": True,
                                          "state_dict_keys": ["layer.bias", "layer.weight"]}
        assert f["ranks"] == {"global_rank": rank, "local_rank": rank, "world_size": 2, "node_rank": 0,
                              "num_nodes": 1, "module_global_rank": rank, "module_local_rank": rank}


@pytest.mark.timeout(RUN_TIMEOUT + 30)
def test_self_launch_writes_once_prints_once_and_leaves_nothing_behind(self_launched):
    out, facts, stdout, stderr = self_launched
    # the resolved setup, once, by rank 0
    announced = [line for line in stdout.splitlines() if line.startswith("[tasktrain] strategy=")]
    assert announced == ["[tasktrain] strategy=ddp, world_size=2 (devices=2 x num_nodes=1), backend=gloo, "
                         "device=cpu, launcher=self, precision=32-true"]
    # logger, progress and checkpoint: rank 0 only
    # (Lightning's TQDMProgressBar on stdout: one process's training bar is drawn once at its creation and once at
    # the epoch's reset; a bar on rank 1 would double that)
    assert stdout.count("Training: ") == 2 and "Epoch 0: 100%" in stdout
    logs = os.path.join(out, "run1", "lightning_logs")
    assert os.listdir(logs) == ["version_0"]
    files = os.listdir(os.path.join(logs, "version_0"))
    assert len([f for f in files if f.startswith("events.out.tfevents")]) == 1
    assert os.listdir(os.path.join(logs, "version_0", "checkpoints")) == ["epoch=0-step=4.ckpt"]
    # both ranks agreed on one port; the worker was reaped and the port is free again
    assert facts[0]["master_port"] == facts[1]["master_port"]
    assert facts[0]["pid"] != facts[1]["pid"] and process_gone(facts[1]["pid"])
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # SO_REUSEADDR: a closed connection's TIME-WAIT on the port (whichever side closed first: it varies) is no
        # process holding it; a listener left behind still makes the bind fail
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", int(facts[0]["master_port"])))
        s.listen()


@pytest.mark.timeout(RUN_TIMEOUT + 30)
def test_torchrun_world_that_differs_from_the_trainer_is_an_error_on_every_rank(under_torchrun):
    _, facts, stdout, _ = under_torchrun
    for f in facts:
        message = f["mismatch_error"]
        assert message is not None, "Trainer(devices=3) under a torchrun world of 2 did not fail"
        assert "world of 2 processes" in message and "devices=3" in message and "pass devices=2" in message
    assert "launcher=torchrun" in stdout


@pytest.mark.timeout(RUN_TIMEOUT + 30)
def test_two_machines_on_loopback_form_one_world(tmp_path):
    out, port = str(tmp_path), free_port()
    procs = [subprocess.Popen(
        torchrun("--nnodes", "2", "--node_rank", str(node), "--master_addr", "127.0.0.1", "--master_port", str(port),
                 "--nproc_per_node", "1", script("facts.py"), out, "--devices", "auto", "--num-nodes", "2", "--quick"),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=child_env(), cwd=out, start_new_session=True)
        for node in (0, 1)]
    outputs = []
    try:
        for p in procs:
            outputs.append(p.communicate(timeout=RUN_TIMEOUT)[0])
    except subprocess.TimeoutExpired:
        for p in procs:
            os.killpg(p.pid, 9)
        pytest.fail(f"two torchruns on loopback did not finish within {RUN_TIMEOUT} s")
    assert [p.returncode for p in procs] == [0, 0], outputs
    facts = _facts(out)
    expected = reference_params(batch_size=8, steps=4)
    for node, f in enumerate(facts):
        assert f["ranks"] == {"global_rank": node, "local_rank": 0, "world_size": 2, "node_rank": node,
                              "num_nodes": 2, "module_global_rank": node, "module_local_rank": 0}
        for got, want in zip(f["plain_params"], expected):
            assert got == pytest.approx(want, abs=1e-6)


@pytest.mark.timeout(RUN_TIMEOUT + 30)
def test_ddp_spawn_trains_in_children_and_hands_the_result_back(tmp_path):
    out = str(tmp_path)
    code, stdout, stderr, _ = run([sys.executable, script("spawn_fit.py"), out], RUN_TIMEOUT, out)
    assert code == 0, f"stdout:\n{stdout}\nstderr:\n{stderr}"
    facts = json.load(open(os.path.join(out, "parent.json")))
    assert "strategy=ddp_spawn, world_size=2" in stdout and "launcher=spawn" in stdout
    # the parent's module holds the weights the 2 ranks trained, and the parent's trainer their metrics
    for got, want in zip(facts["params"], reference_params(batch_size=8, steps=4)):
        assert got == pytest.approx(want, abs=1e-6)
    assert facts["global_step"] == 4
    assert facts["train_loss"] > 0
    # predict(gather=True) came back from rank 0 with every sample, in order
    assert facts["predictions"] == pytest.approx(facts["expected_predictions"], abs=1e-5)
    assert facts["parent_env_rank"] is None  # the parent never joined the world
    assert facts["plain_predict"] is None  # (Lightning's: a spawned predict returns nothing by default)
    # each child's strategy keeps its launcher, as Lightning's (pickled with it), and it does not launch again
    for rank in (0, 1):
        child = json.load(open(os.path.join(out, f"child{rank}.json")))
        assert child == {"multiprocessing": True, "interactive": False, "relaunch": "refused"}


@pytest.mark.timeout(RUN_TIMEOUT + 30)
def test_processes_started_with_local_rank_only_join_one_world(tmp_path):
    """Two processes a launcher of one's own started with LOCAL_RANK, MASTER_ADDR and MASTER_PORT only (no RANK /
    WORLD_SIZE): each is rank LOCAL_RANK of devices=2, as Lightning's LightningEnvironment reads them, nothing is
    started again, and they train as one world."""
    out, port = str(tmp_path), free_port()
    outputs = _two_processes_train_as_one_world(
        out, "2", [dict(LOCAL_RANK=str(r), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)) for r in (0, 1)], port)
    assert "launcher=external" in outputs[0]
    assert len(_facts(out)) == 2  # (nothing else was started)


@pytest.mark.timeout(RUN_TIMEOUT + 30)
def test_processes_started_by_slurm_join_one_world(tmp_path):
    """Two processes with the variables srun gives its tasks (no RANK/WORLD_SIZE): they form one world."""
    out, port = str(tmp_path), free_port()
    slurm = {"SLURM_NTASKS": "2", "SLURM_NNODES": "1", "SLURM_NODEID": "0", "SLURM_NODELIST": "127.0.0.1",
             "SLURM_JOB_ID": "4242", "SLURM_JOB_NAME": "train", "SLURM_STEP_ID": "0", "MASTER_PORT": str(port)}
    outputs = _two_processes_train_as_one_world(
        out, "auto", [dict(slurm, SLURM_PROCID=str(r), SLURM_LOCALID=str(r)) for r in (0, 1)], port)
    assert "launcher=slurm" in outputs[0]


def _two_processes_train_as_one_world(out, devices, envs, port):
    """Starts facts.py (4 quick steps, batch 8) in two processes with `envs`' variables, as a launcher of one's own
    would; checks both ended well as ranks 0 and 1 of one world on `port` with the one-process reference's weights;
    returns their outputs."""
    procs = [subprocess.Popen([sys.executable, script("facts.py"), out, "--devices", devices, "--quick"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=out,
                              env=child_env(**env), start_new_session=True)
             for env in envs]
    outputs = []
    try:
        for p in procs:
            outputs.append(p.communicate(timeout=RUN_TIMEOUT)[0])
    except subprocess.TimeoutExpired:
        for p in procs:
            os.killpg(p.pid, 9)
        pytest.fail(f"the two processes did not finish within {RUN_TIMEOUT} s")
    assert [p.returncode for p in procs] == [0, 0], outputs
    expected = reference_params(batch_size=8, steps=4)
    for rank, f in enumerate(_facts(out)):
        assert f["ranks"]["global_rank"] == rank and f["ranks"]["world_size"] == 2
        assert f["master_port"] == str(port)
        for got, want in zip(f["plain_params"], expected):
            assert got == pytest.approx(want, abs=1e-6)
    return outputs
