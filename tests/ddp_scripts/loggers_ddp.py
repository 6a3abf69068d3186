"""Helper for tests/test_loggers.py: every logger on 2 DDP processes (self-launched), rank 0 writing alone.

    python loggers_ddp.py OUT      # writes OUT/rank{R}.json with what each rank saw; logs under OUT/logs
"""
import json
import os
import sys

import torch
from torch.utils.data import DataLoader, TensorDataset

import common
from tasktrain import ModelCheckpoint, TaskModule, Trainer
from tasktrain.loggers import CometLogger, CSVLogger, MLFlowLogger, TensorBoardLogger, WandbLogger

out = sys.argv[1]
logs = os.path.join(out, "logs")
os.environ["COMET_ERROR_TRACKING_ENABLE"] = "false"  # (comet_ml's error reports to its server: off, no network here)


class Regression(TaskModule):
    def __init__(self):
        super().__init__()
        self.save_hyperparameters()
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(3, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.log("loss", loss)
        self.log("square", float(self.global_step + 1) ** 2)
        # what user code does on every rank: rank 0 writes, the others get a do-nothing stand-in
        self.trainer.loggers[1].experiment.add_text("note", f"rank {self.global_rank}", self.global_step)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


loggers = [WandbLogger(project="ddp", save_dir=logs, offline=True),
           TensorBoardLogger(logs, name="tb"),
           CSVLogger(logs, name="csv"),
           MLFlowLogger(experiment_name="ddp", tracking_uri="file:" + os.path.join(logs, "mlruns")),
           # made with the logger on rank 0 only (Lightning's rule), before the Trainer starts the other process
           CometLogger(online=False, offline_directory=os.path.join(logs, "comet"), project="ddp",
                       log_env_details=False, log_code=False, log_git_metadata=False, log_git_patch=False,
                       auto_output_logging=False, display_summary_level=0)]
checkpoint = ModelCheckpoint()
trainer = Trainer(strategy="ddp", devices=2, accelerator="cpu", max_epochs=1, log_every_n_steps=1,
                  logger=loggers, callbacks=[checkpoint], enable_progress_bar=False)
x, y = common.regression_data()
trainer.fit(Regression(), DataLoader(TensorDataset(x, y), batch_size=4))
facts = {
    "rank": trainer.global_rank,
    "experiments": [type(lg.experiment).__name__ for lg in loggers],
    "checkpoint_dir": checkpoint.dirpath_resolved(trainer),
    "log_dir": trainer.log_dir,
    "wandb_id": loggers[0].version,
    "mlflow_run_id": loggers[3]._run_id,
    "comet_key": loggers[4].version,
}
if trainer.is_global_zero:
    loggers[0].experiment.finish()
    loggers[4].experiment.end()  # writes logs/comet/<key>-<suffix>.zip
with open(os.path.join(out, f"rank{trainer.global_rank}.json"), "w") as f:
    json.dump(facts, f)
