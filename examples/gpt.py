"""A small GPT learns to add: it reads "123+045=" and writes the sum, "0168", token by token, then a full stop.

    python examples/gpt.py                                           # one process
    python examples/gpt.py --strategy ddp --devices 2                # two processes (gloo on CPU)
    python examples/gpt.py --strategy deepspeed_stage_2 --devices 2  # DeepSpeed ZeRO stage 2 (or _3)
    python examples/gpt.py --strategy fsdp --devices 2               # FSDP2: parameters sharded over the two
    python examples/gpt.py --precision bf16-mixed --compile          # autocast to bfloat16, compiled forward

Everything is in this file: the data (generated, no download), the model (a decoder-only transformer in the
style of nanoGPT: pre-norm blocks, causal self-attention through scaled_dot_product_attention, the output
layer tied to the token embedding) and the TaskModule that trains it. The sums held out for validation are
pairs the model never trains on; "exact match" counts a sum right only when every digit of the answer and the
full stop after it are right. Exact match with the true answer fed in (one forward pass) is the same number
as exact match of greedy generation: greedy decoding writes the true answer exactly when, at each position,
the most likely next token given the true prefix is the true next token.

At its default size (2 layers, 4 heads, 128 wide, 0.4M parameters; numbers below 1000) it gets at least 99% of
2,000 held-out sums exactly right after its 1,000 steps of 256 sums (measured: 100%). That is about 2.5 minutes
of CPU time on one core (136 s measured with one torch thread; docs/examples.md has the measured runs).
examples/gpt_accelerator.py trains the same model with the Accelerator and a loop of your own.
"""
import argparse
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from tasktrain import TaskModule, Trainer, seed_everything

# `--strategy` choices: the ones this example is tested on (tests/test_gpt_example.py).
STRATEGIES = ["auto", "ddp", "fsdp", "deepspeed_stage_2", "deepspeed_stage_3"]
PRECISIONS = ["32-true", "bf16-mixed"]

# -- the data ---------------------------------------------------------------------------------------------------------
VOCAB = "0123456789+=."  # "." ends the answer
END = VOCAB.index(".")
VOCAB_SIZE = len(VOCAB)
IGNORE = -1  # the target of the positions that are not scored: the prompt's


def block_size(digits):
    """Tokens a model sees: "a+b=c." (a and b of `digits` digits, c of one more) less its last token."""
    return 3 * digits + 3


def encode(a, b, digits):
    """(input, target) rows for a+b: targets are the next tokens of the answer ("c."), IGNORE elsewhere.

    Numbers are written with leading zeros to a fixed width ("007+345=0352."), so every digit of a place value
    sits at the same position in every sum: the model learns to add, not to find where the ones digit is."""
    prompt = f"{a:0{digits}d}+{b:0{digits}d}="
    text = prompt + f"{a + b:0{digits + 1}d}."
    tokens = [VOCAB.index(ch) for ch in text]
    x, y = tokens[:-1], tokens[1:]
    y = [t if i >= len(prompt) - 1 else IGNORE for i, t in enumerate(y)]
    return x, y


def held_out(a, b, digits):
    """One pair (a, b) in 16, spread over all pairs by a multiplicative hash: never trained on."""
    pair = a * 10 ** digits + b
    return (pair * 2654435761 % 2**32) >> 28 == 0


def addition_data(digits=3, train_size=100_000, val_size=2_000, seed=0):
    """Random training sums of numbers below 10**digits, and distinct held-out sums never in the training set."""
    g = torch.Generator().manual_seed(seed)
    train, val = [], {}
    while len(train) < train_size or len(val) < val_size:
        a, b = torch.randint(0, 10 ** digits, (2, train_size + val_size), generator=g)
        hidden = held_out(a, b, digits)
        val.update(dict.fromkeys(zip(a[hidden].tolist(), b[hidden].tolist())))  # distinct, in the order drawn
        train += zip(a[~hidden].tolist(), b[~hidden].tolist())
    train, val = train[:train_size], list(val)[:val_size]

    def tensors(rows):
        xs, ys = zip(*(encode(a, b, digits) for a, b in rows))
        return TensorDataset(torch.tensor(xs), torch.tensor(ys))

    return tensors(train), tensors(val)


def decode(tokens):
    return "".join(VOCAB[t] for t in tokens)


# -- the model --------------------------------------------------------------------------------------------------------
class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head, dropout):
        super().__init__()
        self.n_head, self.dropout = n_head, dropout
        self.qkv = nn.Linear(n_embd, 3 * n_embd)
        self.proj = nn.Linear(n_embd, n_embd)
        self.resid_dropout = nn.Dropout(dropout)

    def forward(self, x):
        batch, time_, channels = x.shape
        q, k, v = self.qkv(x).split(channels, dim=2)
        q, k, v = (t.view(batch, time_, self.n_head, channels // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0)
        y = y.transpose(1, 2).contiguous().view(batch, time_, channels)
        return self.resid_dropout(self.proj(y))


class Block(nn.Module):
    """Pre-norm: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, n_embd, n_head, dropout):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head, dropout)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd),
                                 nn.Dropout(dropout))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, vocab_size=VOCAB_SIZE, block_size=block_size(3), n_layer=2, n_head=4, n_embd=128, dropout=0.0):
        super().__init__()
        self.block_size = block_size
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(n_embd, n_head, dropout) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # weight tying: one matrix embeds tokens and scores them
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("proj.weight") or name.endswith("mlp.2.weight"):  # residual outputs, as in GPT-2
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))

    @staticmethod
    def _init_weights(module):
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx, targets=None):
        """Logits (batch, time, vocab); and the mean cross-entropy over the scored targets when they are given."""
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(positions))
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        if targets is None:
            return logits, None
        return logits, F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1), ignore_index=IGNORE)


def configure_adamw(model, lr, weight_decay, betas=(0.9, 0.99)):
    """AdamW with weight decay on the matrices only (not on biases, norms), as nanoGPT does. foreach=True: each
    update is a few calls over the whole list of parameters, not a dozen per parameter (torch picks the per-parameter
    loop on CPU by default); the same numbers, bit for bit, in less time on a small model, and much less under FSDP,
    where each call on a sharded parameter goes through DTensor's dispatch (a 2-process run: 12% less CPU per step
    under DDP, 18-20% under FSDP)."""
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=betas, foreach=True)


def lr_factor(step, warmup, max_steps, min_factor=0.1):
    """Linear warm-up, then cosine decay to min_factor of the peak at max_steps (a multiplier of the peak lr)."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, max_steps - warmup))
    return min_factor + 0.5 * (1.0 + math.cos(math.pi * progress)) * (1.0 - min_factor)


def exact_match(logits, targets):
    """Per row: 1.0 when every scored position's most likely token is the target."""
    scored = targets != IGNORE
    right = (logits.argmax(-1) == targets) | ~scored
    return right.all(dim=1).float()


@torch.no_grad()
def generate(model, prompts, new_tokens):
    """Greedy decoding: append the most likely next token to every row, `new_tokens` times. The prompts all have
    the same length (fixed-width numbers), so a batch needs no padding."""
    tokens = prompts
    for _ in range(new_tokens):
        logits, _ = model(tokens)
        tokens = torch.cat([tokens, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return tokens


def prompts_for(pairs, digits):
    """The prompts "aaa+bbb=" of (a, b) pairs, as a (len(pairs), 2 * digits + 2) tensor of token ids."""
    return torch.tensor([[VOCAB.index(ch) for ch in f"{a:0{digits}d}+{b:0{digits}d}="] for a, b in pairs])


def show_sums(pairs, generated, digits):
    """Print each generated sum and whether it is right; returns the texts."""
    texts = [decode(row) for row in generated.tolist()]
    for (a, b), text in zip(pairs, texts):
        print(f"  {text}  {'right' if text.endswith(f'={a + b:0{digits + 1}d}.') else 'wrong'}")
    return texts


# -- the TaskModule ---------------------------------------------------------------------------------------------------
class GPTAddition(TaskModule):
    def __init__(self, digits=3, n_layer=2, n_head=4, n_embd=128, dropout=0.0, lr=3e-3, weight_decay=0.1,
                 warmup=100, max_steps=1000):
        super().__init__()
        self.save_hyperparameters()
        self.model = GPT(VOCAB_SIZE, block_size(digits), n_layer, n_head, n_embd, dropout)

    def forward(self, idx, targets=None):
        return self.model(idx, targets)

    def training_step(self, batch, batch_idx):
        x, y = batch
        _, loss = self(x, y)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits, loss = self(x, y)
        self.log("val_loss", loss, sync_dist=True)
        self.log("val_exact_match", exact_match(logits, y).mean(), prog_bar=True, sync_dist=True)

    def predict_step(self, batch, batch_idx):
        (prompts,) = batch
        return generate(self, prompts, self.hparams.digits + 2)  # the answer's digits and the full stop

    def configure_optimizers(self):
        hp = self.hparams
        optimizer = configure_adamw(self.model, hp.lr, hp.weight_decay)
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, hp.warmup, hp.max_steps))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


def add_arguments(parser):
    """The model, data and training arguments (examples/gpt_accelerator.py takes the same)."""
    parser.add_argument("--precision", default="32-true", choices=PRECISIONS)
    parser.add_argument("--compile", action="store_true", help="compile the model's forward with torch.compile")
    parser.add_argument("--digits", type=int, default=3, help="operands have up to this many digits")
    parser.add_argument("--n_layer", type=int, default=2)
    parser.add_argument("--n_head", type=int, default=4)
    parser.add_argument("--n_embd", type=int, default=128)
    parser.add_argument("--batch_size", type=int, default=256, help="per process")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--max_steps", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--train_size", type=int, default=100_000)
    parser.add_argument("--val_size", type=int, default=2_000)
    parser.add_argument("--samples", type=int, default=5, help="sums to generate at the end")
    parser.add_argument("--seed", type=int, default=0)
    return parser


def sample_pairs(args):
    g = torch.Generator().manual_seed(args.seed + 1)
    return torch.randint(0, 10 ** args.digits, (args.samples, 2), generator=g).tolist()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--strategy", default="auto", choices=STRATEGIES)
    parser.add_argument("--devices", type=int, default=None, help="processes (CPU) or GPUs; default: auto")
    parser.add_argument("--root", default="runs/gpt", help="logs and checkpoints go here")
    args = add_arguments(parser).parse_args(argv)

    seed_everything(args.seed)
    train, val = addition_data(args.digits, args.train_size, args.val_size, seed=args.seed)
    module = GPTAddition(args.digits, args.n_layer, args.n_head, args.n_embd, lr=args.lr, warmup=args.warmup,
                         max_steps=args.max_steps)
    trainer = Trainer(strategy=args.strategy, devices=args.devices or "auto", precision=args.precision,
                      max_steps=args.max_steps, gradient_clip_val=1.0, log_every_n_steps=50,
                      default_root_dir=args.root)
    val_loader = DataLoader(val, batch_size=500)
    start = time.perf_counter()
    # --compile: the module's forward is compiled (training_step and the loop stay eager), and the checkpoints
    # keep the module's plain parameter names.
    trainer.fit(torch.compile(module) if args.compile else module,
                DataLoader(train, batch_size=args.batch_size, shuffle=True), val_loader)
    seconds = time.perf_counter() - start
    # Validation runs at each epoch's end; max_steps may stop mid-epoch, so the final weights are scored here.
    metrics = trainer.validate(module, val_loader)[0]
    pairs = sample_pairs(args)
    # Generation through the strategy, so that it also runs where the weights are sharded (ZeRO-3).
    generated = trainer.predict(module, DataLoader(TensorDataset(prompts_for(pairs, args.digits)), batch_size=64),
                                gather=True)  # every rank's rows, in order (one process: the list of batches)
    generated = torch.cat(generated) if isinstance(generated, list) else generated
    texts = None
    if trainer.is_global_zero:
        print(f"held-out exact match: {metrics['val_exact_match']:.4f} on {len(val)} sums after {trainer.global_step} "
              f"steps, {seconds:.0f} s")
        texts = show_sums(pairs, generated, args.digits)
    return trainer, metrics, texts


if __name__ == "__main__":
    main()
