"""Run every CUDA path of tasktrain on a GPU machine and print a pass/fail/skip table and the GPU headline numbers.

    python scripts/gpu_check.py                # on a GPU machine: exit code 1 when a check fails (0 without CUDA)
    python scripts/gpu_check.py --cpu          # every check's CPU twin (gloo, CPU device): tests this script
    python scripts/gpu_check.py --only ddp fp16   # some checks (their names: --list)
    python scripts/gpu_check.py --fetch-wheels # here, with a network: DeepSpeed and its missing needs as wheels

It runs from a checkout as it is, without `pip install -e .` (setup.py pins the CPU machines' torch, which a GPU
machine must not get): put the checkout on PYTHONPATH and use the machine's own torch. DeepSpeed, which a GPU
image may lack, comes as wheels in .gpu_wheels/ (made by --fetch-wheels, ignored by git, carried to the machine)
installed with `pip install --no-index --no-deps --target`: nothing is downloaded there. The exact one-call
command for the lent H200 is in docs/benchmarks.md ("The GPU check").

Every check runs in its own process, bounded by a timeout (a hung or crashed check is a failed one, and a broken
CUDA context cannot spoil the next check). Multi-process checks use 2 processes on 2 GPUs or more, one process on
one GPU (nccl with a world of one), and 2 gloo processes on CPU; the tensor-parallel check a (2, 2) mesh on 4 GPUs
or 4 gloo processes (else (1, N) on N <= 2 GPUs). A check says "skip" only where it needs 2 GPUs and the machine
has one (context parallelism, whose CPU twin is its refusal), or where its path exists only on CUDA (on --cpu).
"""
import argparse
import collections
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
import warnings

import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # run from a checkout: its tasktrain, not an installed one
    sys.path.insert(0, ROOT)
WHEELS = os.path.join(ROOT, ".gpu_wheels")
# DeepSpeed 0.19.8 (built here as a pure-Python wheel) and what the GPU image lacks of its needs (KINDS.md's list)
WHEEL_PINS = ["hjson==3.1.0", "pydantic==2.14.4", "pydantic-core==2.50.5", "annotated-types==0.8.0",
              "typing-inspection==0.4.5"]

QUIET = dict(logger=False, enable_progress_bar=False, enable_checkpointing=False, num_sanity_val_steps=0)
Pair = collections.namedtuple("Pair", "x y")


def tiny_data(n=64, features=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=g)
    return TensorDataset(x, x.sum(1, keepdim=True) + 0.1 * torch.randn(n, 1, generator=g))


def make_regressor(record=None, optimizer=torch.optim.SGD, lr=0.05):
    from tasktrain import TaskModule

    class Regressor(TaskModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.net = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))

        def training_step(self, batch, batch_idx):
            x, y = batch
            out = self.net(x)
            if record is not None:
                record.append({"device": str(x.device), "rows": x.shape[0], "dtype": str(out.dtype),
                               "param_dtype": str(self.net[0].weight.dtype)})
            loss = torch.nn.functional.mse_loss(out.float(), y.float())
            self.log("loss", loss, on_epoch=True)
            return loss

        def validation_step(self, batch, batch_idx):
            x, y = batch
            self.log("val_loss", torch.nn.functional.mse_loss(self.net(x).float(), y.float()))

        def predict_step(self, batch, batch_idx):
            return self.net(batch[0])[:, 0]

        def configure_optimizers(self):
            return optimizer(self.parameters(), lr=lr)

    return Regressor()


def fit(accelerator, record=None, epochs=3, batch_size=16, **kwargs):
    from tasktrain import Trainer

    model = make_regressor(record)
    trainer = Trainer(accelerator=accelerator, max_epochs=epochs, **QUIET, **kwargs)
    data = tiny_data(n=4 * batch_size)
    trainer.fit(model, DataLoader(data, batch_size=batch_size), DataLoader(data, batch_size=batch_size))
    return trainer, model


def gpus(accelerator):
    return torch.cuda.device_count() if accelerator == "cuda" else 0


def world_of(accelerator):
    """Processes of the multi-process checks: 2 gloo ranks on CPU, 2 GPUs where there are, else one nccl rank."""
    return 2 if accelerator == "cpu" else min(2, gpus(accelerator))


def child_env():
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
                        "MASTER_PORT") and not k.startswith("TASKTRAIN_")}
    env["PYTHONPATH"] = os.pathsep.join([ROOT] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONWARNINGS"] = "ignore"
    return env


def run_worker(name, accelerator, out, timeout, launch=None):
    """This script as `--worker name out` (self-launching its ranks, or under `launch`: a command prefix);
    returns each rank's facts (rank{R}.json under out), or raises with the end of its output. A worker that
    run_workers_together already ran hands back its facts from there instead (the CPU twins' tests only)."""
    if name in PREPARED:
        return PREPARED.pop(name)
    cmd = [os.path.abspath(__file__), "--worker", name, out] + (["--cpu"] if accelerator == "cpu" else [])
    cmd = (launch or [sys.executable]) + cmd
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=child_env(), cwd=out)
    ranks = sorted(f for f in os.listdir(out) if f.startswith("rank") and f.endswith(".json"))
    if proc.returncode != 0 or not ranks:
        tail = (proc.stdout[-1500:] + "\n" + proc.stderr[-2500:]).strip()
        raise RuntimeError(f"worker {name} exited {proc.returncode}:\n{tail}")
    return [json.load(open(os.path.join(out, f))) for f in ranks]


PREPARED = {}  # worker name -> its ranks' facts, left by run_workers_together for the check that runs that worker


def run_workers_together(names, out, timeout):
    """CPU twins only (tests/test_gpu_check.py): the workers `names` one after the other in the same two processes
    and process group, under `tasktrain launch` (as the ddp-launch check), each writing into out/<name>/; their facts
    go to PREPARED, where each check finds them and judges them as it judges its own run's. Each launched process
    costs ~5 s of CPU in imports alone on the test machines: five checks' runs in one launch save eight of them. The
    GPU run (main) never calls this: there every check keeps its own process and its own ranks."""
    prefix = [sys.executable, "-m", "tasktrain.cli.main", "launch", "--num_processes", "2", "--strategy", "ddp",
              "--cpu"]
    cmd = prefix + [os.path.abspath(__file__), "--worker", ",".join(names), out, "--cpu"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=child_env(), cwd=out)
    if proc.returncode != 0:
        tail = (proc.stdout[-1500:] + "\n" + proc.stderr[-2500:]).strip()
        raise RuntimeError(f"workers {names} exited {proc.returncode}:\n{tail}")
    for name in names:
        folder = os.path.join(out, name)
        ranks = sorted(f for f in os.listdir(folder) if f.startswith("rank") and f.endswith(".json"))
        PREPARED[name] = [json.load(open(os.path.join(folder, f))) for f in ranks]


def write_facts(out, rank, facts):
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(facts, f)


def max_diff(a, b):
    return max(abs(x - y) for x, y in zip(a, b)) if a else float("inf")


def flat(module_or_state):
    state = module_or_state if isinstance(module_or_state, dict) else module_or_state.state_dict()
    return [float(v) for k in sorted(state) for v in state[k].detach().float().cpu().flatten()]


# -- in-process checks (each still runs in a process of its own): return (status, detail) -----------------------------
def check_batch_placement(accelerator):
    from tasktrain import TaskModule, Trainer

    seen = []

    class Placement(TaskModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            seen.extend([batch["x"].device, batch["pair"][0].device, batch["named"].y.device, self.layer.weight.device])
            return self.layer(batch["x"]).pow(2).mean() + 0 * batch["named"].x.sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    def collate(items):
        x = torch.stack([i[0] for i in items])
        return {"x": x, "pair": (x, x), "named": Pair(x, x)}

    loader = DataLoader(TensorDataset(torch.randn(8, 4)), batch_size=4, collate_fn=collate)
    Trainer(accelerator=accelerator, max_steps=2, **QUIET).fit(Placement(), loader)
    want = torch.device("cuda", 0) if accelerator == "cuda" else torch.device("cpu")
    wrong = [d for d in seen if d != want]
    if not seen or wrong:
        return "fail", f"expected every tensor on {want}, saw {sorted(set(map(str, seen)))}"
    return "pass", f"dict, tuple and namedtuple batches on {want}"


def check_fp16(accelerator):
    from tasktrain import Callback

    record, seen = [], {}

    class Poison(Callback):
        """At the second step, an inf in a gradient: GradScaler must skip that step and halve its scale."""

        def on_after_backward(self, trainer, module):
            if trainer.global_step == 1 and "before" not in seen:
                seen["before"] = flat(module)
                seen["scale_before"] = trainer.strategy.precision.scaler.get_scale()
                next(module.parameters()).grad.view(-1)[0] = float("inf")

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            if "before" in seen and "after" not in seen:
                seen["after"] = flat(module)
                seen["scale_after"] = trainer.strategy.precision.scaler.get_scale()

    from tasktrain.plugins import MixedPrecision

    # (the plugin, as precision="16-mixed" on a CPU is bf16-mixed, as Lightning's Trainer: the twin runs fp16 too)
    trainer, model = fit(accelerator, record, plugins=[MixedPrecision("16-mixed", accelerator)], callbacks=[Poison()])
    scaler = trainer.strategy.precision.scaler
    dtypes = {r["dtype"] for r in record}
    if dtypes != {"torch.float16"}:
        return "fail", f"forward outputs were {dtypes}, expected torch.float16"
    if not scaler.is_enabled():
        return "fail", "the GradScaler is disabled"
    if seen.get("after") != seen.get("before"):
        return "fail", "the step with an inf gradient changed the weights: GradScaler did not skip it"
    if seen["scale_after"] != seen["scale_before"] / 2:
        return "fail", f"the scale went {seen['scale_before']} -> {seen['scale_after']}, expected it halved"
    loss = float(trainer.callback_metrics["loss_epoch"])
    if flat(model) == seen["after"] or not loss == loss:
        return "fail", f"training did not go on after the skipped step (final loss {loss})"
    return "pass", (f"fp16 forward; inf step skipped (weights kept, scale {seen['scale_before']:g} -> "
                    f"{seen['scale_after']:g}); final epoch loss {loss:.3f}")


def check_bf16(accelerator):
    record = []
    trainer, _ = fit(accelerator, record, precision="bf16-mixed")
    dtypes = {r["dtype"] for r in record}
    if dtypes != {"torch.bfloat16"}:
        return "fail", f"forward outputs were {dtypes}, expected torch.bfloat16"
    return "pass", f"bf16 forward, final epoch loss {float(trainer.callback_metrics['loss_epoch']):.3f}"


def check_bf16_true(accelerator):
    record = []
    initial = flat(make_regressor())
    trainer, model = fit(accelerator, record, precision="bf16-true")
    kinds = {(r["dtype"], r["param_dtype"]) for r in record}
    if kinds != {("torch.bfloat16", "torch.bfloat16")}:
        return "fail", f"(output, parameter) dtypes were {kinds}, expected bfloat16 for both"
    loss = float(trainer.callback_metrics["loss_epoch"])
    if flat(model) == [float(torch.tensor(v).bfloat16()) for v in initial] or not loss == loss:
        return "fail", f"the bf16 weights did not train (final loss {loss})"
    return "pass", f"bf16 parameters and forward, final epoch loss {loss:.3f}"


def check_data_parallel(accelerator):
    count = gpus(accelerator)
    batch_size = 4 * max(1, count)  # equal chunks: the mean of the copies' losses is then the batch's loss
    record = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer, model = fit(accelerator, record, batch_size=batch_size, strategy="dp")
    fell_back = any("running as a single device" in str(w.message) for w in caught)
    if count < 2:
        if not fell_back or trainer.strategy.parallel_ids:
            return "fail", f"{count} GPU(s): expected the single-device fallback with a warning"
        return "pass", f"{count} GPU(s): warned and ran as a single device on {trainer.strategy.root_device}"
    if fell_back or trainer.strategy.parallel_ids != list(range(count)):
        return "fail", f"expected DataParallel over {list(range(count))}, got {trainer.strategy.parallel_ids}"
    devices = {r["device"] for r in record}
    if len(devices) != count or {r["rows"] for r in record} != {4}:
        return "fail", f"the batches were not split over the GPUs: steps ran on {sorted(devices)}"
    _, reference = fit(accelerator, batch_size=batch_size, strategy="single_device")
    diff = max((a.cpu() - b.cpu()).abs().max().item() for a, b in zip(model.parameters(), reference.parameters()))
    if diff > 1e-4:
        return "fail", f"weights differ from one GPU's by {diff:.2e}"
    data = tiny_data(n=4 * batch_size)
    predictions = torch.cat(trainer.predict(model, DataLoader(data, batch_size=batch_size)))
    expected = reference.cpu().net(data.tensors[0])[:, 0]
    if predictions.shape != expected.shape or not torch.allclose(predictions.cpu(), expected, atol=1e-4):
        return "fail", "predictions through DataParallel differ from the module's"
    if "val_loss" not in trainer.callback_metrics:
        return "fail", "self.log in validation_step was lost"
    return "pass", f"split over {sorted(devices)}, same weights as one GPU (max diff {diff:.1e}), predictions in order"


def check_accelerator_seed(accelerator):
    """The seed's custom loop (tests/accelerator_scripts/common.py's accelerator_loop) on the Accelerator."""
    import torch.nn.functional as F

    from tasktrain import Accelerator, seed_everything

    seed_everything(0)
    acc = Accelerator(cpu=accelerator == "cpu")
    device = acc.device
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Dropout(0.1),
                                torch.nn.Linear(16, 3)).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(1)
    data = DataLoader(TensorDataset(torch.randn(100, 8, generator=g), torch.randint(0, 3, (100,), generator=g)),
                      batch_size=32, shuffle=True)
    model, optimizer, data = acc.prepare(model, optimizer, data)
    model.train()
    losses = []
    for epoch in range(3):
        for source, targets in data:
            source, targets = source.to(device), targets.to(device)
            optimizer.zero_grad()
            loss = F.cross_entropy(model(source), targets)
            acc.backward(loss)
            acc.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            losses.append(loss.detach())
    acc.wait_for_everyone()
    where = {str(p.device) for p in acc.unwrap_model(model).parameters()}
    want = "cuda:0" if accelerator == "cuda" else "cpu"
    if where != {want} or str(device) not in (want, want.split(":")[0]):
        return "fail", f"the Accelerator's device is {device}, the parameters on {where}: expected {want}"
    first, last = float(losses[0]), float(torch.stack(losses[-4:]).mean())
    if not last < first:
        return "fail", f"the loss did not go down ({first:.3f} -> {last:.3f})"
    return "pass", f"{len(losses)} steps on {device}, loss {first:.3f} -> {last:.3f}"


def check_dispatch(accelerator):
    from tasktrain.inference import dispatch_model

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 16), torch.nn.ReLU(),
                                torch.nn.Linear(16, 4))
    x = torch.randn(5, 8)
    expected = model(x)
    if accelerator == "cuda":
        second = 1 if gpus(accelerator) >= 2 else 0
        device_map = {"0": 0, "1": 0, "2": "cpu", "3": second, "4": "disk"}
    else:
        device_map = {"0": "cpu", "1": "cpu", "2": "cpu", "3": "cpu", "4": "disk"}
    with tempfile.TemporaryDirectory() as folder:
        dispatch_model(model, device_map=device_map, offload_dir=folder)
        on_disk = bool(os.listdir(folder))
        main = torch.device("cuda", 0) if accelerator == "cuda" else torch.device("cpu")
        out = model(x.to(main))
    if not on_disk:
        return "fail", "nothing was written to the offload folder for the 'disk' layer"
    if out.device != main:
        return "fail", f"the output came back on {out.device}, the input was on {main}"
    diff = (out.detach().cpu() - expected.detach()).abs().max().item()
    if diff > 1e-4:
        return "fail", f"outputs differ from the undispatched model by {diff:.2e}"
    return "pass", f"map {device_map}: same outputs as the plain model (max diff {diff:.1e})"


# -- multi-process checks: the parent judges the workers' facts --------------------------------------------------------
def check_ddp(accelerator, launch=False):
    world = world_of(accelerator)
    with tempfile.TemporaryDirectory() as out:
        prefix = None
        if launch:
            prefix = [sys.executable, "-m", "tasktrain.cli.main", "launch", "--num_processes", str(world),
                      "--strategy", "ddp"] + (["--cpu"] if accelerator == "cpu" else [])
        ranks = run_worker("ddp", accelerator, out, 240, prefix)
    backend = "nccl" if accelerator == "cuda" else "gloo"
    if len(ranks) != world:
        return "fail", f"{len(ranks)} ranks reported, expected {world}"
    for r, facts in enumerate(ranks):
        want = f"cuda:{r}" if accelerator == "cuda" else "cpu"
        if facts["backend"] != backend or facts["device"] != want:
            return "fail", f"rank {r}: backend {facts['backend']} on {facts['device']}, expected {backend} on {want}"
    if any(f["params"] != ranks[0]["params"] for f in ranks):
        return "fail", "the ranks ended with different weights"
    detail = f"{backend}, {world} rank(s) on {', '.join(f['device'] for f in ranks)}"
    detail += ", equal weights" if world > 1 else ""
    if accelerator == "cuda":
        if not all(f["sync_batchnorm"] for f in ranks):
            return "fail", "BatchNorm was not converted to SyncBatchNorm"
        for r, facts in enumerate(ranks):
            diff = max_diff(facts["running_mean"], facts["expected_mean"])
            if diff > 1e-4:
                return "fail", f"rank {r}: SyncBatchNorm's running mean is not all ranks' mean (off {diff:.2e})"
        detail += f", SyncBatchNorm statistics over the {world} rank(s)' batches"
    return "pass", detail + (" (under tasktrain launch)" if launch else " (self-launched)")


def worker_ddp(out, accelerator):
    """The Trainer re-runs this command for the other ranks (self-launch), or `tasktrain launch` started them."""
    import torch.distributed as dist

    from tasktrain import DDP, Callback, TaskModule, Trainer

    facts = {}
    world = world_of(accelerator)

    class BatchNormNet(TaskModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.bn = torch.nn.BatchNorm1d(8, momentum=1.0)  # running mean = the last batch's mean
            self.head = torch.nn.Linear(8, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.mse_loss(self.head(self.bn(x)), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)

    class Record(Callback):
        def on_train_end(self, trainer, module):
            facts["backend"] = dist.get_backend() if dist.is_initialized() else None
            facts["device"] = str(trainer.strategy.root_device)

    data = tiny_data(n=8 * world)
    model = BatchNormNet()
    devices = "auto" if "LOCAL_RANK" in os.environ else world
    trainer = Trainer(strategy=DDP(sync_batchnorm=accelerator == "cuda"), accelerator=accelerator, devices=devices,
                      max_steps=1, callbacks=[Record()], **QUIET)
    trainer.fit(model, DataLoader(data, batch_size=8))  # one step: the ranks' 8 rows each are all the samples
    facts["params"] = [float(v) for p in model.parameters() for v in p.detach().cpu().flatten()]  # (not BN's buffers)
    facts["sync_batchnorm"] = isinstance(model.bn, torch.nn.SyncBatchNorm)
    facts["running_mean"] = model.bn.running_mean.cpu().tolist()
    facts["expected_mean"] = data.tensors[0].mean(0).tolist()
    write_facts(out, trainer.global_rank, facts)


def check_fsdp(accelerator, precision):
    with tempfile.TemporaryDirectory() as out:
        ranks = run_worker(f"fsdp-{precision}", accelerator, out, 240)
    facts = ranks[0]
    want_dtype = "torch.bfloat16" if precision == "bf16-mixed" else "torch.float16"
    if facts["backend"] != ("nccl" if accelerator == "cuda" else "gloo"):
        return "fail", f"backend {facts['backend']}"
    if not facts["dtensor"]:
        return "fail", "the parameters are not DTensors: fully_shard was not applied"
    if facts["dtypes"] != [want_dtype]:
        return "fail", f"forward outputs were {facts['dtypes']}, expected {want_dtype}"
    if precision == "16-mixed" and facts["scaler"] != "ShardedGradScaler":
        return "fail", f"the loss scaler is {facts['scaler']}, expected torch's ShardedGradScaler"
    if not facts["dcp_dir"]:
        return "fail", "the checkpoint is not a torch.distributed.checkpoint directory"
    if facts["resumed_step"] != 4 or facts["diff"] > 1e-6:
        return "fail", (f"resumed to step {facts['resumed_step']}, weights off the uninterrupted run's by "
                        f"{facts['diff']:.2e}")
    scaler = f", {facts['scaler']}" if facts["scaler"] else ""
    return "pass", (f"{facts['backend']}, {len(ranks)} rank(s), {want_dtype[6:]} compute{scaler}; DCP checkpoint at "
                    f"step 2 resumed to 4 = uninterrupted 4 steps (max diff {facts['diff']:.1e})")


def worker_fsdp(out, accelerator, precision):
    import torch.distributed as dist

    from tasktrain import Trainer

    world = world_of(accelerator)
    data = DataLoader(tiny_data(n=16 * world), batch_size=4)
    record = []

    def trainer(steps, root):
        return Trainer(strategy="fsdp", accelerator=accelerator, devices=world, precision=precision, max_steps=steps,
                       default_root_dir=os.path.join(out, root), **QUIET)

    whole = trainer(4, "whole")
    model = make_regressor(record)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # 16-mixed on CPU warns that it is slow
        whole.fit(model, data)
        reference = flat(whole.strategy.full_state_dict(model))
        dtensor = all(type(p).__name__ == "DTensor" for p in model.parameters())
        first = trainer(2, "first")
        first.fit(make_regressor(), data)
        path = os.path.join(out, "step2.ckpt")
        first.save_checkpoint(path)
        scaler = first.strategy.precision.scaler if precision == "16-mixed" else None
        resumed = trainer(4, "resumed")
        model = make_regressor()
        resumed.fit(model, data, ckpt_path=path)
        weights = flat(resumed.strategy.full_state_dict(model))
    facts = {"backend": dist.get_backend(), "dtensor": dtensor, "dtypes": sorted({r["dtype"] for r in record}),
             "scaler": type(scaler).__name__ if scaler is not None else None, "dcp_dir": os.path.isdir(path),
             "resumed_step": resumed.global_step, "diff": max_diff(weights, reference)}
    write_facts(out, resumed.global_rank, facts)


class MeshRowsOrder(DistributedSampler):
    """What the data-parallel rows of a mesh read together, for a one-process reference: the Trainer's (Lightning's)
    training sampler under a distributed strategy shuffles a sequential loader, DistributedSampler(shuffle=True,
    seed=0) per row; the rows' b-th batches side by side. (A DistributedSampler of one replica, so that the Trainer
    keeps it and calls its set_epoch.)"""

    def __init__(self, n, rows, batch_size):
        super().__init__(range(n), num_replicas=1, rank=0, shuffle=False)
        self.rows, self.batch_size = rows, batch_size

    def __iter__(self):
        per_row = []
        for row in range(self.rows):
            sampler = DistributedSampler(self.dataset, num_replicas=self.rows, rank=row, shuffle=True, seed=0)
            sampler.set_epoch(self.epoch)
            per_row.append(list(sampler))
        return iter([index for start in range(0, len(per_row[0]), self.batch_size) for row in per_row
                     for index in row[start:start + self.batch_size]])


def tp_layout(accelerator):
    """(data_parallel, tensor_parallel) of the tensor-parallel check: a 2-D (2, 2) mesh over 4 gloo ranks on CPU or
    4 GPUs; (1, N) on fewer GPUs (nccl takes one GPU per rank)."""
    world = 4 if accelerator == "cpu" else (4 if gpus(accelerator) >= 4 else min(2, gpus(accelerator)))
    return (2, 2) if world == 4 else (1, world)


def check_tensor_parallel(accelerator):
    """ModelParallelStrategy (issue 39) on a (data_parallel, tensor_parallel) mesh (tp_layout: (2, 2) on CPU and on 4
    GPUs), an MLP split ColwiseParallel / RowwiseParallel, clipping: the tensor-parallel peers read one batch and the
    data-parallel rows others; the weights after 4 steps equal one process's on the full batch; a DCP checkpoint at
    step 2 resumes to the same weights. (Context parallelism: check_context_parallel.)"""
    dp, tp = tp_layout(accelerator)
    with tempfile.TemporaryDirectory() as out:
        ranks = run_worker("tp", accelerator, out, 240)
    from tasktrain import Trainer

    reference = Trainer(accelerator=accelerator, devices=1, max_steps=4, gradient_clip_val=0.5, **QUIET)
    model = make_regressor()
    # every data-parallel row's batch at once, in the shuffled order the rows read
    reference.fit(model, DataLoader(tiny_data(n=32), batch_size=8 * dp, sampler=MeshRowsOrder(32, dp, 8)))
    one_process = max_diff(ranks[0]["whole"], flat(model))
    facts = ranks[0]
    if facts["backend"] != ("nccl" if accelerator == "cuda" else "gloo"):
        return "fail", f"backend {facts['backend']}"
    if facts["mesh"] != ["data_parallel", "tensor_parallel"] or facts["shape"] != [dp, tp] or len(ranks) != dp * tp:
        return "fail", f"mesh {facts['mesh']} {facts['shape']} over {len(ranks)} rank(s), expected ({dp}, {tp})"
    batches = [r["batches"] for r in ranks]  # ranks in mesh order: row by row
    rows = [batches[i * tp:(i + 1) * tp] for i in range(dp)]
    if any(row.count(row[0]) != tp for row in rows) or len({str(row[0]) for row in rows}) != dp:
        return "fail", f"batch sums per rank {batches}: tensor-parallel peers must read one batch, the rows others"
    if facts["local_rows"] * tp * dp != facts["full_rows"]:
        return "fail", f"each rank holds {facts['local_rows']} of {facts['full_rows']} rows of the split layer"
    if one_process > 1e-5:
        return "fail", f"weights off one process's on the full batch by {one_process:.2e}"
    if facts["resumed_step"] != 4 or facts["diff"] > 1e-6:
        return "fail", (f"resumed to step {facts['resumed_step']}, weights off the uninterrupted run's by "
                        f"{facts['diff']:.2e}")
    return "pass", (f"{facts['backend']}, ({dp}, {tp}) mesh, {facts['device']}; = one process on the full batch "
                    f"(max diff {one_process:.1e}); DCP checkpoint at step 2 resumed to 4 = uninterrupted 4 steps "
                    f"(max diff {facts['diff']:.1e})")


def worker_tp(out, accelerator):
    import torch.distributed as dist
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    from tasktrain import Callback, ModelParallelStrategy, Trainer

    dp, tp = tp_layout(accelerator)
    data = DataLoader(tiny_data(n=32), batch_size=8)  # per data-parallel row
    batches = []

    class Split(type(make_regressor())):
        def configure_model(self):
            plan = {"0": ColwiseParallel(), "2": RowwiseParallel()}
            parallelize_module(self.net, self.device_mesh["tensor_parallel"], plan)

    path = os.path.join(out, "step2.ckpt")

    class Batches(Callback):  # and a checkpoint at step 2 of the same run
        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            batches.append(round(float(batch[0].sum()), 4))

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            if trainer.global_step == 2:
                trainer.save_checkpoint(path)

    model = Split

    def trainer(steps, root, callbacks=()):
        return Trainer(strategy=ModelParallelStrategy(data_parallel_size=dp, tensor_parallel_size=tp),
                       accelerator=accelerator, devices=dp * tp, max_steps=steps, gradient_clip_val=0.5,
                       default_root_dir=os.path.join(out, root), callbacks=list(callbacks), **QUIET)

    whole = trainer(4, "whole", [Batches()])
    first_model = model()
    whole.fit(first_model, data)
    reference = flat(whole.strategy.full_state_dict(first_model))
    local = first_model.net[0].weight.to_local()
    resumed = trainer(4, "resumed")
    again = model()
    resumed.fit(again, data, ckpt_path=path)
    facts = {"backend": dist.get_backend(), "mesh": list(resumed.strategy.device_mesh.mesh_dim_names),
             "shape": list(resumed.strategy.device_mesh.shape), "device": str(local.device),
             "local_rows": local.shape[0], "full_rows": 32, "resumed_step": resumed.global_step, "whole": reference,
             "batches": batches, "diff": max_diff(flat(resumed.strategy.full_state_dict(again)), reference)}
    write_facts(out, resumed.global_rank, facts)


def check_context_parallel(accelerator):
    """Accelerator(parallelism_config=ParallelismConfig(cp_size=2)) with maybe_context_parallel: on 2 GPUs, a causal
    attention model's loss and weights after one step equal one process's on the whole sequence. Its CPU twin: the
    refusal before training, with the reason (torch has no CPU path for it)."""
    if accelerator == "cpu":
        from tasktrain import Accelerator, ParallelismConfig

        try:
            Accelerator(cpu=True, parallelism_config=ParallelismConfig(cp_size=2))
        except ValueError as err:
            if "no sharding strategy" in str(err):
                return "pass", "refused on CPU before training (aten._scaled_dot_product_flash_attention_for_cpu " \
                               "has no sharding strategy)"
            return "fail", f"refused with another message: {err}"
        return "fail", "Accelerator(cpu=True, ParallelismConfig(cp_size=2)) was not refused"
    if gpus(accelerator) < 2:
        return "skip", f"needs 2 GPUs (context parallel over 2 nccl ranks), found {gpus(accelerator)}"
    with tempfile.TemporaryDirectory() as out:
        prefix = [sys.executable, "-m", "tasktrain.cli.main", "launch", "--num_processes", "2"]
        ranks = run_worker("cp", accelerator, out, 300, prefix)
    facts = ranks[0]
    if facts["loss_diff"] > 1e-4 or facts["weight_diff"] > 1e-5:
        return "fail", (f"loss off the whole sequence's by {facts['loss_diff']:.2e}, weights by "
                        f"{facts['weight_diff']:.2e}")
    if facts["local_seq"] * 2 != facts["seq"]:
        return "fail", f"each rank saw {facts['local_seq']} of {facts['seq']} positions"
    return "pass", (f"nccl, cp=2: {facts['local_seq']} of {facts['seq']} positions per rank; loss and weights = "
                    f"the whole sequence's (diffs {facts['loss_diff']:.1e}, {facts['weight_diff']:.1e})")


def worker_cp(out, accelerator):
    import torch.distributed as dist
    import torch.nn.functional as F

    from tasktrain import Accelerator, ParallelismConfig

    vocab, dim, seq = 64, 32, 64

    class Causal(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.embed = torch.nn.Embedding(vocab, dim)
            self.qkv = torch.nn.Linear(dim, 3 * dim)
            self.head = torch.nn.Linear(dim, vocab)

        def forward(self, tokens):
            q, k, v = self.qkv(self.embed(tokens)).view(*tokens.shape, 3, 4, dim // 4).permute(2, 0, 3, 1, 4)
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.head(out.transpose(1, 2).flatten(2))

    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, vocab, (2, seq + 1), generator=g)
    inputs, targets = tokens[:, :-1].cuda(), tokens[:, 1:].cuda()
    reference = Causal().cuda()  # one process, the whole sequence, one SGD step
    loss = F.cross_entropy(reference(inputs).flatten(0, 1), targets.flatten())
    loss.backward()
    with torch.no_grad():
        for p in reference.parameters():
            p -= 0.1 * p.grad
    whole_loss = float(loss)

    accelerator_ = Accelerator(parallelism_config=ParallelismConfig(cp_size=2))
    model = Causal()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator_.prepare(model, optimizer)
    inputs, targets = inputs.clone(), targets.clone()
    with accelerator_.maybe_context_parallel(buffers=[inputs, targets], buffer_seq_dims=[1, 1],
                                             no_restore_buffers={inputs, targets}):
        local_seq = inputs.shape[1]
        loss = F.cross_entropy(model(inputs).flatten(0, 1), targets.flatten())
        accelerator_.backward(loss)
    optimizer.step()
    mean = loss.detach().clone()
    dist.all_reduce(mean, group=accelerator_.torch_device_mesh["dp_cp"].get_group())
    weights = accelerator_.get_state_dict(model)
    facts = {"loss_diff": abs(float(mean) / 2 - whole_loss), "local_seq": local_seq, "seq": seq,
             "weight_diff": max_diff(flat(weights), flat(reference))}
    write_facts(out, dist.get_rank(), facts)


class TorchAdam(torch.optim.Adam):
    """torch's own Adam. With optimizer offload the strategy swaps an exact Adam/AdamW for DeepSpeedCPUAdam, a C++
    op DeepSpeed compiles for minutes on first use; a subclass is kept as it is and steps on the CPU."""


def check_deepspeed(accelerator, stage):
    # found, not imported (the workers import it): deepspeed and what the wheels bring of its needs
    missing = [name for name in ("deepspeed", "hjson", "pydantic", "pydantic_core", "annotated_types",
                                 "typing_inspection") if importlib.util.find_spec(name) is None]
    if missing:
        return "fail", (f"not installed: {', '.join(missing)}; run `python scripts/gpu_check.py --fetch-wheels` on "
                        "a machine with a network and carry .gpu_wheels (docs/benchmarks.md, 'The GPU check')")
    with tempfile.TemporaryDirectory() as out:
        ranks = run_worker(f"deepspeed-{stage}", accelerator, out, 300)
    facts = ranks[0]
    want = "cuda:0" if accelerator == "cuda" else "cpu"
    if facts["stage"] != stage or facts["offload_optimizer"] != "cpu":
        return "fail", f"engine at stage {facts['stage']}, optimizer offload {facts['offload_optimizer']}"
    if stage == 3 and facts["offload_param"] != "cpu":
        return "fail", f"parameter offload {facts['offload_param']}, expected cpu"
    if facts["device"] != want or facts["optimizer"] != "TorchAdam":
        return "fail", f"engine on {facts['device']} with {facts['optimizer']}, expected {want} with TorchAdam"
    if not facts["changed"] or not facts["finite"] or (len(ranks) > 1 and ranks[1]["weights"] != facts["weights"]):
        return "fail", f"weights changed: {facts['changed']}, finite: {facts['finite']}, same on every rank: no"
    offload = "optimizer" + (" and parameters" if stage == 3 else "")
    return "pass", (f"ZeRO-{stage}, {len(ranks)} rank(s) on {facts['device']}, bf16, {offload} offloaded to the "
                    f"CPU, torch Adam (nothing compiled); trained {facts['steps']} steps")


def worker_deepspeed(out, accelerator, stage):
    from tasktrain import Callback, DeepSpeed, Trainer

    world = world_of(accelerator)
    model = make_regressor(optimizer=TorchAdam, lr=0.01)
    initial = flat(model)
    facts = {}

    class Record(Callback):
        def on_train_end(self, trainer, module):  # the engine is still there (teardown drops it)
            strategy = trainer.strategy
            zero = strategy.config["zero_optimization"]
            weights = flat(strategy.full_state_dict())  # ZeRO-3 gathers: every rank calls it
            facts.update(stage=zero["stage"], offload_optimizer=(zero.get("offload_optimizer") or {}).get("device"),
                         offload_param=(zero.get("offload_param") or {}).get("device"),
                         device=str(strategy.engine.device), optimizer=type(trainer.optimizers[0]).__name__,
                         steps=trainer.global_step, changed=weights != initial,
                         finite=all(v == v for v in weights), weights=weights)

    strategy = DeepSpeed(stage=stage, offload_optimizer=True, offload_parameters=stage == 3)
    trainer = Trainer(strategy=strategy, accelerator=accelerator, devices=world, precision="bf16-mixed", max_steps=4,
                      default_root_dir=out, callbacks=[Record()], **QUIET)
    trainer.fit(model, DataLoader(tiny_data(n=16 * world), batch_size=4))
    write_facts(out, trainer.global_rank, facts)


def check_watchdog(accelerator):
    world = world_of(accelerator)
    if world < 2:
        return "skip", f"needs 2 GPUs, found {gpus(accelerator)} (the watchdog watches a world of 2 or more)"
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", "watchdog", out]
        cmd += ["--cpu"] if accelerator == "cpu" else []
        started = time.monotonic()
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=child_env(), cwd=out)
        seconds = time.monotonic() - started
        stuck = os.path.exists(os.path.join(out, "stuck"))
    if not stuck:
        return "fail", f"the run ended (exit {proc.returncode}) before rank 1 hung: {proc.stderr[-800:]}"
    if proc.returncode == 0 or "rank 1 (pid" not in proc.stderr or "has made no progress" not in proc.stderr:
        return "fail", f"exit {proc.returncode}; the stall of rank 1 was not reported: {proc.stderr[-800:]}"
    backend = "nccl" if accelerator == "cuda" else "gloo"
    return "pass", f"{backend}: rank 1 hung in training_step, named and every rank ended ({seconds:.0f} s in all)"


def worker_watchdog(out, accelerator):
    from tasktrain import TaskModule, Trainer

    class Hangs(TaskModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(8, 1)

        def training_step(self, batch, batch_idx):
            if self.global_step == 2 and self.global_rank == 1:
                open(os.path.join(out, "stuck"), "w").close()
                time.sleep(10_000)  # rank 1 hangs: rank 0 waits in backward's all-reduce
            return self.layer(batch[0]).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    # 3 s on CPU: the twin stays short (tests/test_watchdog.py runs 3 s too); 5 s on nccl, whose first all-reduce
    # may take a while
    stall_timeout = 3 if accelerator == "cpu" else 5
    trainer = Trainer(strategy="ddp", accelerator=accelerator, devices=2, max_epochs=1000, stall_timeout=stall_timeout,
                      **QUIET)
    trainer.fit(Hangs(), DataLoader(tiny_data(n=32), batch_size=4))


def check_compile(accelerator):
    with tempfile.TemporaryDirectory() as out:
        (facts,) = run_worker("compile", accelerator, out, 300)
    if facts["steps"] != 3 or not facts["graphs"]:
        return "fail", f"{facts['steps']} steps, {facts['graphs']} compiled graphs"
    if not facts["finite"]:
        return "fail", f"the compiled GPT's validation metrics are not finite: {facts['metrics']}"
    return "pass", (f"examples/gpt.py --compile ({facts['backend']}, {facts['precision']}): {facts['steps']} steps, "
                    f"{facts['graphs']} graph(s) compiled, validate and generate ran")


def worker_compile(out, accelerator):
    spec = importlib.util.spec_from_file_location("gpt_example", os.path.join(ROOT, "examples", "gpt.py"))
    gpt = importlib.util.module_from_spec(spec)
    sys.modules["gpt_example"] = gpt
    spec.loader.exec_module(gpt)
    backend = "inductor"
    if accelerator == "cpu":  # the CPU twin: dynamo and AOTAutograd without inductor's C++ build (minutes here)
        backend = "aot_eager"
        compile_ = torch.compile
        gpt.torch.compile = lambda model, **kwargs: compile_(model, backend=backend, **kwargs)
    precision = "bf16-mixed" if accelerator == "cuda" else "32-true"
    argv = ["--compile", "--max_steps", "3", "--n_layer", "1", "--n_head", "2", "--n_embd", "32", "--batch_size",
            "32", "--train_size", "256", "--val_size", "64", "--samples", "2", "--warmup", "1", "--devices", "1",
            "--precision", precision, "--root", out]
    trainer, metrics, _ = gpt.main(argv)
    from torch._dynamo.utils import counters

    facts = {"steps": trainer.global_step, "graphs": int(counters["stats"]["unique_graphs"]), "backend": backend,
             "precision": precision, "metrics": {k: float(v) for k, v in metrics.items()},
             "finite": all(float(v) == float(v) for v in metrics.values()),
             "device": str(trainer.strategy.root_device)}
    write_facts(out, 0, facts)


def check_gpt_benchmark(accelerator):
    with tempfile.TemporaryDirectory() as out:
        result = os.path.join(out, "gpt.json")
        if accelerator == "cuda":  # GPT-2 small's width and depth, 12k tokens a step: the GPU has work to do
            args = ["--device", "cuda", "--settings", "bf16", "--n_layer", "12", "--n_embd", "768", "--micro_batch",
                    "512", "--steps", "30", "--warmup", "10", "--repeats", "1"]
        else:  # the twin: the same code path, tiny
            args = ["--settings", "fp32", "--n_layer", "1", "--n_embd", "32", "--micro_batch", "16", "--steps", "6",
                    "--warmup", "2", "--repeats", "1"]
        cmd = [sys.executable, os.path.join(ROOT, "benchmarks", "gpt.py"), *args, "--no_fresh", "--json", result]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=child_env(), cwd=out)
        if proc.returncode != 0 or not os.path.exists(result):
            return "fail", f"benchmarks/gpt.py exited {proc.returncode}: {proc.stderr[-1500:]}"
        rows = json.load(open(result))["rows"]
    HEADLINE.extend(rows)
    if {r["variant"] for r in rows} != {"raw", "trainer", "accelerator"}:
        return "fail", f"variants measured: {[r['variant'] for r in rows]}"
    if not all(r["tokens_per_s"] > 0 for r in rows):
        return "fail", f"tokens/s: {[r['tokens_per_s'] for r in rows]}"
    # (Bit-for-bit equal weights are tested on CPU; on a GPU a kernel with atomics, e.g. an attention backward,
    # may make them differ a little without any bug: the difference is shown, not judged.)
    ratios = ", ".join(f"{r['variant']} {r['ratio']:.3f}x" for r in rows if r["variant"] != "raw")
    diffs = ", ".join(f"{r['variant']} {r['max_diff']:.1e}" for r in rows if r["variant"] != "raw")
    return "pass", (f"{rows[0]['setting']}: tokens/s ratio to the hand-written loop: {ratios}; largest weight "
                    f"difference to it: {diffs} (table below)")


HEADLINE = []  # the GPT benchmark's rows, printed after the table

# name -> (label, check); the names are what --only takes
CHECKS = {
    "placement": ("batch placement", check_batch_placement),
    "fp16": ("fp16 autocast + GradScaler", check_fp16),
    "bf16": ("bf16-mixed", check_bf16),
    "bf16-true": ("bf16-true", check_bf16_true),
    "dp": ("DataParallel", check_data_parallel),
    "ddp": ("DDP self-launch + SyncBatchNorm", check_ddp),
    "ddp-launch": ("DDP under tasktrain launch", lambda a: check_ddp(a, launch=True)),
    "fsdp-bf16": ("FSDP2 bf16-mixed + DCP resume", lambda a: check_fsdp(a, "bf16-mixed")),
    "fsdp-fp16": ("FSDP2 16-mixed (ShardedGradScaler)", lambda a: check_fsdp(a, "16-mixed")),
    "tp": ("(data x tensor) parallel mesh + DCP resume", check_tensor_parallel),
    "cp": ("context parallel (Accelerator, cp=2)", check_context_parallel),
    "zero2": ("DeepSpeed ZeRO-2 + CPU offload", lambda a: check_deepspeed(a, 2)),
    "zero3": ("DeepSpeed ZeRO-3 + CPU offload", lambda a: check_deepspeed(a, 3)),
    "accelerator": ("Accelerator, the seed's loop", check_accelerator_seed),
    "dispatch": ("dispatch_model, CPU + disk offload", check_dispatch),
    "compile": ("torch.compile, examples/gpt.py", check_compile),
    "watchdog": ("watchdog (stuck rank)", check_watchdog),
    "gpt-bench": ("GPT benchmark (headline)", check_gpt_benchmark),
}
WORKERS = {
    "ddp": worker_ddp,
    "fsdp-bf16-mixed": lambda out, a: worker_fsdp(out, a, "bf16-mixed"),
    "fsdp-16-mixed": lambda out, a: worker_fsdp(out, a, "16-mixed"),
    "deepspeed-2": lambda out, a: worker_deepspeed(out, a, 2),
    "deepspeed-3": lambda out, a: worker_deepspeed(out, a, 3),
    "watchdog": worker_watchdog,
    "tp": worker_tp,
    "cp": worker_cp,
    "compile": worker_compile,
}
TIMEOUT = 360  # seconds per check, its own set-up included; the multi-process ones bound their workers too


def run_one(name, accelerator, result_path):
    """The child's side: one check, its (status, detail) and the headline rows into result_path."""
    try:
        status, detail = CHECKS[name][1](accelerator)
    except Exception as err:  # a crash is a failed check
        traceback.print_exc()
        lines = [line for line in str(err).splitlines() if line.strip()] or [""]
        status, detail = "fail", f"{type(err).__name__}: {lines[-1][-300:]}"  # the whole of it is printed above
    with open(result_path, "w") as f:
        json.dump({"status": status, "detail": detail, "headline": HEADLINE}, f)


def run_check(name, accelerator):
    """The parent's side: the check in a fresh process, bounded by TIMEOUT."""
    with tempfile.TemporaryDirectory() as tmp:
        result = os.path.join(tmp, "result.json")
        cmd = [sys.executable, os.path.abspath(__file__), "--check", name, result]
        cmd += ["--cpu"] if accelerator == "cpu" else []
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT, env=child_env(), cwd=tmp)
        except subprocess.TimeoutExpired:
            return {"status": "fail", "detail": f"timed out after {TIMEOUT} s", "headline": []}
        if not os.path.exists(result):
            return {"status": "fail", "detail": f"exit {proc.returncode}: {proc.stderr.strip()[-600:]}",
                    "headline": []}
        outcome = json.load(open(result))
        if outcome["status"] == "fail":
            print(f"--- {name}: output of the failed check ---\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}",
                  flush=True)
        return outcome


def fetch_wheels():
    """Here, with a network: DeepSpeed built as a wheel against this torch, and its needs the GPU image lacks."""
    os.makedirs(WHEELS, exist_ok=True)
    pip = [sys.executable, "-m", "pip"]
    subprocess.run(pip + ["wheel", "-q", "--no-deps", "--no-build-isolation", "-w", WHEELS, "deepspeed==0.19.8"],
                   check=True)
    subprocess.run(pip + ["download", "-q", "--no-deps", "--only-binary=:all:", "--python-version", "3.12",
                          "--implementation", "cp", "--platform", "manylinux_2_28_x86_64", "--platform",
                          "manylinux_2_17_x86_64", "--platform", "manylinux2014_x86_64", "-d", WHEELS, *WHEEL_PINS],
                   check=True)
    print("\n".join(sorted(os.listdir(WHEELS))))


def print_headline(rows):
    if not rows:
        return
    print("\nGPT benchmark (benchmarks/gpt.py, lockstep: the three loops step in turn in one process)")
    header = ["setting", "variant", "tokens/s", "ratio to (a)", "step", "FLOPs/step", "MFU", "= (a)"]
    print("| " + " | ".join(header) + " |\n|" + "---|" * len(header))
    for r in rows:
        mfu = f"{100 * r['mfu']:.1f}%" if r.get("mfu") is not None else "n/a (no peak for this device)"
        print(f"| {r['setting']} | {r['label']} | {r['tokens_per_s']:,.0f} | {r['ratio']:.3f}x | "
              f"{1000 * r['step_s']:.2f} ms | {r['flops_per_step']:.3g} | {mfu} | {'yes' if r['same_as_raw'] else 'no'} |")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cpu", action="store_true", help="run the checks' CPU twins (to test this script)")
    parser.add_argument("--only", nargs="+", choices=list(CHECKS), metavar="CHECK", help="run only these checks")
    parser.add_argument("--list", action="store_true", help="list the checks' names")
    parser.add_argument("--json", metavar="FILE", help="also write the table and the headline rows here")
    parser.add_argument("--fetch-wheels", action="store_true", help=f"download the wheels a GPU image lacks to {WHEELS}")
    parser.add_argument("--check", nargs=2, metavar=("NAME", "RESULT"), help=argparse.SUPPRESS)
    parser.add_argument("--worker", nargs=2, metavar=("NAME", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    accelerator = "cpu" if args.cpu else "cuda"
    if args.list:
        print("\n".join(f"{name:12} {label}" for name, (label, _) in CHECKS.items()))
        return 0
    if args.fetch_wheels:
        fetch_wheels()
        return 0
    if args.worker:
        names = args.worker[0].split(",")
        if len(names) == 1:
            WORKERS[names[0]](args.worker[1], accelerator)
            return 0
        if accelerator != "cpu":
            parser.error("several workers in one run are for the CPU twins' tests only (--cpu)")
        for name in names:  # run_workers_together: each its folder, in the same processes and process group
            folder = os.path.join(args.worker[1], name)
            os.makedirs(folder, exist_ok=True)
            WORKERS[name](folder, accelerator)
        return 0
    if args.check:
        run_one(args.check[0], accelerator, args.check[1])
        return 0
    if accelerator == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: skipped")  # (--cpu runs the CPU twins)
        return 0
    if accelerator == "cuda":
        names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {len(names)} GPU(s): {', '.join(names)}")
    else:
        print(f"torch {torch.__version__}, CPU twins (gloo, {os.cpu_count()} cores)")
    started = time.monotonic()
    rows, headline = [], []
    for name in args.only or list(CHECKS):
        begin = time.monotonic()
        outcome = run_check(name, accelerator)
        headline += outcome["headline"]
        rows.append((CHECKS[name][0], outcome["status"], time.monotonic() - begin, outcome["detail"]))
        print(f"{rows[-1][1].upper():4} {rows[-1][2]:5.1f}s  {rows[-1][0]}", flush=True)
    width = max(len(r[0]) for r in rows)
    print(f"\n{'check':{width}}  result  time    detail")
    for label, status, seconds, detail in rows:
        print(f"{label:{width}}  {status.upper():6}  {seconds:5.1f}s  {detail}")
    print_headline(headline)
    failed = [r[0] for r in rows if r[1] == "fail"]
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": accelerator, "seconds": time.monotonic() - started, "headline": headline,
                       "checks": [dict(zip(("check", "status", "seconds", "detail"), r)) for r in rows]}, f, indent=1)
    counts = {s: sum(r[1] == s for r in rows) for s in ("pass", "fail", "skip")}
    print(f"\n{counts['pass']} passed, {counts['fail']} failed, {counts['skip']} skipped in "
          f"{time.monotonic() - started:.0f} s" + (f"; FAILED: {failed}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
