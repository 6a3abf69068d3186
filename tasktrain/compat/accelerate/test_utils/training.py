"""Accelerate's `accelerate.test_utils.training` fixtures: a tiny linear-regression data set and model.

They draw the same numbers as Accelerate's for the same seed (numpy's default_rng: x from a standard normal, then the
noise from a normal of scale 0.1), so a run on tasktrain and one on Accelerate train on identical data and can be
compared number for number. Accelerate's `mocked_dataloaders*` (they download a tokenizer and read MRPC files from
Accelerate's own test tree) are not provided.
"""
import numpy as np
import torch


class RegressionDataset:
    """`length` pairs {"x", "y"} with y = a * x + b + noise (x ~ N(0, 1), noise ~ N(0, 0.1)), as float32 scalars.

    seed=None draws fresh numbers each time, like Accelerate's; give a seed for a fixed data set.
    """

    def __init__(self, a=2, b=3, length=64, seed=None):
        generator = np.random.default_rng(seed)
        self.length = length
        # The draw order (all x first, then all noise) is what makes the numbers equal Accelerate's for a seed.
        self.x = generator.normal(size=(length,)).astype(np.float32)
        noise = generator.normal(scale=0.1, size=(length,)).astype(np.float32)
        self.y = a * self.x + b + noise

    def __len__(self):
        return self.length

    def __getitem__(self, index):
        return {"x": self.x[index], "y": self.y[index]}


class RegressionModel(torch.nn.Module):
    """y = x * a + b with two scalar float32 parameters `a` and `b` (start values a, b).

    Like Accelerate's, it prints the parameter and input dtypes once, on its first forward (the mixed-precision checks
    of Accelerate's scripts read that line); `double_output` is accepted and unused, as there.
    """

    def __init__(self, a=0, b=0, double_output=False):
        super().__init__()
        self.a = torch.nn.Parameter(torch.tensor(a).float())
        self.b = torch.nn.Parameter(torch.tensor(b).float())
        self.first_batch = True

    def forward(self, x=None):
        if self.first_batch:
            print(f"Model dtype: {self.a.dtype}, {self.b.dtype}. Input dtype: {x.dtype}")
            self.first_batch = False
        return x * self.a + self.b
