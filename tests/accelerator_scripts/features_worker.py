"""Run under `tasktrain launch --num_processes 2` (tests/test_accelerator_features.py): LocalSGD (averages against a
hand computation, drift between them, an exact resume between two averages), DDP communication hooks through
DistributedDataParallelKwargs (fp16 compression against the fp16-rounded mean, PowerSGD's low-rank gradient, an fp16
wrapper, the refusals on gloo), and the DDP strategy's post-local SGD with model_averaging_period in the Trainer.
Writes OUT_DIR/rank{R}.pt with what it measured; the test asserts on it."""
import copy
import os
import sys
import warnings

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from tasktrain import (Accelerator, DDPCommunicationHookType, DistributedDataParallelKwargs, TaskModule, Trainer,
                       seed_everything)
from tasktrain.local_sgd import LocalSGD

warnings.filterwarnings("ignore")
out_dir = sys.argv[1]
result = {}


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def both(tensor):
    """(2, n): rank 0's tensor, flattened, then rank 1's."""
    mine = tensor.detach().reshape(1, -1).contiguous()
    gathered = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, mine)
    return torch.cat(gathered)


data = TensorDataset(torch.randn(64, 4, generator=torch.Generator().manual_seed(3)),
                     torch.randn(64, 1, generator=torch.Generator().manual_seed(4)))


# -- LocalSGD --------------------------------------------------------------------------------------------------------
def local_sgd_run(state_dir, save_at=None, resume=False):
    """8 steps per rank inside one LocalSGD(local_sgd_steps=3); returns what each step saw and the final weights."""
    seed_everything(0)
    accelerator = Accelerator(stall_timeout=None)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)  # momentum: per-rank optimizer state
    loader = DataLoader(data, batch_size=4, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    if resume:
        accelerator.load_state(state_dir)
    steps = []
    with LocalSGD(accelerator=accelerator, model=model, local_sgd_steps=3) as local_sgd:
        for source, target in loader:
            loss = F.mse_loss(model(source), target)
            accelerator.backward(loss)
            grads = both(torch.cat([p.grad.reshape(-1) for p in model.parameters()]))
            optimizer.step()
            optimizer.zero_grad()
            before = both(flat(model))
            local_sgd.step()
            after = both(flat(model))
            hand_mean = (before[0] + before[1]) / 2
            steps.append({"num_steps": local_sgd.num_steps, "grads_equal": torch.equal(grads[0], grads[1]),
                          "equal_after": torch.equal(after[0], after[1]),
                          "vs_hand_mean": (after[accelerator.process_index] - hand_mean).abs().max().item(),
                          "changed": not torch.equal(before, after)})
            if save_at is not None and local_sgd.num_steps == save_at:
                accelerator.save_state(state_dir)
        local_final = both(flat(model))  # before the `with` ends (it averages then)
    return steps, local_final, both(flat(model))


state_dir = os.path.join(out_dir, "local_sgd_state")
steps, local_final, final = local_sgd_run(state_dir, save_at=5)
result["local_sgd_steps"] = steps
result["local_sgd_final_equal"] = torch.equal(final[0], final[1])
result["local_sgd_final_vs_mean"] = (final[0] - local_final.mean(0)).abs().max().item()
resumed_steps, resumed_local_final, resumed_final = local_sgd_run(state_dir, resume=True)
result["resumed_num_steps"] = [s["num_steps"] for s in resumed_steps]
result["resume_local_difference"] = (resumed_local_final - local_final).abs().max().item()
result["resume_final_difference"] = (resumed_final - final).abs().max().item()


# -- DDP communication hooks through DistributedDataParallelKwargs -----------------------------------------------
def hooked_steps(handler, steps):
    """`steps` steps of a Linear(16, 16) under the hook; per step, the all-reduced weight gradient of this rank and
    every rank's own gradient of the same batch (from an unwrapped copy: the exact local gradients)."""
    seed_everything(0)
    accelerator = Accelerator(kwargs_handlers=[handler], stall_timeout=None)
    model = torch.nn.Linear(16, 16)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer = accelerator.prepare(model, optimizer)
    plain = copy.deepcopy(accelerator.unwrap_model(model))
    seen = []
    for step in range(steps):
        source = torch.randn(8, 16, generator=torch.Generator().manual_seed(100 * step + accelerator.process_index))
        accelerator.backward(model(source).pow(2).mean())
        plain.load_state_dict(accelerator.unwrap_model(model).state_dict())
        plain.zero_grad()
        plain(source).pow(2).mean().backward()
        seen.append({"reduced": model.module.weight.grad.clone(),
                     "local": both(plain.weight.grad).reshape(2, 16, 16)})
        optimizer.step()
        optimizer.zero_grad()
    return seen


fp16 = hooked_steps(DistributedDataParallelKwargs(comm_hook=DDPCommunicationHookType.FP16), 2)[-1]
# the fp16 hook: each rank's gradient in fp16, divided by the world size, summed in fp16, back to fp32
hand = ((fp16["local"][0].half() / 2) + (fp16["local"][1].half() / 2)).float()
result["fp16_vs_hand"] = (fp16["reduced"] - hand).abs().max().item()
result["fp16_vs_exact"] = (fp16["reduced"] - fp16["local"].mean(0)).abs().max().item()
result["fp16_scale"] = fp16["local"].abs().max().item()

def _second_singular_value(matrix):
    values = torch.linalg.svdvals(matrix.double())
    return (values[1] / values[0]).item()


power_options = {"matrix_approximation_rank": 1, "start_powerSGD_iter": 2, "min_compression_rate": 1}
for name, handler in (
        ("power_sgd", DistributedDataParallelKwargs(comm_hook="power_sgd", comm_state_option=power_options)),
        ("power_sgd_fp16", DistributedDataParallelKwargs(comm_hook=DDPCommunicationHookType.POWER_SGD,
                                                         comm_wrapper=DDPCommunicationHookType.FP16,
                                                         comm_state_option=power_options))):
    seen = hooked_steps(handler, 3)
    warm, compressed = seen[0], seen[-1]  # before start_powerSGD_iter: a plain all-reduce; then rank 1 approximations
    result[name] = {
        "warmup_vs_exact": (warm["reduced"] - warm["local"].mean(0)).abs().max().item(),
        "vs_exact": (compressed["reduced"] - compressed["local"].mean(0)).abs().max().item(),
        # rank 1: the second singular value is nothing beside the first (fp16 rounding aside), unlike the exact mean's
        "second_singular_value": _second_singular_value(compressed["reduced"]),
        "exact_second_singular_value": _second_singular_value(compressed["local"].mean(0)),
        "equal_on_ranks": torch.equal(*both(compressed["reduced"])),
    }

refusals = {}
for name, handler in (("bf16", DistributedDataParallelKwargs(comm_hook=DDPCommunicationHookType.BF16)),
                      ("bf16_wrapper", DistributedDataParallelKwargs(comm_hook=DDPCommunicationHookType.POWER_SGD,
                                                                     comm_wrapper=DDPCommunicationHookType.BF16)),
                      ("batched", DistributedDataParallelKwargs(comm_hook="batched_power_sgd"))):
    try:
        Accelerator(kwargs_handlers=[handler], stall_timeout=None)
        refusals[name] = None
    except ValueError as error:
        refusals[name] = str(error)
result["refusals"] = refusals


# -- the Trainer: DDP(ddp_comm_state=PostLocalSGDState, ddp_comm_hook=post_localSGD_hook, model_averaging_period)
class Regression(TaskModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.seen = []

    def training_step(self, batch, batch_idx):
        source, target = batch
        return F.mse_loss(self.layer(source), target)

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self.seen.append(torch.equal(*both(flat(self))))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


from tasktrain.strategies import DDP  # noqa: E402
from torch.distributed.algorithms.ddp_comm_hooks import post_localSGD_hook  # noqa: E402

single, _ = dist.new_subgroups(group_size=1)  # after the warm-up each process all-reduces with itself: local steps
seed_everything(0)
module = Regression()
state = post_localSGD_hook.PostLocalSGDState(process_group=None, subgroup=single, start_localSGD_iter=2)
trainer = Trainer(strategy=DDP(ddp_comm_state=state, ddp_comm_hook=post_localSGD_hook.post_localSGD_hook,
                               model_averaging_period=2),
                  max_steps=6, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                  enable_model_summary=False)
trainer.fit(module, DataLoader(data, batch_size=4, shuffle=True))
result["post_local_sgd_equal_per_step"] = module.seen

torch.save(result, os.path.join(out_dir, f"rank{dist.get_rank()}.pt"))
