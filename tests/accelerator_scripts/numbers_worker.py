"""Small scripts shaped like Accelerate 1.15's examples (cv_example, complete_nlp_example, by_feature/
gradient_accumulation, automatic_gradient_accumulation, cross_validation, checkpointing), run under Accelerate itself
or, imports renamed, under tasktrain (issue 41). Each case writes its trained weights (and what it measured) to
OUT/{case}_{framework}_rank{r}.pt, for tests/test_accelerate_numbers.py to compare.

    python numbers_worker.py accelerate|tasktrain|accelerate,tasktrain OUT CASE [CASE ...]
    CASE: vision, nlp, options, autoacc, crossval, resume_full, resume_save, resume_load, resume_cross
"""
import gc
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

FRAMEWORKS, OUT, CASES = sys.argv[1].split(","), sys.argv[2], sys.argv[3:]
FRAMEWORK = Accelerator = AcceleratorState = DataLoaderConfiguration = ProjectConfiguration = None
find_executable_batch_size = set_seed = None


def use(framework):
    """Import the names as the script would: Accelerate's, or the same script with its imports renamed as
    docs/accelerator.md says. Several frameworks in one launch run one after the other in the same processes."""
    global FRAMEWORK, Accelerator, AcceleratorState, DataLoaderConfiguration, ProjectConfiguration
    global find_executable_batch_size, set_seed
    FRAMEWORK = framework
    if framework == "accelerate":
        from accelerate import Accelerator
        from accelerate.state import AcceleratorState
        from accelerate.utils import DataLoaderConfiguration, ProjectConfiguration, find_executable_batch_size, set_seed
    else:
        from tasktrain import Accelerator
        from tasktrain.utils import DataLoaderConfiguration, ProjectConfiguration, find_executable_batch_size, set_seed

        AcceleratorState = None


class Images(Dataset):
    """cv_example's stand-in: a random crop and flip per item, drawn from torch's global generator."""

    def __init__(self, images, labels, augment):
        self.images, self.labels, self.augment = images, labels, augment

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        image = self.images[i]
        if self.augment:
            top, left = torch.randint(0, 3, (2,)).tolist()
            image = image[:, top:top + 6, left:left + 6]
            if torch.rand(()) < 0.5:
                image = image.flip(-1)
        else:
            image = image[:, 1:7, 1:7]
        return {"image": image, "label": self.labels[i]}


class Texts(Dataset):
    def __init__(self, tokens, labels):
        self.tokens, self.labels = tokens, labels

    def __len__(self):
        return len(self.tokens)

    def __getitem__(self, i):
        return {"input_ids": self.tokens[i], "labels": self.labels[i]}


class TextModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(50, 8)
        self.drop = torch.nn.Dropout(0.2)
        self.head = torch.nn.Linear(8, 2)

    def forward(self, input_ids, labels=None):
        logits = self.head(self.drop(self.embed(input_ids).mean(1)))
        return logits, F.cross_entropy(logits, labels)


def linear_warmup(optimizer, warmup, total):  # get_linear_schedule_with_warmup's shape
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: s / max(1, warmup) if s < warmup else max(0.0, (total - s) / max(1, total - warmup)))


def text_data(n=22):
    generator = torch.Generator().manual_seed(5)  # the data set itself is fixed
    return Texts(torch.randint(0, 50, (n, 6), generator=generator), torch.randint(0, 2, (n,), generator=generator))


def evaluate(accelerator, model, loader):
    model.eval()
    correct = total = 0
    for batch in loader:
        with torch.no_grad():
            logits, _ = model(**batch)
        predictions, references = accelerator.gather_for_metrics((logits.argmax(-1), batch["labels"]))
        correct += int((predictions == references).sum())
        total += len(references)
    return correct / total


def weights(accelerator, model):
    return {k: v.detach().cpu().clone() for k, v in accelerator.unwrap_model(model).state_dict().items()}


# -- the cases ---------------------------------------------------------------------------------------------------------
def vision():
    """cv_example: set_seed, a split from numpy, random augmentation, Adam + OneCycleLR over len(train_dataloader),
    gather_for_metrics."""
    accelerator = Accelerator(cpu=True)
    set_seed(42)
    generator = torch.Generator().manual_seed(3)
    images, labels = torch.randn(30, 3, 8, 8, generator=generator), torch.randint(0, 4, (30,), generator=generator)
    perm = np.random.permutation(30)
    train_split, eval_split = perm[:22], perm[22:]
    train = DataLoader(Images(images[train_split], labels[train_split], True), shuffle=True, batch_size=4)
    evaluation = DataLoader(Images(images[eval_split], labels[eval_split], False), shuffle=False, batch_size=3)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 6, 3), torch.nn.ReLU(), torch.nn.Dropout(0.1),
                                torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(6, 4))
    model = model.to(accelerator.device)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-2 / 25)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=3e-2, epochs=2, steps_per_epoch=len(train))
    model, optimizer, train, evaluation, scheduler = accelerator.prepare(model, optimizer, train, evaluation,
                                                                        scheduler)
    metrics = []
    for _ in range(2):
        model.train()
        for batch in train:
            loss = F.cross_entropy(model(batch["image"]), batch["label"])
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
        model.eval()
        correct = total = 0
        for batch in evaluation:
            with torch.no_grad():
                predictions = model(batch["image"]).argmax(-1)
            predictions, references = accelerator.gather_for_metrics((predictions, batch["label"]))
            correct += int((predictions == references).sum())
            total += len(references)
        metrics.append([correct, total])
    return accelerator, model, {"metrics": metrics, "lr": scheduler.get_last_lr()[0], "rng": torch.rand(1).item()}


def nlp():
    """complete_nlp_example / by_feature/gradient_accumulation: accumulate(), clipping where gradients sync,
    AdamW + a linear warmup schedule, dropout."""
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
    set_seed(42)
    train = DataLoader(text_data(), shuffle=True, batch_size=4)
    evaluation = DataLoader(text_data(9), shuffle=False, batch_size=4)
    model = TextModel().to(accelerator.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-2)
    scheduler = linear_warmup(optimizer, 2, len(train) * 3 // 2)
    model, optimizer, train, evaluation, scheduler = accelerator.prepare(model, optimizer, train, evaluation,
                                                                        scheduler)
    metrics, norms = [], []
    for _ in range(3):
        model.train()
        for batch in train:
            with accelerator.accumulate(model):
                _, loss = model(**batch)
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    norms.append(float(accelerator.clip_grad_norm_(model.parameters(), 0.5)))
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
        metrics.append(evaluate(accelerator, model, evaluation))
    return accelerator, model, {"metrics": metrics, "norms": norms, "lr": scheduler.get_last_lr()[0],
                                "rng": torch.rand(1).item()}


def options():
    """The knobs that change numbers: split_batches, use_seedable_sampler, step_scheduler_with_optimizer=False,
    a window of 3 with a short last one (the loader's end closes it), clip_grad_value_."""
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=3, step_scheduler_with_optimizer=False,
                              dataloader_config=DataLoaderConfiguration(split_batches=True, use_seedable_sampler=True))
    set_seed(42)
    train = DataLoader(text_data(), shuffle=True, batch_size=4)
    model = TextModel().to(accelerator.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.7)
    model, optimizer, train, scheduler = accelerator.prepare(model, optimizer, train, scheduler)
    for _ in range(2):
        model.train()
        for batch in train:
            with accelerator.accumulate(model):
                _, loss = model(**batch)
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    accelerator.clip_grad_value_(model.parameters(), 0.05)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
    return accelerator, model, {"lr": scheduler.get_last_lr()[0], "rng": torch.rand(1).item()}


def autoacc():
    """automatic_gradient_accumulation: find_executable_batch_size halves the batch after an out-of-memory error,
    the accumulation steps grow to keep the global batch; free_memory between tries."""
    accelerator = Accelerator(cpu=True)
    observed = 8
    result = {}

    @find_executable_batch_size(starting_batch_size=observed)
    def inner(batch_size):
        nonlocal accelerator
        accelerator.gradient_accumulation_steps = observed // batch_size
        accelerator.free_memory()
        set_seed(42)
        model = TextModel().to(accelerator.device)
        train = DataLoader(text_data(), shuffle=True, batch_size=batch_size)
        optimizer = torch.optim.AdamW(model.parameters(), lr=2e-2)
        scheduler = linear_warmup(optimizer, 1, len(train) * 2)
        model, optimizer, train, scheduler = accelerator.prepare(model, optimizer, train, scheduler)
        if batch_size > 4:
            raise RuntimeError("CUDA out of memory. (a stand-in)")
        for _ in range(2):
            model.train()
            for batch in train:
                with accelerator.accumulate(model):
                    _, loss = model(**batch)
                    accelerator.backward(loss)
                    optimizer.step()
                    scheduler.step()
                    optimizer.zero_grad()
        result.update(model=model, lr=scheduler.get_last_lr()[0], batch_size=batch_size)

    inner()
    return accelerator, result["model"], {"lr": result["lr"], "batch_size": result["batch_size"],
                                          "steps": accelerator.gradient_accumulation_steps,
                                          "rng": torch.rand(1).item()}


def crossval():
    """by_feature/cross_validation: folds from numpy, a new model per fold, manual accumulation (loss / steps,
    step on step % steps == 0), free_memory(model, optimizer), test predictions averaged over the folds."""
    accelerator = Accelerator(cpu=True)
    set_seed(42)
    data, test = text_data(24), DataLoader(text_data(8), shuffle=False, batch_size=4)
    folds = np.array_split(np.random.permutation(24), 2)
    predictions, final = [], None
    for fold in range(2):
        valid_idx = folds[fold]
        train_idx = np.concatenate([folds[f] for f in range(2) if f != fold])
        train = DataLoader(Texts(data.tokens[train_idx], data.labels[train_idx]), shuffle=True, batch_size=2)
        evaluation = DataLoader(Texts(data.tokens[valid_idx], data.labels[valid_idx]), shuffle=False, batch_size=4)
        model = TextModel().to(accelerator.device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=2e-2)
        scheduler = linear_warmup(optimizer, 1, len(train) * 2 // 2)
        model, optimizer, train, evaluation, scheduler = accelerator.prepare(model, optimizer, train, evaluation,
                                                                            scheduler)
        test_prepared = accelerator.prepare(test)
        for _ in range(2):
            model.train()
            for step, batch in enumerate(train):
                _, loss = model(**batch)
                accelerator.backward(loss / 2)
                if step % 2 == 0:
                    optimizer.step()
                    scheduler.step()
                    optimizer.zero_grad()
        model.eval()
        fold_predictions = []
        for batch in test_prepared:
            with torch.no_grad():
                logits, _ = model(**batch)
            fold_predictions.append(accelerator.gather_for_metrics(logits.softmax(-1)).cpu())
        predictions.append(torch.cat(fold_predictions))
        final = weights(accelerator, model)
        model, optimizer = accelerator.free_memory(model, optimizer)
    return accelerator, final, {"predictions": torch.stack(predictions).mean(0), "rng": torch.rand(1).item()}


def resume(mode):
    """complete_nlp_example with checkpointing: save_state() under ProjectConfiguration(automatic_checkpoint_naming,
    total_limit=2) after overall steps 2, 4 and 8 (mode "save": stop there; "full": go on), or load_state and go on
    (mode "load": this framework's newest checkpoint; "cross": the other framework's): the script is Accelerate's,
    which computes the epoch and the steps done from the step count and calls skip_first_batches."""
    project = os.path.join(OUT, f"resume_{FRAMEWORK}" + ("_full" if mode == "full" else ""))
    accelerator = Accelerator(cpu=True, project_config=ProjectConfiguration(
        project_dir=project, automatic_checkpoint_naming=True, total_limit=2))
    set_seed(42)
    train = DataLoader(text_data(), shuffle=True, batch_size=4)
    model = TextModel().to(accelerator.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-2)
    scheduler = linear_warmup(optimizer, 2, len(train) * 3)
    model, optimizer, train, scheduler = accelerator.prepare(model, optimizer, train, scheduler)
    starting_epoch, resume_step, overall_step, save_at = 0, None, 0, 8
    if mode == "load":
        accelerator.load_state()  # the newest checkpoint_N
    if mode == "cross":
        other = {"accelerate": "tasktrain", "tasktrain": "accelerate"}[FRAMEWORK]
        accelerator.load_state(os.path.join(OUT, f"resume_{other}", "checkpoints", "checkpoint_2"))
    if mode in ("load", "cross"):
        overall_step = save_at
        starting_epoch, resume_step = divmod(save_at, len(train))
    for epoch in range(starting_epoch, 3):
        model.train()
        active = train
        if resume_step is not None and epoch == starting_epoch:
            # the example skips the steps done (tasktrain's load_state already put the loader there: the same)
            active = accelerator.skip_first_batches(train, resume_step)
        for batch in active:
            _, loss = model(**batch)
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            overall_step += 1
            if overall_step in (2, 4, save_at) and mode in ("full", "save"):
                accelerator.save_state()
                if mode == "save" and overall_step == save_at:
                    accelerator.wait_for_everyone()  # every rank's random_states file is written
                    folders = sorted(os.listdir(os.path.join(project, "checkpoints")))
                    files = sorted(os.listdir(os.path.join(project, "checkpoints", folders[-1])))
                    return accelerator, model, {"folders": folders, "files": files}
    return accelerator, model, {"rng": torch.rand(1).item(), "epoch": starting_epoch}


RUN = {"vision": vision, "nlp": nlp, "options": options, "autoacc": autoacc, "crossval": crossval,
       "resume_full": lambda: resume("full"), "resume_save": lambda: resume("save"),
       "resume_load": lambda: resume("load"), "resume_cross": lambda: resume("cross")}

# Test time only: everything imported up front (an optimizer's first construction imports torch._dynamo), then
# frozen out of the garbage collector, so that the gc.collect() of free_memory / find_executable_batch_size is cheap.
for framework in FRAMEWORKS:
    use(framework)
torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))])
gc.freeze()

for case in CASES:  # each case under each framework in turn (resume_cross reads the other's folder)
    for framework in FRAMEWORKS:
        use(framework)
        began = time.perf_counter()
        accelerator, model, extra = RUN[case]()
        print(f"{case} {framework}: {time.perf_counter() - began:.2f} s", file=sys.stderr)
        state = model if isinstance(model, dict) else weights(accelerator, model)
        extra["num_processes"] = accelerator.num_processes
        torch.save({"weights": state, **extra},
                   os.path.join(OUT, f"{case}_{framework}_rank{accelerator.process_index}.pt"))
        accelerator.wait_for_everyone()
        if AcceleratorState is not None:
            AcceleratorState._reset_state(True)  # the next case builds its Accelerator afresh, as a new script would
        del accelerator, model
