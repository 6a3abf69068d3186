"""A worker for tests/test_launch.py, started by `tasktrain launch`.

    launch_worker.py OUT_DIR [world]      form the world on gloo, check it, write OUT_DIR/rank{R}.json
    launch_worker.py OUT_DIR fail CODE    rank 1 exits with CODE, the others wait to be stopped by the launcher
                                          (no torch: starts fast)
    launch_worker.py OUT_DIR env          only write the variables and arguments seen (no torch)
    launch_worker.py OUT_DIR world+trainer  world, then, in the same processes and process group,
                                          tests/launch_trainer_worker.py into OUT_DIR/trainer (one launch, two tests)

rank{R}.json holds the rank and world size, the launcher's variables this worker saw, its arguments, and the
weights after one SGD step on gradients averaged over all ranks (every rank must hold the same weights).
"""
import json
import os
import sys

out_dir, mode = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else "world")

if mode == "fail":
    if os.environ["RANK"] == "1":
        sys.exit(int(sys.argv[3]))
    import time

    time.sleep(60)  # torchrun stops this one with SIGTERM when rank 1 fails; its -15 must not be the exit code
    sys.exit(0)


def write(seen):
    tmp = os.path.join(out_dir, f"rank{seen['rank']}.json.tmp")
    with open(tmp, "w") as f:
        json.dump(seen, f)
    os.replace(tmp, os.path.join(out_dir, f"rank{seen['rank']}.json"))


if mode == "env":
    write({"rank": int(os.environ["RANK"]), "argv": sys.argv[1:],
           "env": {k: v for k, v in os.environ.items() if k.startswith("TASKTRAIN_")}})
    sys.exit(0)

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
assert world == int(os.environ["WORLD_SIZE"]), (world, os.environ["WORLD_SIZE"])

total = torch.tensor([float(rank)])
dist.all_reduce(total)
assert total.item() == world * (world - 1) / 2, (total.item(), world)

# One SGD step: the same start everywhere (seed), different data per rank, gradients averaged like DDP does.
torch.manual_seed(0)
model = torch.nn.Linear(3, 1)
x = torch.arange(6, dtype=torch.float32).reshape(2, 3) + rank
model(x).pow(2).mean().backward()
for p in model.parameters():
    dist.all_reduce(p.grad)
    p.grad /= world
torch.optim.SGD(model.parameters(), lr=0.01).step()

seen = {
    "rank": rank,
    "world_size": world,
    "local_rank": int(os.environ["LOCAL_RANK"]),
    "group_rank": int(os.environ["GROUP_RANK"]),
    "master_addr": os.environ["MASTER_ADDR"],
    "env": {k: v for k, v in os.environ.items() if k.startswith("TASKTRAIN_")},
    "argv": sys.argv[1:],
    "weight": model.weight.detach().flatten().tolist(),
    "bias": model.bias.detach().tolist(),
}
write(seen)

del model
if mode == "world+trainer":  # the Trainer takes the group as it is, as it takes one a user's script made
    import runpy

    os.makedirs(os.path.join(out_dir, "trainer"), exist_ok=True)
    sys.argv = [sys.argv[0], os.path.join(out_dir, "trainer")]
    runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), "launch_trainer_worker.py"))
dist.destroy_process_group()
