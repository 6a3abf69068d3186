"""examples/gpt.py's model and data, trained with the Accelerator and a loop of your own.

    python examples/gpt_accelerator.py                                        # one process
    tasktrain launch --num_processes 2 examples/gpt_accelerator.py            # DDP, two processes
    tasktrain launch --num_processes 2 examples/gpt_accelerator.py --strategy fsdp     # FSDP2: one unit per block
    tasktrain launch --num_processes 2 examples/gpt_accelerator.py --strategy deepspeed_stage_2
    python examples/gpt_accelerator.py --precision bf16-mixed --compile

The Accelerator never starts processes: a launcher does (`tasktrain launch`, torchrun). Same model, data,
optimizer, learning-rate schedule and clipping as examples/gpt.py, so the two reach the same accuracy. The data
order is Accelerate's (the DataLoader's own shuffle, whole batches per process): on one process in fp32 the run ends
with the very weights of this loop in plain PyTorch over the plain DataLoader.
"""
import argparse
import time

import torch
from torch.utils.data import DataLoader

from gpt import (GPT, STRATEGIES, VOCAB_SIZE, add_arguments, addition_data, block_size, configure_adamw, exact_match,
                 generate, lr_factor, prompts_for, sample_pairs, show_sums)
from tasktrain import Accelerator, DeepSpeed, seed_everything


def evaluate(accelerator, model, loader):
    """Held-out exact match (and loss) over every process's share of the loader, each sum counted once."""
    model.eval()
    right, losses = [], []
    with torch.no_grad():
        for x, y in loader:
            logits, loss = model(x, y)
            right.append(accelerator.gather_for_metrics(exact_match(logits, y)))
            losses.append(loss)
    model.train()
    return float(torch.cat(right).mean()), float(accelerator.reduce(torch.stack(losses).mean(), "mean"))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--strategy", default="auto", choices=STRATEGIES,
                        help="auto: what the launcher says (ddp under several processes)")
    args = add_arguments(parser).parse_args(argv)

    strategy = None if args.strategy == "auto" else args.strategy
    if strategy and strategy.startswith("deepspeed"):
        # DeepSpeed clips inside its own step: the clipping value belongs in its config.
        strategy = DeepSpeed(stage=int(strategy[-1]), gradient_clipping=1.0)
    accelerator = Accelerator(mixed_precision=args.precision, strategy=strategy)
    seed_everything(args.seed)
    train, val = addition_data(args.digits, args.train_size, args.val_size, seed=args.seed)
    model = GPT(VOCAB_SIZE, block_size(args.digits), args.n_layer, args.n_head, args.n_embd)
    optimizer = configure_adamw(model, args.lr, weight_decay=0.1)
    # A prepared scheduler steps once per process at each optimizer step (Accelerate's rule, docs/accelerator.md):
    # step // num_processes is the optimizer step, so the schedule is gpt.py's on any number of processes.
    processes = accelerator.num_processes
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step // processes, args.warmup, args.max_steps))
    if args.compile:
        model = torch.compile(model)  # saved weights keep the plain names (no "_orig_mod.")
    train_loader = DataLoader(train, batch_size=args.batch_size, shuffle=True)
    val_loader = DataLoader(val, batch_size=500)
    model, optimizer, train_loader, val_loader, scheduler = accelerator.prepare(
        model, optimizer, train_loader, val_loader, scheduler)

    start = time.perf_counter()
    step = 0
    model.train()
    while step < args.max_steps:
        for x, y in train_loader:
            _, loss = model(x, y)
            accelerator.backward(loss)
            accelerator.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            step += 1
            if step % 100 == 0:
                accelerator.print(f"step {step}: train_loss {loss.item():.4f}")
            if step == args.max_steps:
                break
        else:
            accuracy, val_loss = evaluate(accelerator, model, val_loader)
            accelerator.print(f"epoch {train_loader.epoch - 1}: val_loss {val_loss:.4f}, val_exact_match {accuracy:.4f}")
    seconds = time.perf_counter() - start
    accuracy, val_loss = evaluate(accelerator, model, val_loader)

    # The whole weights on every process (under ZeRO-3 they are gathered), then generation on the main one.
    weights = accelerator.get_state_dict(model)
    texts = None
    if accelerator.is_main_process:
        print(f"held-out exact match: {accuracy:.4f} on {len(val)} sums after {step} steps, {seconds:.0f} s")
        plain = GPT(VOCAB_SIZE, block_size(args.digits), args.n_layer, args.n_head, args.n_embd)
        plain.load_state_dict(weights)
        pairs = sample_pairs(args)
        texts = show_sums(pairs, generate(plain.eval(), prompts_for(pairs, args.digits), args.digits + 2),
                          args.digits)
    accelerator.end_training()
    return {"val_exact_match": accuracy, "val_loss": val_loss}, weights, texts


if __name__ == "__main__":
    main()
