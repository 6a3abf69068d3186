"""Helper for tests/test_watchdog.py: two ranks under torchrun (or any launcher's variables), no Trainer.

    torchrun --nproc_per_node 2 loop.py OUT stall|store

stall: the watchdog on its own first: a step loop over plain torch.distributed that marks progress, where rank 1
       spends 3 x stall_timeout in a long event while rank 0 waits for it in an all_reduce (no verdict may come).
       Then an Accelerator loop over a prepared loader, in which rank 1 sleeps forever at batch 3.
store: rank 0 SIGKILLs itself; rank 1 sits in a long event, so only the lost store (under torchrun it lives in
       the agent, so this case starts the ranks itself: see the test) can end it.
Every rank writes OUT/pid{R}; the rank that hangs writes OUT/stuck (time.time()) just before.
"""
import datetime
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

from tasktrain.strategies.watchdog import start_watchdog

out, mode = sys.argv[1], sys.argv[2]
STALL = 2.0
# the Accelerator part: set-up (imports, prepare's collectives) may take over 2 s on one rank of a loaded 2-core
# machine, and a verdict there would end the run before rank 1 reaches its hang
ACCELERATOR_STALL = 5.0
rank = int(os.environ["RANK"])


def hang():
    with open(os.path.join(out, "stuck"), "w") as f:
        f.write(repr(time.time()))


dist.init_process_group("gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=120))
with open(os.path.join(out, f"pid{rank}"), "w") as f:
    f.write(str(os.getpid()))
watchdog = start_watchdog(rank, 2, STALL)
watchdog.arm(STALL, out)
for step in range(4):
    watchdog.mark("step", step, step)
    if mode == "stall" and rank == 1 and step == 2:
        with watchdog.long_event("slow save"):
            time.sleep(3 * STALL)
    if mode == "store" and step == 2:
        if rank == 0:
            os.kill(os.getpid(), signal.SIGKILL)
        hang()
        with watchdog.long_event("waiting for nothing"):
            time.sleep(10_000)
    dist.all_reduce(torch.ones(1))
watchdog.disarm()

from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from tasktrain import Accelerator  # noqa: E402

accelerator = Accelerator(cpu=True, stall_timeout=ACCELERATOR_STALL)
assert accelerator._watchdog is watchdog  # one watchdog per process group
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
data = DataLoader(TensorDataset(torch.randn(64, 4)), batch_size=2)
model, optimizer, data = accelerator.prepare(model, optimizer, data)
for batch_idx, (x,) in enumerate(data):
    if rank == 1 and batch_idx == 3:
        hang()
        time.sleep(10_000)  # rank 1 hangs here, inside the loop over a prepared loader
    accelerator.backward(model(x).pow(2).mean())
    optimizer.step()
    optimizer.zero_grad()
