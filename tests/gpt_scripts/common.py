"""The short form of examples/gpt.py that the tests run: a 2-layer, 64-wide GPT on 2-digit sums, 200 steps of 128.

See tests/test_gpt_example.py for what it reaches and what the tests ask of it.
"""
import os
import sys

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "examples")
if EXAMPLES not in sys.path:
    sys.path.insert(0, EXAMPLES)

SHORT = ["--digits", "2", "--n_layer", "2", "--n_embd", "64", "--batch_size", "128", "--max_steps", "200",
         "--warmup", "20", "--lr", "1e-2", "--train_size", "30000", "--val_size", "500", "--samples", "4"]
