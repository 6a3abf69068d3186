"""Helper for tests/test_lightning_ddp.py: lightning_compat_ddp.py's fits first (OUT/compat/), then issue 17's
callbacks, profiler and refusals on 2 DDP processes (self-launched), several fits in one process group; then, in the
same processes and group, optimization_hooks.py's two fits (DDP, then DeepSpeed ZeRO stage 2), writing under OUT/hooks
(they were a launch of their own: two more interpreters importing torch and tasktrain, ~4 s of CPU each).

    python extras_ddp.py OUT      # writes OUT/rank{R}.json with what each rank saw, OUT/compat/ and OUT/hooks/
"""
import json
import os
import sys
from datetime import timedelta

import torch
from torch.utils.data import DataLoader, TensorDataset

import common
from tasktrain import (BackboneFinetuning, BasePredictionWriter, CSVLogger, EMAWeightAveraging,
                       GradientAccumulationScheduler, ModelCheckpoint, OnExceptionCheckpoint, StochasticWeightAveraging,
                       TaskModule, ThroughputMonitor, Trainer)
from tasktrain.profilers import SimpleProfiler
from tasktrain.callbacks import BatchSizeFinder, LearningRateFinder
from tasktrain.exceptions import MisconfigurationException
from tasktrain.tuner import Tuner

out = sys.argv[1]

# 0. First, lightning_compat_ddp.py's fits (issue 25, under strategy="ddp_find_unused_parameters_true"), writing
# OUT/compat/rank{R}.json: they were a launch of their own (two more interpreters, ~5 s of CPU). First because they
# check Lightning's warnings that come once per name per process (the sync_dist one) and need no seed_everything
# before them (none is called in this script).
import lightning_compat_ddp  # noqa: E402

os.makedirs(os.path.join(out, "compat"), exist_ok=True)
lightning_compat_ddp.main(os.path.join(out, "compat"), "ddp_find_unused_parameters_true")


class Regression(TaskModule):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(3, 1)

    def forward(self, x):
        return self.layer(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def predict_step(self, batch, batch_idx):  # the default, Lightning's, would give forward the (x, y) pair
        return self(batch[0])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Indices(BasePredictionWriter):
    def __init__(self):
        super().__init__("batch")
        self.seen = []

    def write_on_batch_end(self, trainer, module, prediction, batch_indices, batch, batch_idx, dataloader_idx):
        self.seen += batch_indices


x, y = common.regression_data()
data = DataLoader(TensorDataset(x, y), batch_size=4)  # 32 samples: 4 batches of 4 per rank
common_args = dict(strategy="ddp", devices=2, accelerator="cpu", enable_progress_bar=False)
facts = {}

# 1. EMA, throughput, a time schedule (zero interval: due at each check) and a per-rank profiler, one fit
logger = CSVLogger(os.path.join(out, "logs"))
ema = EMAWeightAveraging(decay=0.5)
saves = ModelCheckpoint(dirpath=os.path.join(out, "ckpt"), train_time_interval=timedelta(0), save_top_k=-1)
monitor = ThroughputMonitor(batch_size_fn=lambda batch: batch[0].shape[0], window_size=2, step_split=True)
module = Regression()
trainer = Trainer(max_epochs=2, logger=logger, log_every_n_steps=2, callbacks=[ema, saves, monitor],
                  profiler=SimpleProfiler(dirpath=os.path.join(out, "prof"), filename="perf"), **common_args)
trainer.fit(module, data)
facts["rank"] = trainer.global_rank
facts["weights"] = module.layer.weight.flatten().tolist()
facts["global_step"] = trainer.global_step
facts["saved"] = sorted(os.listdir(os.path.join(out, "ckpt")))
facts["devices"] = [trainer.device_ids, trainer.num_devices, trainer.distributed_sampler_kwargs,  # issue 37
                   type(trainer.accelerator).__name__]

# 2. GradientAccumulationScheduler: windows of 1 then 2
trainer = Trainer(max_epochs=2, logger=False, enable_checkpointing=False, enable_model_summary=False,
                  callbacks=[GradientAccumulationScheduler({1: 2})], **common_args)
trainer.fit(Regression(), data)
facts["accumulated_steps"] = trainer.global_step

# 3. a prediction writer: each rank's own dataset indices
writer = Indices()
Trainer(logger=False, enable_checkpointing=False, callbacks=[writer], **common_args).predict(Regression(), data)
facts["predict_indices"] = writer.seen

# 4. BackboneFinetuning: the backbone unfrozen at epoch 1 trains in step on both ranks (DDP's wrapper rebuilt)
class WithBackbone(TaskModule):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.backbone, self.head = torch.nn.Linear(3, 3), torch.nn.Linear(3, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.head(self.backbone(x)), y)

    def configure_optimizers(self):
        return torch.optim.SGD(filter(lambda p: p.requires_grad, self.parameters()), lr=0.1)


module = WithBackbone()
Trainer(max_epochs=3, logger=False, enable_checkpointing=False, enable_model_summary=False,
        callbacks=[BackboneFinetuning(unfreeze_backbone_at_epoch=1)], **common_args).fit(module, data)
facts["finetuned"] = [p.detach().flatten().tolist() for p in module.parameters()]

# 5. StochasticWeightAveraging with BatchNorm: the statistics recomputed on each rank's shard, then merged
class WithBatchNorm(Regression):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.BatchNorm1d(3)

    def forward(self, x):
        return self.layer(self.norm(x))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self(x), y)


module = WithBatchNorm()
Trainer(max_epochs=2, logger=False, enable_checkpointing=False, enable_model_summary=False,
        callbacks=[StochasticWeightAveraging(swa_lrs=0.05, swa_epoch_start=2)], **common_args).fit(module, data)
facts["swa_norm"] = [module.norm.running_mean.tolist(), module.norm.running_var.tolist()]

# 6. what refuses several processes, on every rank alike
refusals = []
try:
    Trainer(max_epochs=1, logger=False, callbacks=[OnExceptionCheckpoint(out)],
            **common_args).fit(Regression(), data)
except ValueError as err:
    refusals.append(str(err))
try:  # the batch-size search: refused on several processes (Lightning's rule and words), the Tuner's and the callback's
    Tuner(Trainer(max_epochs=1, logger=False, enable_checkpointing=False, **common_args)).scale_batch_size(Regression())
except ValueError as err:
    refusals.append(str(err))
try:
    Trainer(max_epochs=1, logger=False, enable_checkpointing=False, callbacks=[BatchSizeFinder()],
            **common_args).fit(Regression())
except MisconfigurationException as err:
    refusals.append(str(err))
facts["refusals"] = refusals

# 6b. the learning-rate sweep runs on both ranks (Lightning's): each trains on its shard, rank 0's results are every
# rank's, so the suggestion and the rate set are the same; the weights are put back
tuned = Regression()
tuned.lr = 0.05
before = [p.detach().clone() for p in tuned.parameters()]
finder = Tuner(Trainer(max_epochs=50, logger=False, enable_checkpointing=False, enable_model_summary=False,
                       **common_args)).lr_find(tuned, data, min_lr=1e-3, max_lr=1.0, num_training=20,
                                               early_stop_threshold=None)
facts["lr_find"] = {"lr": finder.results["lr"], "loss": finder.results["loss"], "suggestion": finder.suggestion(),
                    "set": tuned.lr, "restored": all(torch.equal(a, b) for a, b in zip(before, tuned.parameters()))}
# the callback, inside a fit: the sweep's trial leaves the fit's DDP wrapper whole, the fit goes on at rank 0's suggestion
tuned = Regression()
tuned.lr = 0.05
callback = LearningRateFinder(min_lr=1e-3, max_lr=1.0, num_training_steps=20, early_stop_threshold=None)
trainer = Trainer(max_epochs=5, logger=False, enable_checkpointing=False, enable_model_summary=False,
                  callbacks=[callback], **common_args)
trainer.fit(tuned, data)
facts["lr_finder_callback"] = {"lr": callback.optimal_lr.results["lr"], "loss": callback.optimal_lr.results["loss"],
                               "set": tuned.lr, "rate": trainer.optimizers[0].param_groups[0]["lr"],
                               "global_step": trainer.global_step,
                               "weights": [p.detach().flatten().tolist() for p in tuned.parameters()]}

# 7. ThroughputMonitor's step split per rank against a hand count: the monitor's clock moves only by each rank's own
# phases (binary fractions, rank 1's forward twice rank 0's), so rank 0's gathered split is exact for both ranks
from tasktrain.callbacks import throughput_monitor


class FakeClock:
    now = 0.0

    def perf_counter(self):
        return self.now


clock = FakeClock()


def clocked_collate(items):
    clock.now += 1 / 32  # the data wait
    return [torch.stack(t) for t in zip(*items)]


class Clocked(Regression):
    def training_step(self, batch, batch_idx):
        clock.now += (1 + self.global_rank) / 4  # forward
        loss = super().training_step(batch, batch_idx)
        loss.register_hook(lambda grad: setattr(clock, "now", clock.now + 1 / 8))  # backward
        return loss

    def configure_optimizers(self):
        optimizer = super().configure_optimizers()
        optimizer.register_step_post_hook(lambda *args: setattr(clock, "now", clock.now + 1 / 16))  # optimizer
        return optimizer


real_time, throughput_monitor.time = throughput_monitor.time, clock
try:
    Trainer(max_steps=4, logger=CSVLogger(os.path.join(out, "clock_logs")), log_every_n_steps=2,
            enable_checkpointing=False, enable_model_summary=False,
            callbacks=[ThroughputMonitor(batch_size_fn=lambda batch: batch[0].shape[0], window_size=2,
                                         step_split=True)],
            **common_args).fit(Clocked(), DataLoader(TensorDataset(x, y), batch_size=4, collate_fn=clocked_collate))
finally:
    throughput_monitor.time = real_time

with open(os.path.join(out, f"rank{facts['rank']}.json"), "w") as f:
    json.dump(facts, f)

import optimization_hooks  # noqa: E402  (its own fits, after the ones above)

os.makedirs(os.path.join(out, "hooks"), exist_ok=True)
optimization_hooks.main(os.path.join(out, "hooks"))
