"""What the multi-process tests share: a clean environment for children, and the single-process reference."""
import os
import socket
import subprocess
import sys
import time

import torch
from torch.utils.data import DistributedSampler

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK", "MASTER_ADDR",
               "MASTER_PORT", "TORCHELASTIC_RUN_ID")


def child_env(**extra):
    """os.environ without any launcher's or tasktrain's variables (a test must not inherit a world)."""
    env = {k: v for k, v in os.environ.items()
           if k not in LAUNCH_VARS and not k.startswith(("TASKTRAIN_", "SLURM_"))}
    env.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(ROOT, ".cache", "torch_extensions"))
    env["OMP_NUM_THREADS"] = "1"  # two ranks on a shared 2-core machine
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def script(name):
    return os.path.join(HERE, name)


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(args, timeout, cwd, env=None):
    """Run a command to completion; a run past `timeout` is killed (with its process group) and fails."""
    start = time.monotonic()
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=child_env(**(env or {})), cwd=cwd, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, err = proc.communicate()
        raise AssertionError(f"{args} did not finish within {timeout} s.\nstdout:\n{out}\nstderr:\n{err}") from None
    return proc.returncode, out, err, time.monotonic() - start


def torchrun(*args):
    return [sys.executable, "-m", "torch.distributed.run", *args]


def regression_data():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(32, 3, generator=g)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5]]) + 0.1 * torch.randn(32, 1, generator=g)
    return x, y


def ddp_order(n, epoch, seed=0, world_size=2):
    """The epoch's global order of the Trainer's (Lightning's) training sampler under DDP, even of a sequential
    loader: DistributedSampler(shuffle=True, seed) per rank, interleaved (rank r reads positions r, r + W, ...), so
    the global batch of step b (each rank's b-th batch of B) is positions [b * W * B, (b + 1) * W * B) of it."""
    ranks = []
    for rank in range(world_size):
        sampler = DistributedSampler(range(n), num_replicas=world_size, rank=rank, shuffle=True, seed=seed)
        sampler.set_epoch(epoch)
        ranks.append(list(sampler))
    return torch.tensor([index for group in zip(*ranks) for index in group])


class DDPOrder(DistributedSampler):
    """ddp_order(n, epoch) as the sampler of a one-process reference fit of what 2 DDP ranks read together (a
    DistributedSampler of one replica, so that the Trainer keeps it and calls its set_epoch)."""

    def __init__(self, n):
        super().__init__(range(n), num_replicas=1, rank=0, shuffle=False)

    def __iter__(self):
        return iter(ddp_order(len(self.dataset), self.epoch).tolist())


def reference_params(batch_size=8, steps=4, lr=0.1):
    """One process, plain torch: SGD on the global batches of `batch_size` in the order 2 DDP ranks x 4 of the
    Trainer read (ddp_order of seed 0, a new permutation each epoch), what their run must equal."""
    x, y = regression_data()
    torch.manual_seed(0)
    layer = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(layer.parameters(), lr=lr)
    per_epoch = len(x) // batch_size
    for b in range(steps):
        epoch, b = divmod(b, per_epoch)
        sl = ddp_order(len(x), epoch)[b * batch_size:(b + 1) * batch_size]
        opt.zero_grad()
        torch.nn.functional.mse_loss(layer(x[sl]), y[sl]).backward()
        opt.step()
    return [p.detach().flatten().tolist() for p in layer.parameters()]


def finetuning_reference(batch_size=8, epochs=3, lr=0.1):
    """One process, plain torch: what BackboneFinetuning(unfreeze_backbone_at_epoch=1) does to a Linear backbone and
    head (the head alone in epoch 0; then the backbone as a second group at lr/10, doubled each epoch), on the
    global batches of 2 DDP ranks (ddp_order)."""
    x, y = regression_data()
    torch.manual_seed(0)
    backbone, head = torch.nn.Linear(3, 3), torch.nn.Linear(3, 1)
    backbone.requires_grad_(False)
    opt = torch.optim.SGD(head.parameters(), lr=lr)
    for epoch in range(epochs):
        if epoch == 1:
            backbone.requires_grad_(True)
            opt.add_param_group({"params": list(backbone.parameters()), "lr": lr * 0.1})
        elif epoch > 1:
            opt.param_groups[1]["lr"] = min(2 * opt.param_groups[1]["lr"], lr)
        order = ddp_order(len(x), epoch)
        for b in range(len(x) // batch_size):
            opt.zero_grad()
            sl = order[b * batch_size:(b + 1) * batch_size]
            torch.nn.functional.mse_loss(head(backbone(x[sl])), y[sl]).backward()
            opt.step()
    return [p.detach().flatten().tolist() for p in (*backbone.parameters(), *head.parameters())]


def process_gone(pid):
    """True when `pid` no longer runs (gone, or a zombie nobody reaped yet)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return any(line.startswith("State:") and "Z" in line.split()[1] for line in f)
    except FileNotFoundError:
        return True
