"""Helper for tests/test_ddp.py: strategy="ddp_spawn" from a plain script; the parent records what it got back.

    python spawn_fit.py OUT      -> OUT/parent.json
"""
import json
import os
import sys

import torch
from torch.utils.data import DataLoader, TensorDataset

import common
from tasktrain import Callback, TaskModule, Trainer


class Regression(TaskModule):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(3, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.log("train_loss", loss)
        return loss

    def predict_step(self, batch, batch_idx):
        return self.layer(batch[0])[:, 0]

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class RecordLauncher(Callback):
    """In each spawned child: what trainer.strategy.launcher is there (Lightning's child keeps its launcher)."""

    def __init__(self, out):
        self.out = out

    def on_fit_start(self, trainer, pl_module):
        from tasktrain.strategies.launchers import _MultiProcessingLauncher

        launcher = trainer.strategy.launcher
        try:
            launcher.launch(print, trainer=trainer)
            relaunch = "ran"
        except NotImplementedError:
            relaunch = "refused"
        with open(os.path.join(self.out, f"child{trainer.global_rank}.json"), "w") as f:
            json.dump({"multiprocessing": isinstance(launcher, _MultiProcessingLauncher),
                       "interactive": launcher.is_interactive_compatible, "relaunch": relaunch}, f)


def regression_data():
    return TensorDataset(*common.regression_data())


if __name__ == "__main__":
    out = sys.argv[1]
    model = Regression()
    trainer = Trainer(strategy="ddp_spawn", devices=2, accelerator="cpu", max_epochs=1, logger=False,
                      enable_progress_bar=False, enable_checkpointing=False, callbacks=[RecordLauncher(out)])
    trainer.fit(model, DataLoader(regression_data(), batch_size=4))
    train_loss = float(trainer.callback_metrics["train_loss"])
    x = regression_data().tensors[0][:11]
    predictions = trainer.predict(model, DataLoader(TensorDataset(x), batch_size=3), gather=True)
    # without gather=True a spawned predict returns None, as Lightning's (its children keep their predictions)
    plain = trainer.predict(model, DataLoader(TensorDataset(x), batch_size=3))
    facts = {
        "params": [p.detach().flatten().tolist() for p in model.parameters()],
        "global_step": trainer.global_step,
        "train_loss": train_loss,
        "predictions": predictions.tolist(),
        "expected_predictions": model.layer(x)[:, 0].tolist(),
        "parent_env_rank": os.environ.get("RANK"),
        "plain_predict": plain,
    }
    with open(os.path.join(out, "parent.json"), "w") as f:
        json.dump(facts, f)
