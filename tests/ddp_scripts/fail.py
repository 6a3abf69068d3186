"""Helper for tests/test_ddp_failures.py: a 2-rank run in which one rank fails at step 3.

    python fail.py OUT raise|kill|kill0 [spawn]     # self-launched (or ddp_spawn)
    torchrun --nproc_per_node 2 fail.py OUT raise

raise: rank 1 raises ValueError; kill: rank 1 SIGKILLs itself; kill0: rank 0 SIGKILLs itself.
Every rank writes OUT/pid{R} when training starts, so the test can check that no process is left behind.
"""
import os
import signal
import sys

import torch
from torch.utils.data import DataLoader, TensorDataset

from tasktrain import TaskModule, Trainer

out, mode = sys.argv[1], sys.argv[2]
strategy = sys.argv[3] if len(sys.argv) > 3 else "ddp"


class Failing(TaskModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def on_train_start(self):
        with open(os.path.join(out, f"pid{self.global_rank}"), "w") as f:
            f.write(str(os.getpid()))

    def training_step(self, batch, batch_idx):
        victim = 0 if mode == "kill0" else 1
        if self.global_rank == victim and self.global_step == 3:
            if mode == "raise":
                raise ValueError("boom at step 3 on rank 1")
            os.kill(os.getpid(), signal.SIGKILL)
        return self.layer(batch[0]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


if __name__ == "__main__":
    data = TensorDataset(torch.randn(64, 4))
    trainer = Trainer(strategy=strategy, devices="auto" if "RANK" in os.environ else 2, accelerator="cpu",
                      max_epochs=1000, logger=False, enable_progress_bar=False, enable_checkpointing=False)
    module = Failing()
    try:
        trainer.fit(module, DataLoader(data, batch_size=4))
    except BaseException as err:
        if strategy == "ddp_spawn":  # Lightning's type (torch's) and a RuntimeError, as tasktrain raised before
            print(f"parent caught: torch's {isinstance(err, torch.multiprocessing.ProcessRaisedException)}, "
                  f"RuntimeError {isinstance(err, RuntimeError)}, rank {err.error_index}, "
                  f"pid given {err.error_pid > 0}, message {str(err)!r}", flush=True)
        raise
    finally:
        if strategy == "ddp_spawn":  # the parent, after its children failed: Lightning's trainer still names the run
            print(f"parent: lightning_module is the module: {trainer.lightning_module is module}, "
                  f"fn={trainer.state.fn.value}, status={trainer.state.status.value}", flush=True)
