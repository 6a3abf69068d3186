"""Run every CUDA path of tasktrain on a GPU machine and print a pass/fail table.

    python scripts/gpu_check.py          # exit code 1 when a check fails; 0 on a machine without CUDA
    python scripts/gpu_check.py --cpu    # the same checks on CPU (gloo, no SyncBatchNorm): tests this script

Checks: batches (tensors, tuples, dicts, namedtuples) placed on the GPU; fp16 autocast with an enabled
GradScaler; bf16 autocast; DataParallel over the visible GPUs (one GPU: the warned single-device fallback);
nccl DDP on 2 GPUs started by self-launch, with SyncBatchNorm; dispatch_model over GPU ids (when the
tasktrain.inference package exists). Checks that need 2 GPUs say "skip" with fewer.
"""
import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
import warnings

import torch
from torch.utils.data import DataLoader, TensorDataset

QUIET = dict(logger=False, enable_progress_bar=False, enable_checkpointing=False, num_sanity_val_steps=0)
Pair = collections.namedtuple("Pair", "x y")


def tiny_data(n=64, features=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=g)
    return TensorDataset(x, x.sum(1, keepdim=True) + 0.1 * torch.randn(n, 1, generator=g))


def make_regressor(record=None):
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
                record.append({"device": str(x.device), "rows": x.shape[0], "dtype": str(out.dtype)})
            loss = torch.nn.functional.mse_loss(out.float(), y)
            self.log("loss", loss, on_epoch=True)
            return loss

        def validation_step(self, batch, batch_idx):
            x, y = batch
            self.log("val_loss", torch.nn.functional.mse_loss(self.net(x).float(), y))

        def predict_step(self, batch, batch_idx):
            return self.net(batch[0])[:, 0]

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)

    return Regressor()


def fit(accelerator, record=None, epochs=3, batch_size=16, **kwargs):
    from tasktrain import Trainer

    model = make_regressor(record)
    trainer = Trainer(accelerator=accelerator, max_epochs=epochs, **QUIET, **kwargs)
    data = tiny_data(n=4 * batch_size)
    trainer.fit(model, DataLoader(data, batch_size=batch_size), DataLoader(data, batch_size=batch_size))
    return trainer, model


# -- the checks: each returns (status, detail) with status "pass" | "fail" | "skip" ---------------------------------
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
    record = []
    trainer, _ = fit(accelerator, record, precision="16-mixed")
    scaler = trainer.strategy.precision.scaler
    dtypes = {r["dtype"] for r in record}
    if dtypes != {"torch.float16"}:
        return "fail", f"forward outputs were {dtypes}, expected torch.float16"
    if not scaler.is_enabled():
        return "fail", "the GradScaler is disabled"
    loss = float(trainer.callback_metrics["loss_epoch"])
    return "pass", f"fp16 forward, GradScaler on (scale {scaler.get_scale():g}), final epoch loss {loss:.3f}"


def check_bf16(accelerator):
    record = []
    trainer, _ = fit(accelerator, record, precision="bf16-mixed")
    dtypes = {r["dtype"] for r in record}
    if dtypes != {"torch.bfloat16"}:
        return "fail", f"forward outputs were {dtypes}, expected torch.bfloat16"
    return "pass", f"bf16 forward, final epoch loss {float(trainer.callback_metrics['loss_epoch']):.3f}"


def check_data_parallel(accelerator):
    gpus = torch.cuda.device_count() if accelerator == "cuda" else 0
    batch_size = 4 * max(1, gpus)  # equal chunks: the mean of the copies' losses is then the batch's loss
    record = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer, model = fit(accelerator, record, batch_size=batch_size, strategy="dp")
    fell_back = any("running as a single device" in str(w.message) for w in caught)
    if gpus < 2:
        if not fell_back or trainer.strategy.parallel_ids:
            return "fail", f"{gpus} GPU(s): expected the single-device fallback with a warning"
        return "pass", f"{gpus} GPU(s): warned and ran as a single device on {trainer.strategy.root_device}"
    if fell_back or trainer.strategy.parallel_ids != list(range(gpus)):
        return "fail", f"expected DataParallel over {list(range(gpus))}, got {trainer.strategy.parallel_ids}"
    devices = {r["device"] for r in record}
    if len(devices) != gpus or {r["rows"] for r in record} != {4}:
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


def check_ddp(accelerator):
    gpus = torch.cuda.device_count() if accelerator == "cuda" else 2
    if gpus < 2:
        return "skip", f"needs 2 GPUs, found {gpus}"
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, os.path.abspath(__file__), "--ddp-worker", out]
        cmd += ["--cpu"] if accelerator == "cpu" else []
        env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
        if proc.returncode != 0:
            return "fail", f"exit code {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]}"
        ranks = [json.load(open(os.path.join(out, f"rank{r}.json"))) for r in (0, 1)]
    backend = "nccl" if accelerator == "cuda" else "gloo"
    for r, facts in enumerate(ranks):
        want = f"cuda:{r}" if accelerator == "cuda" else "cpu"
        if facts["backend"] != backend or facts["device"] != want:
            return "fail", f"rank {r}: backend {facts['backend']} on {facts['device']}, expected {backend} on {want}"
    if ranks[0]["params"] != ranks[1]["params"]:
        return "fail", "the two ranks ended with different weights"
    detail = f"{backend}, ranks on {ranks[0]['device']} and {ranks[1]['device']}, equal weights"
    if accelerator == "cuda":
        if not all(f["sync_batchnorm"] for f in ranks):
            return "fail", "BatchNorm was not converted to SyncBatchNorm"
        for r, facts in enumerate(ranks):
            diff = max(abs(a - b) for a, b in zip(facts["running_mean"], facts["expected_mean"]))
            if diff > 1e-4:
                return "fail", f"rank {r}: SyncBatchNorm's running mean is not both ranks' mean (off {diff:.2e})"
        detail += ", SyncBatchNorm statistics over both ranks"
    return "pass", detail


def ddp_worker(out, accelerator):
    """Run by check_ddp as its own script: the Trainer re-runs this command for rank 1."""
    import torch.distributed as dist

    from tasktrain import DDP, Callback, TaskModule, Trainer

    facts = {}

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
            facts["backend"] = dist.get_backend()
            facts["device"] = str(trainer.strategy.root_device)

    data = tiny_data(n=16)
    model = BatchNormNet()
    trainer = Trainer(strategy=DDP(sync_batchnorm=accelerator == "cuda"), accelerator=accelerator, devices=2,
                      max_steps=1, callbacks=[Record()], **QUIET)
    trainer.fit(model, DataLoader(data, batch_size=8))  # one step: both ranks' 8 rows are the 16 samples
    facts["params"] = [p.detach().cpu().flatten().tolist() for p in model.parameters()]
    facts["sync_batchnorm"] = isinstance(model.bn, torch.nn.SyncBatchNorm)
    facts["running_mean"] = model.bn.running_mean.cpu().tolist()
    facts["expected_mean"] = data.tensors[0].mean(0).tolist()
    with open(os.path.join(out, f"rank{trainer.global_rank}.json"), "w") as f:
        json.dump(facts, f)


def check_dispatch(accelerator):
    try:
        from tasktrain.inference import dispatch_model
    except ImportError:
        return "skip", "tasktrain.inference is not available"
    if accelerator != "cuda":
        return "skip", "needs CUDA"
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    x = torch.randn(5, 8)
    expected = model(x)
    second = 1 if torch.cuda.device_count() >= 2 else "cpu"
    dispatch_model(model, device_map={"0": 0, "1": 0, "2": second})
    out = model(x.cuda(0))
    if out.device != torch.device("cuda", 0):
        return "fail", f"the output came back on {out.device}, the input was on cuda:0"
    if not torch.allclose(out.cpu(), expected, atol=1e-4):
        return "fail", f"outputs differ from the undispatched model by {(out.cpu() - expected).abs().max():.2e}"
    where = "GPU 1" if second == 1 else "CPU (offloaded, run on GPU 0)"
    return "pass", f"layers on GPU 0 and {where}, same outputs as on CPU"


CHECKS = [
    ("batch placement", check_batch_placement),
    ("fp16 + GradScaler", check_fp16),
    ("bf16 autocast", check_bf16),
    ("DataParallel", check_data_parallel),
    ("DDP self-launch (+SyncBatchNorm)", check_ddp),
    ("dispatch_model", check_dispatch),
]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cpu", action="store_true", help="run the checks on CPU (to test this script)")
    parser.add_argument("--ddp-worker", metavar="OUT", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    accelerator = "cpu" if args.cpu else "cuda"
    if args.ddp_worker:
        ddp_worker(args.ddp_worker, accelerator)
        return 0
    if accelerator == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: skipped")
        return 0
    if accelerator == "cuda":
        names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {len(names)} GPU(s): {', '.join(names)}")
    rows = []
    for name, check in CHECKS:
        start = time.monotonic()
        try:
            status, detail = check(accelerator)
        except Exception as err:  # a crash is a failed check; the others still run
            traceback.print_exc()
            status, detail = "fail", f"{type(err).__name__}: {err}"
        rows.append((name, status, time.monotonic() - start, detail))
    width = max(len(r[0]) for r in rows)
    print(f"\n{'check':{width}}  result  time    detail")
    for name, status, seconds, detail in rows:
        print(f"{name:{width}}  {status.upper():6}  {seconds:5.1f}s  {detail}")
    failed = [r[0] for r in rows if r[1] == "fail"]
    summary = f"{len(rows) - len(failed)} of {len(rows)} checks passed or skipped"
    print(f"\n{summary}; FAILED: {failed}" if failed else f"\n{summary}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
