"""Resume on another number of processes (issue 18): real processes, each rank recording the samples it trains on.

The runs (tests/reshard_scripts/train.py): 48 numbered samples, shuffled, 2 epochs; a small MLP without dropout,
AdamW with two param groups; a checkpoint after every optimizer step. "Killed" runs are SIGKILLed right after the
checkpoint of step 3 (mid-epoch 0); a run resumed from step 3 of an uninterrupted run is in the same position.

With the global batch kept (2 processes x 4 samples, 1 process x 8), the same samples make up each optimizer step
on any number of processes, so the parameters after a resume match the uninterrupted run up to the order of fp32
reductions: DDP averages two per-process mean gradients, one process takes the mean of 8 per-sample terms. That
changes the last bits of each step's gradient; Adam's update, which divides by sqrt(v), keeps such differences at
the size of a few ulps of the weights per step. Measured here: at most 9e-8 on the parameters and 3e-8 on Adam's
moments after 12 steps; the tests allow 1e-6 (parameters of size ~1, learning rates 1e-2).
"""
import json
import os
import subprocess
import sys

import pytest
import torch

from helpers import cli_commands_here

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "reshard_scripts", "train.py")
_SCRUB = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")
N, STEPS_PER_EPOCH_AT_8 = 48, 6
ATOL = 1e-6


def launch(root, runs, expect_ok=True, timeout=300):
    env = {k: v for k, v in os.environ.items() if k not in _SCRUB and not k.startswith("TASKTRAIN_")}
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.run([sys.executable, SCRIPT, "--root", str(root), "--runs", json.dumps(runs)], env=env,
                          capture_output=True, text=True, timeout=timeout)
    output = proc.stdout + proc.stderr
    assert (proc.returncode == 0) == expect_ok, output[-6000:]
    return output


def records(root, name, world):
    """[(epoch, step, rank, ids)] of a run, in the order each rank trained them."""
    out = []
    for rank in range(world):
        path = os.path.join(root, f"{name}.ids.rank{rank}.txt")
        with open(path) as f:
            out += [(r["epoch"], r["step"], rank, r["ids"]) for r in map(json.loads, f)]
    return out


def by_step(recs, upto=None, after=None):
    """{step: sorted ids of the global batch of that optimizer step}."""
    steps = {}
    for _, step, _, ids in recs:
        if (upto is None or step <= upto) and (after is None or step > after):
            steps.setdefault(step, []).extend(ids)
    return {s: sorted(ids) for s, ids in steps.items()}


def epoch_ids(recs, epoch):
    return sorted(i for e, _, _, ids in recs for i in ids if e == epoch)


def ckpt(root, name, step=None):
    directory = os.path.join(root, name, "checkpoints")
    if step is None:
        return os.path.join(directory, "last.ckpt")
    [found] = [f for f in os.listdir(directory) if f.endswith(f"-step={step}.ckpt")]
    return os.path.join(directory, found)


def assert_same_training(got, ref, atol=ATOL):
    assert got["global_step"] == ref["global_step"]
    for name, value in ref["params"].items():
        torch.testing.assert_close(got["params"][name], value, rtol=0, atol=atol, msg=name)
    assert_same_adam(got["optimizer"], ref["optimizer"], atol)


def assert_same_adam(got, ref, atol=ATOL):
    """Step counts equal, moments close, each group's hyper-parameters its own."""
    assert len(got["param_groups"]) == len(ref["param_groups"]) == 2
    for mine, theirs in zip(got["param_groups"], ref["param_groups"]):
        for key in ("lr", "weight_decay", "betas", "eps"):
            assert mine[key] == theirs[key], key
    assert sorted(got["state"]) == sorted(ref["state"])
    for index, state in ref["state"].items():
        assert float(got["state"][index]["step"]) == float(state["step"])
        for key in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(got["state"][index][key], state[key], rtol=0, atol=atol, msg=key)


# -- DDP and one process ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ddp(tmp_path_factory):
    root = tmp_path_factory.mktemp("reshard_ddp")
    logs = {}
    # 2 processes x 4 samples: uninterrupted (and FSDP, the same run: its step 3 is resumed on one process below),
    # then killed (rank 1, SIGKILL) after step 3 of the 6 of epoch 0. One launch: the kill ends it, after the
    # uninterrupted runs wrote their results (each run seeds itself and has its own folder, as in a fresh launch).
    logs["ref2"] = logs["kill2"] = launch(root, [{"name": "ref2", "devices": 2, "batch": 4},
                                                 {"name": "f2ref", "devices": 2, "batch": 4, "strategy": "fsdp"},
                                                 {"name": "kill2", "devices": 2, "batch": 4, "kill_at": 3}],
                                          expect_ok=False)
    assert all(os.path.exists(root / f"{name}.out.pt") for name in ("ref2", "f2ref")), logs["ref2"][-6000:]
    assert not os.path.exists(root / "kill2.out.pt"), logs["kill2"][-6000:]  # the launch ended in the killed run
    # 1 process: its own uninterrupted run (x 8), and the killed run resumed with 8 (the global batch kept) and
    # with 4 (the per-process batch kept: the global batch halves); and FSDP's step 3 (a DCP directory written by 2
    # processes) under FSDP on one process x 8
    logs["one"] = launch(root, [
        {"name": "ref1", "devices": 1, "batch": 8},
        {"name": "res1", "devices": 1, "batch": 8, "resume": ckpt(root, "kill2")},
        {"name": "res1b", "devices": 1, "batch": 4, "resume": ckpt(root, "kill2")},
        {"name": "f2res1", "devices": 1, "batch": 8, "strategy": "fsdp", "resume": ckpt(root, "f2ref", 3)},
    ])
    # 1 -> 2: the single-process run's step 3 resumed on 2 processes x 4; and one process -> FSDP on 2: the same
    # step 3 converted to FSDP's layout (`tasktrain convert --to fsdp`) and resumed under FSDP (its step 9 goes back
    # to one process in the `zero` fixture's one-process launch). The CLI's entry point in this process
    # (helpers.cli_commands_here, each a `tasktrain convert` as typed) converts that step 3 twice: to FSDP's layout
    # for here, and to DeepSpeed's (universal layout) for the `zero` fixture's ZeRO-3 run (DDP -> ZeRO-3)
    converted = cli_commands_here([["convert", ckpt(root, "ref1", 3), root / "ref1-step3.fsdp", "--to", "fsdp"],
                                   ["convert", ckpt(root, "ref1", 3), root / "ref1-step3.deepspeed", "--to",
                                    "deepspeed"]])
    for code, stdout, stderr in converted:
        assert code == 0, stdout + stderr
    logs["to_fsdp"], logs["to_ds"] = (stdout for _, stdout, _ in converted)
    # In the same 2-process launch, the `zero` fixture's (their processes started once): ZeRO-2's uninterrupted run,
    # and DDP -> ZeRO-3 (the single-process run's step 3 as a DeepSpeed checkpoint, converted above)
    logs["res2"] = logs["two"] = launch(root, [
        {"name": "res2", "devices": 2, "batch": 4, "resume": ckpt(root, "ref1", 3)},
        {"name": "fres2", "devices": 2, "batch": 4, "strategy": "fsdp", "resume": str(root / "ref1-step3.fsdp")},
        {"name": "z2ref", "devices": 2, "batch": 4, "strategy": "deepspeed_stage_2"},
        {"name": "z3res2", "devices": 2, "batch": 4, "strategy": "deepspeed_stage_3",
         "resume": str(root / "ref1-step3.deepspeed")},
    ], timeout=600)
    return root, logs


def out(root, name):
    return torch.load(os.path.join(root, f"{name}.out.pt"), weights_only=True)


@pytest.mark.world_size(2)
@pytest.mark.timeout(900)
def test_killed_on_2_resumed_on_1_trains_each_sample_once_and_matches(ddp):
    root, logs = ddp
    killed = [r for r in records(root, "kill2", 2) if r[1] <= 3]
    resumed = records(root, "res1", 1)
    assert max(r[1] for r in records(root, "kill2", 2)) == 3 and min(r[1] for r in resumed) == 4
    assert epoch_ids(killed + resumed, 0) == list(range(N))  # every sample of the interrupted epoch once
    assert epoch_ids(resumed, 1) == list(range(N))
    # the same samples make up every optimizer step as in the uninterrupted runs, on 2 processes and on 1
    reference = by_step(records(root, "ref2", 2))
    assert by_step(killed + resumed) == reference == by_step(records(root, "ref1", 1))
    assert_same_training(out(root, "res1"), out(root, "ref2"))
    assert_same_training(out(root, "ref1"), out(root, "ref2"))  # the tolerance itself: 1 vs 2 processes
    assert "saved by 2 processes" in logs["one"] and "rank 0 continues its own random state" in logs["one"]


@pytest.mark.world_size(2)
@pytest.mark.timeout(900)
def test_1_resumed_on_2_trains_each_sample_once_and_matches(ddp):
    root, logs = ddp
    before = [r for r in records(root, "ref1", 1) if r[1] <= 3]
    resumed = records(root, "res2", 2)
    assert epoch_ids(before + resumed, 0) == list(range(N)) and epoch_ids(resumed, 1) == list(range(N))
    assert by_step(before + resumed) == by_step(records(root, "ref1", 1))
    assert_same_training(out(root, "res2"), out(root, "ref1"))
    # rank 1 is new: its random streams are derived from (seed, step, rank), and the run says so
    assert "rank 1 starts random streams derived from (seed=7, global step=3, rank)" in logs["res2"]


@pytest.mark.world_size(2)
@pytest.mark.timeout(900)
def test_a_different_global_batch_still_trains_each_sample_once_and_says_so(ddp):
    root, logs = ddp
    killed = [r for r in records(root, "kill2", 2) if r[1] <= 3]
    resumed = records(root, "res1b", 1)
    assert epoch_ids(killed + resumed, 0) == list(range(N)) and epoch_ids(resumed, 1) == list(range(N))
    # 24 samples left in epoch 0 at 4 a step, then 12 steps of epoch 1
    assert out(root, "res1b")["global_step"] == 3 + 6 + 12
    assert logs["one"].count("global batch changes from 8 to 4") == 1


@pytest.mark.world_size(2)
@pytest.mark.timeout(900)
def test_fsdp_on_2_resumed_on_1_trains_each_sample_once_and_carries_adam(ddp):
    """FSDP's sharded checkpoint of step 3 (a DCP directory written by 2 processes, 2 x 4 samples) resumed under FSDP
    on one process x 8: DCP reshards the module's and AdamW's shards onto the world of one."""
    root, logs = ddp
    saved = ckpt(root, "f2ref", 3)
    assert os.path.isdir(saved) and {"__0_0.distcp", "__1_0.distcp"} <= set(os.listdir(saved))
    before = [r for r in records(root, "f2ref", 2) if r[1] <= 3]
    resumed = records(root, "f2res1", 1)
    assert min(r[1] for r in resumed) == 4
    assert epoch_ids(before + resumed, 0) == list(range(N)) and epoch_ids(resumed, 1) == list(range(N))
    assert by_step(before + resumed) == by_step(records(root, "f2ref", 2)) == by_step(records(root, "ref2", 2))
    assert f"{saved} was saved by 2 processes and is resumed by 1" in logs["one"]
    # weights, moments, step counts (12: carried from the 3 of the checkpoint, not restarted) and each group's
    # hyper-parameters, against the uninterrupted FSDP run and against DDP
    assert_same_training(out(root, "f2res1"), out(root, "f2ref"))
    assert_same_training(out(root, "f2ref"), out(root, "ref2"))


# -- DeepSpeed ZeRO, and moves between strategies through `tasktrain convert` -------------------------------------
def convert(src, dst, to):
    """`tasktrain convert SRC DST --to TO` through the CLI's entry point in this process; its output."""
    [(code, stdout, stderr)] = cli_commands_here([["convert", src, dst, "--to", to]])
    assert code == 0, stdout + stderr
    return stdout


def plain(path):
    """A converted (or plain) checkpoint as the runs' outputs: params, optimizer state, global step."""
    ckpt = torch.load(path, weights_only=True)
    assert ckpt["loops"]["weights_only"] is False
    return {"params": ckpt["state_dict"], "optimizer": ckpt["optimizer_states"][0],
            "global_step": ckpt["loops"]["train_state"]["global_step"]}


@pytest.fixture(scope="module")
def zero(ddp):
    root, ddp_logs = ddp
    # (z2ref and z3res2, on 2 processes, ran in the `ddp` fixture's last launch)
    logs = {"two": ddp_logs["two"]}
    # The conversions, through the CLI's entry point in this process (helpers.cli_commands_here), each a
    # `tasktrain convert` as typed. First ZeRO-3 -> one file -> DDP: the ZeRO-3 run's step 9 as a plain checkpoint,
    # resumed on one process below; the same for the run moved to FSDP on 2 (the `ddp` fixture): its step 9 (a DCP
    # directory) -> one file.
    steps9 = [(ckpt(root, "z3res2", 9), root / "z3res2-step9.ckpt"),
              (ckpt(root, "fres2", 9), root / "fres2-step9.ckpt")]
    converted = cli_commands_here([["convert", src, dst, "--to", "ckpt"] for src, dst in steps9])
    for (src, dst), (code, stdout, stderr) in zip(steps9, converted):
        assert code == 0, (src, dst, stdout + stderr)
    logs["fsdp_to_ckpt"] = converted[1][1]
    # One one-process launch (DeepSpeed imported once, and one interpreter, not three) through DeepSpeed's own
    # converter: ZeRO-2 2 -> 1 (the uninterrupted ZeRO-2 run's step 3 resumed on one process x 8); then stages 3 and
    # 1: ZeRO-3's step 6 (2 processes) resumed on one at stage 3, and ZeRO-2's step 3 (2 processes) resumed on one at
    # stage 1; then the two step-9 files above resumed on one process without an engine (back1, fback1)
    logs["z2res1"] = logs["zres1"] = logs["back1"] = launch(root, [
        {"name": "z2res1", "devices": 1, "batch": 8, "strategy": "deepspeed_stage_2", "resume": ckpt(root, "z2ref", 3)},
        {"name": "z3res1", "devices": 1, "batch": 8, "strategy": "deepspeed_stage_3", "resume": ckpt(root, "z3res2", 6)},
        {"name": "z1res1", "devices": 1, "batch": 8, "strategy": "deepspeed_stage_1", "resume": ckpt(root, "z2ref", 3)},
        {"name": "back1", "devices": 1, "batch": 8, "resume": str(root / "z3res2-step9.ckpt")},
        {"name": "fback1", "devices": 1, "batch": 8, "resume": str(root / "fres2-step9.ckpt")},
    ], timeout=600)
    # The final checkpoints of the DeepSpeed runs as plain files, which the tests compare.
    jobs = [(ckpt(root, name), root / f"{name}.final.ckpt")
            for name in ("z2ref", "z2res1", "z3res2", "z3res1", "z1res1")]
    converted = cli_commands_here([["convert", src, dst, "--to", "ckpt"] for src, dst in jobs])
    for (src, dst), (code, stdout, stderr) in zip(jobs, converted):
        assert code == 0, (src, dst, stdout + stderr)
    return root, logs


@pytest.mark.world_size(2)
@pytest.mark.timeout(1500)
def test_zero2_on_2_resumed_on_1_trains_each_sample_once_and_carries_adam(zero):
    root, logs = zero
    before = [r for r in records(root, "z2ref", 2) if r[1] <= 3]
    resumed = records(root, "z2res1", 1)
    assert min(r[1] for r in resumed) == 4
    assert epoch_ids(before + resumed, 0) == list(range(N)) and epoch_ids(resumed, 1) == list(range(N))
    assert by_step(before + resumed) == by_step(records(root, "ref2", 2))  # the same order as under DDP
    # (its launch resumes at stages 2, 3 and 1: the stage names z2res1's conversion)
    assert "this run has 1 at stage 2: converting it to DeepSpeed's universal checkpoint" in logs["z2res1"]
    # weights, moments, step counts and each group's hyper-parameters, against the uninterrupted ZeRO-2 run
    assert_same_training(plain(root / "z2res1.final.ckpt"), plain(root / "z2ref.final.ckpt"))
    assert_same_training(plain(root / "z2ref.final.ckpt"), out(root, "ref2"))  # and against DDP


@pytest.mark.world_size(2)
@pytest.mark.timeout(1500)
def test_a_run_moves_ddp_to_zero3_to_ddp_through_convert(zero):
    root, logs = zero
    # one process (single device) -> its step 3 converted -> ZeRO-3 on 2 processes
    before = [r for r in records(root, "ref1", 1) if r[1] <= 3]
    on_zero3 = records(root, "z3res2", 2)
    assert min(r[1] for r in on_zero3) == 4
    assert epoch_ids(before + on_zero3, 0) == list(range(N))
    assert by_step(before + on_zero3) == by_step(records(root, "ref1", 1))
    assert_same_training(plain(root / "z3res2.final.ckpt"), out(root, "ref1"))
    # ZeRO-3's step 9 converted to one file -> one process again
    back = records(root, "back1", 1)
    assert min(r[1] for r in back) == 10
    assert by_step([r for r in on_zero3 if r[1] <= 9] + back, after=3) == by_step(records(root, "ref1", 1), after=3)
    assert_same_training(out(root, "back1"), out(root, "ref1"))


@pytest.mark.world_size(2)
@pytest.mark.timeout(1500)
def test_a_run_moves_one_process_to_fsdp_to_one_process_through_convert(ddp, zero):
    root, logs = zero
    # one process -> its step 3 converted (--to fsdp) -> FSDP on 2 processes x 4
    assert "FSDP's sharded layout" in ddp[1]["to_fsdp"]
    before = [r for r in records(root, "ref1", 1) if r[1] <= 3]
    on_fsdp = records(root, "fres2", 2)
    assert min(r[1] for r in on_fsdp) == 4
    assert epoch_ids(before + on_fsdp, 0) == list(range(N)) and epoch_ids(on_fsdp, 1) == list(range(N))
    assert by_step(before + on_fsdp) == by_step(records(root, "ref1", 1))
    assert_same_training(out(root, "fres2"), out(root, "ref1"))
    # FSDP's step 9 (mid-epoch 1, a DCP directory written by 2 processes) converted to one file (--to ckpt): the
    # moments and step counts of step 9, numbered as optimizer.state_dict() numbers them
    assert "at global step 9" in logs["fsdp_to_ckpt"]
    moved = plain(root / "fres2-step9.ckpt")
    assert moved["global_step"] == 9 and moved["params"].keys() == out(root, "ref1")["params"].keys()
    assert sorted(moved["optimizer"]["state"]) == list(range(4))
    assert all(float(s["step"]) == 9 for s in moved["optimizer"]["state"].values())
    # ... and resumed on one process: every sample of epoch 1 once, each step as in the uninterrupted run
    back = records(root, "fback1", 1)
    assert min(r[1] for r in back) == 10
    assert epoch_ids([r for r in on_fsdp if r[1] <= 9] + back, 1) == list(range(N))
    assert by_step([r for r in on_fsdp if r[1] <= 9] + back, after=3) == by_step(records(root, "ref1", 1), after=3)
    assert_same_training(out(root, "fback1"), out(root, "ref1"))


@pytest.mark.world_size(2)
@pytest.mark.timeout(1500)
def test_zero3_on_2_resumed_on_1_and_zero2_resumed_at_stage_1_through_deepspeeds_converter(zero):
    root, logs = zero
    # z3res1 and z1res1 each converted, once (their launch also ran z2res1, at stage 2: 3 conversions in all)
    assert logs["zres1"].count("converting it to DeepSpeed's universal checkpoint") == 3
    for stage in (3, 1):
        assert logs["zres1"].count(f"this run has 1 at stage {stage}: converting it to DeepSpeed's universal") == 1
    # ZeRO-3, 2 -> 1 processes: the run that came from one process (ref1) goes on as ref1 did
    before = [r for r in records(root, "z3res2", 2) if r[1] <= 6]
    resumed = records(root, "z3res1", 1)
    assert min(r[1] for r in resumed) == 7
    assert by_step(before + resumed, after=3) == by_step(records(root, "ref1", 1), after=3)
    assert_same_training(plain(root / "z3res1.final.ckpt"), out(root, "ref1"))
    # ZeRO-2 on 2 -> ZeRO-1 on 1: as the uninterrupted ZeRO-2 run
    before = [r for r in records(root, "z2ref", 2) if r[1] <= 3]
    resumed = records(root, "z1res1", 1)
    assert epoch_ids(before + resumed, 0) == list(range(N)) and epoch_ids(resumed, 1) == list(range(N))
    assert by_step(before + resumed) == by_step(records(root, "z2ref", 2))
    assert_same_training(plain(root / "z1res1.final.ckpt"), plain(root / "z2ref.final.ckpt"))


# -- the Accelerator: save_state / load_state with its loader's position ---------------------------------------------
ACCELERATE = os.path.join(HERE, "reshard_scripts", "accelerate.py")


def launch_accelerate(root, runs, processes, timeout=300):
    env = {k: v for k, v in os.environ.items() if k not in _SCRUB and not k.startswith("TASKTRAIN_")}
    env.update(OMP_NUM_THREADS="1", TASKTRAIN_CONFIG_DIR=str(root / "no-config"))
    command = [ACCELERATE, "--root", str(root), "--runs", json.dumps(runs)]
    if processes > 1:
        command = ["-m", "tasktrain.cli.main", "launch", "--num_processes", str(processes), *command]
    proc = subprocess.run([sys.executable, *command], env=env, capture_output=True, text=True, timeout=timeout)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-6000:]
    return output


@pytest.fixture(scope="module")
def accelerate(tmp_path_factory):
    root = tmp_path_factory.mktemp("reshard_accelerate")
    # One process x 8 first (its save_state after step 3 is loaded on 2 below: one 2-process launch, not two)
    logs = {"a1": launch_accelerate(root, [{"name": "a1", "batch": 8}], 1)}
    # a1's state on 2 processes x 4; then save_state after step 3, go on (and the same under FSDP: a DCP directory;
    # and under ZeRO-2, for the `accelerate_zero` tests: its launches are these, DeepSpeed imported by each process
    # once)
    logs["a2"] = logs["a1to2"] = launch_accelerate(root, [
        {"name": "a1to2", "batch": 4, "load": "a1"}, {"name": "a2", "batch": 4},
        {"name": "fa2", "batch": 4, "strategy": "fsdp"}, {"name": "d2", "batch": 4, "strategy": "deepspeed_stage_2"}],
        2, timeout=600)
    # FSDP's save_state directory -> the layout save_state writes without FSDP, loaded on one process below
    logs["fsdp_to_plain"] = convert(root / "fa2.state", root / "fa2plain.state", "ckpt")
    logs["one"] = launch_accelerate(root, [{"name": "a2to1", "batch": 8, "load": "a2"},
                                           {"name": "a2to1b", "batch": 4, "load": "a2"},  # global batch 8 -> 4
                                           {"name": "fa2to1", "batch": 8, "load": "fa2plain"},
                                           # ZeRO-2's save_state on 2, loaded on 1 (the `accelerate_zero` tests)
                                           {"name": "d2to1", "batch": 8, "strategy": "deepspeed_stage_2",
                                            "load": "d2"}], 1, timeout=600)
    return root, logs


@pytest.mark.world_size(2)
@pytest.mark.timeout(900)
@pytest.mark.parametrize("saved, resumed, world", [("a2", "a2to1", 1), ("a1", "a1to2", 2)])
def test_accelerator_load_state_on_another_number_of_processes(accelerate, saved, resumed, world):
    root, logs = accelerate
    before = [r for r in records(root, saved, 2 if saved == "a2" else 1) if r[1] <= 3]
    after = records(root, resumed, world)
    assert min(r[1] for r in after) == 4
    assert epoch_ids(before + after, 0) == list(range(N)) and epoch_ids(after, 1) == list(range(N))
    assert by_step(before + after) == by_step(records(root, "a2", 2)) == by_step(records(root, "a1", 1))
    assert_same_training(out(root, resumed), out(root, saved))


@pytest.mark.world_size(2)
@pytest.mark.timeout(900)
def test_accelerator_fsdp_save_state_on_2_converted_and_loaded_on_1(accelerate):
    """The Accelerator's save_state under FSDP on 2 processes (step 3), through `tasktrain convert --to ckpt` into the
    layout save_state writes without FSDP, loaded on one process x 8: it goes on as the DDP run does."""
    root, logs = accelerate
    assert "the Accelerator's save_state layout without FSDP" in logs["fsdp_to_plain"]
    assert ".metadata" in os.listdir(root / "fa2.state") and os.listdir(root / "fa2plain.state") == [
        "accelerator_state.pt"]
    before = [r for r in records(root, "fa2", 2) if r[1] <= 3]
    after = records(root, "fa2to1", 1)
    assert min(r[1] for r in after) == 4
    assert epoch_ids(before + after, 0) == list(range(N)) and epoch_ids(after, 1) == list(range(N))
    assert by_step(before + after) == by_step(records(root, "fa2", 2)) == by_step(records(root, "a2", 2))
    assert_same_training(out(root, "fa2to1"), out(root, "a2"))  # weights, Adam's moments and step counts
    for name, value in out(root, "fa2")["params"].items():
        torch.testing.assert_close(value, out(root, "a2")["params"][name], rtol=0, atol=ATOL, msg=name)


@pytest.mark.world_size(2)
@pytest.mark.timeout(900)
def test_accelerator_load_state_with_another_global_batch_trains_each_sample_once(accelerate):
    root, logs = accelerate
    before = [r for r in records(root, "a2", 2) if r[1] <= 3]
    after = records(root, "a2to1b", 1)
    assert epoch_ids(before + after, 0) == list(range(N)) and epoch_ids(after, 1) == list(range(N))
    assert out(root, "a2to1b")["global_step"] == 3 + 6 + 12
    assert logs["one"].count("the global batch changes from 8 to 4") == 1


# -- what cannot move: a loader whose order is the user's own, stopped mid-epoch (one process, the checkpoint edited
# to say it was written by 2) ----------------------------------------------------------------------------------------
class Backwards(torch.utils.data.Sampler):
    """A sampler of the user's: the Trainer cannot tell which samples other processes had of it."""

    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return iter(range(self.n - 1, -1, -1))

    def __len__(self):
        return self.n


def _own_order_loader():
    data = torch.utils.data.TensorDataset(torch.randn(16, 3), torch.randn(16, 1))
    return torch.utils.data.DataLoader(data, batch_size=4, sampler=Backwards(16))


def _plain_loader():
    data = torch.utils.data.TensorDataset(torch.randn(16, 3), torch.randn(16, 1))
    return torch.utils.data.DataLoader(data, batch_size=4, shuffle=True)


@pytest.mark.parametrize("loader, options, said", [
    (_own_order_loader, {}, r"a sampler or batch sampler of yours"),
    # the Trainer's own order, but each rank reads the loader as the user built it (no sharding by the Trainer)
    (_plain_loader, {"use_distributed_sampler": False}, r"with use_distributed_sampler=False each process reads"),
])
def test_an_order_of_the_users_stopped_mid_epoch_refuses_another_number_of_processes_before_training(
        tmp_path, loader, options, said):
    from tasktrain import ModelCheckpoint, TaskModule, Trainer

    class Tiny(TaskModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(3, 1)
            self.steps = 0

        def training_step(self, batch, batch_idx):
            self.steps += 1
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    def trainer(**kwargs):
        return Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                       num_sanity_val_steps=0, default_root_dir=str(tmp_path), **options, **kwargs)

    trainer(max_steps=2, callbacks=[ModelCheckpoint(every_n_train_steps=1)]).fit(Tiny(), loader())
    [name] = [f for f in os.listdir(tmp_path / "checkpoints") if "step=2" in f]
    ckpt = torch.load(tmp_path / "checkpoints" / name, weights_only=True)
    own = ckpt["loops"]
    assert own["train_state"]["batch_in_epoch"] == 2 and not own["train_state"]["epoch_finished"]
    own["world_size"], own["rng_states"] = 2, own["rng_states"] * 2  # as if 2 processes had written it
    torch.save(ckpt, tmp_path / "from2.ckpt")
    module = Tiny()
    with pytest.raises(ValueError, match=r"stopped in the middle of epoch 0 on 2 processes, and this run has 1.*"
                                         + said):
        trainer(max_epochs=1).fit(module, loader(), ckpt_path=str(tmp_path / "from2.ckpt"))
    assert module.steps == 0
    # the same checkpoint on the number of processes that wrote it (here: 1) continues
    module = Tiny()
    trainer(max_epochs=1).fit(module, loader(), ckpt_path=str(tmp_path / "checkpoints" / name))
    assert module.steps == 2
    # and one taken at the end of an epoch resumes on any number of processes: the next epoch starts whole
    own["train_state"]["epoch_finished"] = True
    torch.save(ckpt, tmp_path / "from2-end.ckpt")
    module = Tiny()
    trainer(max_epochs=2).fit(module, loader(), ckpt_path=str(tmp_path / "from2-end.ckpt"))
    assert module.steps == 4


def test_accelerator_load_state_of_a_users_sampler_mid_epoch_refuses_another_number_of_processes(tmp_path):
    from tasktrain import Accelerator
    from tasktrain.trainer.accelerator import STATE_FILE

    def build():
        accelerator = Accelerator(cpu=True)
        model = torch.nn.Linear(3, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        return (accelerator, *accelerator.prepare(model, optimizer, _own_order_loader()))

    accelerator, model, optimizer, loader = build()
    for i, (x, y) in enumerate(loader):
        accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
        optimizer.step()
        optimizer.zero_grad()
        if i == 1:
            accelerator.save_state(str(tmp_path / "state"), layout="tasktrain")  # the run state in one file
            break
    state = torch.load(tmp_path / "state" / STATE_FILE, weights_only=True)
    assert state["loaders"][0]["batches_seen"] == 2 and state["loaders"][0]["samples_seen"] is None
    state["loaders"][0]["world_size"], state["rng_states"] = 2, state["rng_states"] * 2
    torch.save(state, tmp_path / "state" / STATE_FILE)
    accelerator, model, optimizer, loader = build()
    with pytest.raises(ValueError, match=r"stopped in the middle of an epoch on 2 processes, and this run has 1"):
        accelerator.load_state(str(tmp_path / "state"))


# -- the Accelerator under DeepSpeed ZeRO-2: save_state on 2 processes, load_state on 1 --------------------------------
@pytest.fixture(scope="module")
def accelerate_zero(accelerate):
    """d2 (save_state under ZeRO-2 on 2 processes) and d2to1 (its load_state on 1) ran last in the `accelerate`
    fixture's 2-process and 1-process launches; d2to1's log is that launch's, where only it resumes a DeepSpeed
    state (the others are DDP and FSDP states), so the conversion message there is its."""
    root, logs = accelerate
    return root, {"d2": logs["a2"], "d2to1": logs["one"]}


@pytest.mark.world_size(2)
@pytest.mark.timeout(1500)
def test_accelerator_zero2_save_state_on_2_load_state_on_1(accelerate_zero):
    root, logs = accelerate_zero
    before = [r for r in records(root, "d2", 2) if r[1] <= 3]
    after = records(root, "d2to1", 1)
    assert min(r[1] for r in after) == 4
    assert epoch_ids(before + after, 0) == list(range(N)) and epoch_ids(after, 1) == list(range(N))
    assert by_step(before + after) == by_step(records(root, "a2", 2))
    assert "converting it to DeepSpeed's universal checkpoint" in logs["d2to1"]
    # Adam's moments and step counts are in the engine's flat partitions: had the load lost them (or reset the
    # step counts' bias correction), the 9 steps after it would move the weights by ~lr each, not by 1e-6
    got, ref = out(root, "d2to1"), out(root, "d2")
    assert got["global_step"] == ref["global_step"] == 3 + 3 + 6
    for name, value in ref["params"].items():
        torch.testing.assert_close(got["params"][name], value, rtol=0, atol=ATOL, msg=name)
        torch.testing.assert_close(value, out(root, "a2")["params"][name], rtol=0, atol=ATOL, msg=name)  # and DDP's


# -- `tasktrain convert --to fsdp` and back, in one process ----------------------------------------------------------
def _same(a, b, where):
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            _same(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


def test_a_file_converted_to_fsdp_and_back_is_the_same_checkpoint_and_wrong_inputs_are_refused(tmp_path, capsys):
    """One process, AdamW with two param groups and a scheduler: file -> --to fsdp (a DCP directory) -> --to ckpt
    gives back every entry exactly; FSDP on one process resumes the directory; wrong inputs are refused by name."""
    from tasktrain import ModelCheckpoint, TaskModule, Trainer
    from tasktrain.checkpoint_io import CheckpointError
    from tasktrain.cli.main import main
    from tasktrain.strategies.fsdp import convert_fsdp_checkpoint, convert_to_fsdp

    class Small(TaskModule):
        def __init__(self):
            super().__init__()
            self.save_hyperparameters()
            self.body = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.Tanh(), torch.nn.Linear(5, 1))

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.mse_loss(self.body(x), y)

        def configure_optimizers(self):
            weights = [p for n, p in self.named_parameters() if n.endswith("weight")]
            biases = [p for n, p in self.named_parameters() if n.endswith("bias")]
            optimizer = torch.optim.AdamW([{"params": weights}, {"params": biases, "weight_decay": 0.0}], lr=0.01)
            scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    data = torch.utils.data.TensorDataset(torch.randn(24, 3), torch.randn(24, 1))

    def fit(root, steps, strategy="auto", ckpt_path=None, **kwargs):
        trainer = Trainer(strategy=strategy, accelerator="cpu", devices=1, max_steps=steps, logger=False,
                          enable_progress_bar=False, num_sanity_val_steps=0, default_root_dir=str(tmp_path / root),
                          **kwargs)
        trainer.fit(Small(), torch.utils.data.DataLoader(data, batch_size=4, shuffle=True), ckpt_path=ckpt_path)
        return trainer

    trainer = fit("plain", 3, callbacks=[ModelCheckpoint(save_last=True)])
    saved = trainer.checkpoint_callback.last_model_path
    assert main(["convert", saved, str(tmp_path / "run.fsdp"), "--to", "fsdp"]) == 0
    assert {".metadata", "__0_0.distcp", "tasktrain_state.pt"} == set(os.listdir(tmp_path / "run.fsdp"))
    assert main(["convert", str(tmp_path / "run.fsdp"), str(tmp_path / "back.ckpt"), "--to", "ckpt"]) == 0
    original, back = (torch.load(p, weights_only=True) for p in (saved, tmp_path / "back.ckpt"))
    assert original["optimizer_states"][0]["state"][0]["exp_avg"].abs().sum() > 0  # Adam has stepped: not zeros
    assert original.keys() == back.keys()
    for key in original:
        _same(original[key], back[key], key)
    # the directory is FSDP's own layout: an FSDP fit resumes it (on one process here; tests above: on 2)
    resumed = fit("fsdp", 5, strategy="fsdp", enable_checkpointing=False, ckpt_path=str(tmp_path / "run.fsdp"))
    assert resumed.global_step == 5 and resumed.lr_scheduler_configs[0].scheduler.last_epoch == 5  # 3 carried

    # wrong inputs: each refused with what to do instead (an FSDP fit from the plain file itself included)
    with pytest.raises(CheckpointError, match=r"tasktrain convert FILE DIR --to fsdp, then fit\(ckpt_path=DIR\)"):
        fit("refused", 5, strategy="fsdp", enable_checkpointing=False, ckpt_path=saved)
    capsys.readouterr()
    assert main(["convert", str(tmp_path / "run.fsdp"), str(tmp_path / "x"), "--to", "fsdp"]) == 2
    assert "is a directory: --to fsdp takes one checkpoint file" in capsys.readouterr().err
    fake_deepspeed = tmp_path / "ds"
    fake_deepspeed.mkdir()
    (fake_deepspeed / "latest").write_text("global_step3")
    assert main(["convert", str(fake_deepspeed), str(tmp_path / "x"), "--to", "fsdp"]) == 2
    assert "a DeepSpeed checkpoint directory goes to one file first" in capsys.readouterr().err
    assert main(["convert", str(tmp_path / "run.fsdp"), str(tmp_path / "x"), "--to", "deepspeed"]) == 2
    assert "An FSDP checkpoint directory goes to one file first" in capsys.readouterr().err
    weights_only = tmp_path / "weights.ckpt"
    convert_fsdp_checkpoint(tmp_path / "run.fsdp", weights_only)
    with pytest.raises(CheckpointError, match="holds no optimizer state with the names of its parameters"):
        convert_to_fsdp(weights_only, tmp_path / "x")
    accelerator_like = tmp_path / "accelerator_state_dir"
    accelerator_like.mkdir()
    (accelerator_like / ".metadata").write_bytes(b"")
    (accelerator_like / "accelerator_state.pt").write_bytes(b"")
    with pytest.raises(CheckpointError, match="holds DCP shards but no tasktrain_state.pt.*load_state"):
        convert_fsdp_checkpoint(accelerator_like, tmp_path / "x", optimizer=True)
    assert not os.path.exists(tmp_path / "x")
