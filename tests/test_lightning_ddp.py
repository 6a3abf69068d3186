"""Issue 17's callbacks, profiler and refusals on 2 real processes (DDP, gloo, self-launched): one script run,
facts per rank read back; the module's optimization hooks under DDP and DeepSpeed ZeRO-2, and issue 25's Lightning
scripts (a GAN, torchmetrics, ModelCheckpoint's writes, samplers), in the same launch."""
import csv
import glob
import json
import os
import sys

import pytest
import torch

from helpers import quiet

from ddp_scripts import common
from ddp_scripts.common import run, script


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    out = tmp_path_factory.mktemp("extras_ddp")
    code, stdout, stderr, _ = run([sys.executable, script("extras_ddp.py"), str(out)], 420, str(out))
    assert code == 0, f"stdout:\n{stdout}\nstderr:\n{stderr}"
    return out, [json.load(open(out / f"rank{r}.json")) for r in (0, 1)], stdout


@pytest.mark.world_size(2)
@pytest.mark.timeout(480)
def test_callbacks_profiler_and_refusals_on_two_processes(ran):
    out, facts, stdout = ran
    # EMA: the same average on both ranks (the replicas step together)
    assert facts[0]["weights"] == facts[1]["weights"] and facts[0]["global_step"] == 8
    # Lightning's values for DDP on 2 CPU processes (its device_ids: each parallel device's index, or its position)
    for rank in (0, 1):
        assert facts[rank]["devices"] == [[0, 1], 2, {"num_replicas": 2, "rank": rank}, "CPUAccelerator"]
    # the time schedule (a zero interval), decided by rank 0 at every optimizer step as Lightning: the same files
    assert facts[0]["saved"] == facts[1]["saved"] == [f"epoch={(s - 1) // 4}-step={s}.ckpt" for s in range(1, 9)]
    # ThroughputMonitor: rank 0 writes; the global rates are the device's times the world size
    (metrics,) = glob.glob(str(out / "logs" / "*" / "version_0" / "metrics.csv"))
    rows = [r for r in csv.DictReader(open(metrics)) if r.get("train/samples")]
    assert [float(r["train/samples"]) for r in rows] == [8, 16, 24, 32]  # this device's samples
    for r in rows[1:]:
        assert float(r["train/samples_per_sec"]) == pytest.approx(2 * float(r["train/device/samples_per_sec"]))
    # its step split: both ranks' phases, gathered at the log steps (a save made at a log step, after the write,
    # is the next interval's checkpoint time)
    phases = ("data_wait", "forward", "backward", "optimizer", "checkpoint", "other")
    assert all(float(r[f"train/split/rank{k}/{p}"]) >= 0 for r in rows for k in (0, 1) for p in phases)
    assert all(float(r[f"train/split/rank{k}/checkpoint"]) > 0 for r in rows[1:] for k in (0, 1))
    # the split against a hand count (a fake clock, extras_ddp.py's part 7): each rank's own phases, gathered on
    # rank 0; the first interval's first batch has no wait before it
    (metrics,) = glob.glob(str(out / "clock_logs" / "*" / "version_0" / "metrics.csv"))
    rows = [r for r in csv.DictReader(open(metrics)) if r.get("train/split/rank1/forward")]
    assert [int(r["step"]) for r in rows] == [1, 3]  # Lightning's step (batches_that_stepped)
    for r, wait in zip(rows, (1 / 64, 1 / 32)):
        for k in (0, 1):
            split = {p: float(r[f"train/split/rank{k}/{p}"]) for p in phases}
            assert split == {"data_wait": wait, "forward": (1 + k) / 4, "backward": 1 / 8, "optimizer": 1 / 16,
                             "checkpoint": 0.0, "other": 0.0}, (k, r["step"], split)
    # the profiler: one report per rank, named by local rank
    assert sorted(os.listdir(out / "prof")) == ["fit-perf-0.txt", "fit-perf-1.txt"]
    # the model summary: printed once, by rank 0
    assert stdout.count("Trainable params") == 1
    assert facts[0]["accumulated_steps"] == facts[1]["accumulated_steps"] == 4 + 2
    assert facts[0]["predict_indices"] == list(range(0, 32, 2)) and facts[1]["predict_indices"] == list(range(1, 32, 2))
    # an unfrozen backbone trains as one process with the whole batch would (torch's DDP built with it frozen
    # would leave its gradients unsynchronised: each rank's backbone would drift apart)
    reference = common.finetuning_reference()
    for rank_facts in facts:
        for got, want in zip(rank_facts["finetuned"], reference):
            assert got == pytest.approx(want, abs=1e-5)
    # SWA's BatchNorm statistics: each rank's shard merged into those of the whole training set, on both ranks
    x, _ = common.regression_data()
    mean, var = facts[0]["swa_norm"]
    assert facts[1]["swa_norm"][0] == pytest.approx(mean, abs=1e-6)
    assert facts[1]["swa_norm"][1] == pytest.approx(var, abs=1e-6)
    assert mean == pytest.approx(x.mean(0).tolist(), abs=1e-5)
    for rank_facts in facts:
        assert rank_facts["refusals"] == [  # (the batch-size search: Lightning's refusals, the Tuner's and the callback's)
            facts[0]["refusals"][0], "Tuning the batch size is currently not supported with distributed strategies.",
            "The Batch size finder is not supported with distributed strategies."]
        assert "one process only" in rank_facts["refusals"][0]
    # the learning-rate sweep ran on both ranks (Lightning's rule): rank 0's results on each, so the same suggestion,
    # set on each rank's module; the weights put back
    found = [rank_facts["lr_find"] for rank_facts in facts]
    assert found[0] == found[1] and len(found[0]["lr"]) == 20 and found[0]["restored"]
    assert found[0]["suggestion"] is not None and found[0]["set"] == found[0]["suggestion"] != 0.05
    # the callback inside a DDP fit: the same on both ranks, the fit went on (5 epochs of 4 steps) at the suggestion
    found = [rank_facts["lr_finder_callback"] for rank_facts in facts]
    assert found[0] == found[1] and len(found[0]["lr"]) == 20
    assert found[0]["set"] == found[0]["rate"] not in (0.05, 0.1) and found[0]["global_step"] == 20


def _warm_up_reference(steps=6, warmup=4, lr=0.1, clip=0.5):
    """One process, plain torch: what optimization_hooks.py's module does on 2 ranks x 8 (global batches of 16 in
    the Trainer's DDP order, common.ddp_order), with the warm-up of Lightning's docs after each step and clipping by
    norm."""
    x, y = common.regression_data()
    torch.manual_seed(0)
    layer = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(layer.parameters(), lr=lr)
    lrs = []
    for step in range(steps):
        lrs.append(opt.param_groups[0]["lr"])
        epoch, b = divmod(step, 2)
        sl = common.ddp_order(len(x), epoch)[b * 16:(b + 1) * 16]
        opt.zero_grad()
        torch.nn.functional.mse_loss(layer(x[sl]), y[sl]).backward()
        torch.nn.utils.clip_grad_norm_(layer.parameters(), clip)
        opt.step()
        if step + 1 < warmup:
            for group in opt.param_groups:
                group["lr"] = min(1.0, float(step + 2) / warmup) * lr
    return [p.detach().flatten().tolist() for p in layer.parameters()], lrs


@pytest.mark.world_size(2)
@pytest.mark.timeout(480)
def test_optimization_hooks_on_two_processes_under_ddp_and_deepspeed_stage_2(ran):
    # two fits in one process group (at the end of extras_ddp.py's launch): the module's optimizer_step (warm-up),
    # optimizer_zero_grad, backward (DDP only: DeepSpeed's engine runs its own) and configure_gradient_clipping
    hooks = ran[0] / "hooks"
    weights, lrs = _warm_up_reference()
    for name in ("ddp", "deepspeed_stage_2"):
        facts = [json.load(open(hooks / f"{name}.rank{r}.json")) for r in (0, 1)]
        for fact in facts:
            assert fact["global_step"] == 6 and fact["lrs"] == pytest.approx(lrs), name
            assert fact["weights"][0] == pytest.approx(weights[0], abs=1e-6), name
            assert fact["weights"][1] == pytest.approx(weights[1], abs=1e-6), name
            assert fact["counts"] == {"optimizer_zero_grad": 6, "backward": 6 if name == "ddp" else 0,
                                      "configure_gradient_clipping": 6}, name


# -- issue 25's Lightning scripts on 2 DDP processes (ddp_scripts/lightning_compat_ddp.py) -------------------------
@pytest.fixture(scope="module")
def ddp_facts(ran):
    """What each rank saw of ddp_scripts/lightning_compat_ddp.py's fits (issue 25: a GAN under manual optimisation,
    torchmetrics objects in self.log, ModelCheckpoint's writes, samplers without seed_everything), under
    strategy="ddp_find_unused_parameters_true": the first fits of extras_ddp.py's launch (they were a launch of their
    own, in tests/test_lightning_compat.py: two more interpreters, ~5 s of CPU)."""
    return [json.load(open(ran[0] / "compat" / f"rank{r}.json")) for r in (0, 1)]


@pytest.mark.world_size(2)
@pytest.mark.timeout(480)
def test_gan_with_two_optimizers_on_two_ddp_processes_trains_as_one_process(ddp_facts):
    from ddp_scripts.lightning_compat_ddp import fit_gan

    from ddp_scripts.common import DDPOrder

    # the reference: one process, the batches of both ranks together (each rank's loss is a mean over 4 samples,
    # DDP averages the gradients: the mean over the 8), in the order the ranks' shuffled DistributedSamplers read
    trainer, reference = fit_gan(8, sampler=DDPOrder(32), **quiet(enable_model_summary=False))
    assert trainer.global_step == 16  # 2 epochs x 4 batches x 2 optimizers, training_step(self, batch)
    for facts in ddp_facts:
        assert facts["global_step"] == 16
        for got, want in zip(facts["gan"], reference):
            assert got == pytest.approx(want, abs=1e-5)


@pytest.mark.world_size(2)
@pytest.mark.timeout(480)
def test_model_checkpoint_writes_on_rank_zero_only(ddp_facts):
    """Issue 37: on the other ranks of a multi-process run ModelCheckpoint writes no file (Lightning's rule), with
    save_last=True and save_last="link" alike; rank 0 writes them all."""
    zero, one = ddp_facts
    assert one["checkpoint_writes"] == [], one["checkpoint_writes"]
    assert "last.ckpt" in zero["checkpoint_writes"] and "epoch=0-step=2.ckpt" in zero["checkpoint_writes"]
    assert zero["checkpoint_files"] == one["checkpoint_files"]
    assert "last-v1.ckpt" in zero["checkpoint_files"]  # the second fit's last: a link, beside the first's


@pytest.mark.world_size(2)
@pytest.mark.timeout(480)
def test_ddp_without_seed_everything_shuffles_as_lightnings_distributed_sampler(ddp_facts):
    """Lightning's DistributedSampler gets seed PL_GLOBAL_SEED, 0 without seed_everything (not a draw): each rank
    trains on the batches DistributedSampler(seed=0) gives it, epoch by epoch."""
    from torch.utils.data.distributed import DistributedSampler

    for rank, facts in enumerate(ddp_facts):
        expected = []
        for epoch in (0, 1):
            sampler = DistributedSampler(range(12), num_replicas=2, rank=rank, shuffle=True, seed=0)
            sampler.set_epoch(epoch)
            order = list(sampler)
            expected += [[epoch, order[i:i + 2]] for i in range(0, len(order), 2)]
        assert facts["orders"]["train"] == expected, rank


@pytest.mark.world_size(2)
@pytest.mark.timeout(480)
def test_epoch_values_without_sync_dist_warn_once_per_name_on_rank_zero_as_lightning(ddp_facts):
    """Lightning's PossibleUserWarning (its words) when an epoch-level tensor is logged without sync_dist under a
    process group: on rank 0 only, once per name over both epochs; not for step values nor sync_dist ones."""
    zero, one = (facts["orders"]["warnings"] for facts in ddp_facts)
    recommended = [w for w in zero if w.startswith("It is recommended")]
    assert recommended == [
        f"It is recommended to use `self.log('{name}', ..., sync_dist=True)` when logging on epoch level in "
        "distributed setting to accumulate the metric across devices." for name in ("val_idx", "train_loss")]
    assert not [w for w in one if w.startswith("It is recommended")]


@pytest.mark.world_size(2)
@pytest.mark.timeout(480)
def test_a_shuffling_validation_loader_under_ddp_reads_lightnings_distributed_sampler(ddp_facts):
    """Lightning replaces a shuffling validation loader's sampler under DDP by DistributedSampler(shuffle=True,
    seed=0 without seed_everything; padded), its epoch set to the fit's epoch at each validation, and warns on rank 0."""
    from torch.utils.data.distributed import DistributedSampler

    for rank, facts in enumerate(ddp_facts):
        expected = []
        for epoch in (0, 1):
            sampler = DistributedSampler(range(11), num_replicas=2, rank=rank, shuffle=True, seed=0)
            sampler.set_epoch(epoch)
            order = list(sampler)  # 6 of the 11 on each rank: one sample read twice
            expected += [[epoch, order[i:i + 2]] for i in range(0, len(order), 2)]
        assert facts["orders"]["val"] == expected, rank
        shuffled = [w for w in facts["orders"]["warnings"] if "shuffling enabled" in w]
        assert shuffled == (["Your `val_dataloader`'s sampler has shuffling enabled, it is strongly recommended that "
                             "you turn shuffling off for val/test dataloaders."] if rank == 0 else [])


@pytest.mark.world_size(2)
@pytest.mark.timeout(480)
def test_a_logged_metric_on_two_processes_is_the_metric_over_the_whole_data_set(ddp_facts):
    pytest.importorskip("torchmetrics")
    from ddp_scripts.lightning_compat_ddp import Scored, class_data

    x, y = class_data()
    with torch.no_grad():
        whole = float((Scored()(x).argmax(-1) == y).float().mean())
    # each rank computed on its own shard; the metric's compute() synchronised them: the whole set's accuracy
    assert ddp_facts[0]["val_acc"] == ddp_facts[1]["val_acc"] == pytest.approx(whole, abs=1e-6)
    shard0 = float((Scored()(x[0::2]).argmax(-1) == y[0::2]).float().mean())
    assert shard0 != pytest.approx(whole)  # (the data makes the test able to fail: a shard alone differs)
