import pytest
import torch

from helpers import Linear, loader, quiet
from tasktrain import Trainer
from tasktrain.strategies.precision import MixedPrecision, make_precision, normalize_precision


@pytest.mark.parametrize("alias, name", [(None, "32-true"), (32, "32-true"), ("32", "32-true"), (16, "16-mixed"),
                                         ("16", "16-mixed"), ("bf16", "bf16-mixed"), (64, "64-true"),
                                         ("bf16-mixed", "bf16-mixed")])
def test_aliases(alias, name):
    assert normalize_precision(alias) == name
    assert Trainer(precision=alias, **quiet()).precision == name


class DtypeProbe(Linear):
    def training_step(self, batch, batch_idx):
        x, y = batch
        out = self(x)
        self.seen = (out.dtype, x.dtype, self.layer.weight.dtype)
        return torch.nn.functional.mse_loss(out.float(), y.to(out.dtype).float())


def test_bf16_mixed_autocasts_forward_and_keeps_fp32_weights():
    module = DtypeProbe()
    Trainer(max_steps=2, precision="bf16-mixed", **quiet()).fit(module, loader())
    assert module.seen == (torch.bfloat16, torch.float32, torch.float32)


def test_64_true_converts_module_and_inputs():
    module = DtypeProbe()
    Trainer(max_steps=2, precision=64, **quiet()).fit(module, loader())
    assert module.seen == (torch.float64, torch.float64, torch.float64)


def test_16_mixed_on_cpu_warns_scales_and_trains():
    module = DtypeProbe()
    before = module.layer.weight.detach().clone()
    with pytest.warns(UserWarning, match="bf16-mixed"):
        trainer = Trainer(max_steps=40, precision=16, **quiet())
    trainer.fit(module, loader())  # GradScaler starts at 2**16 and backs off over the first (skipped) steps
    assert module.seen[0] == torch.float16
    assert trainer.strategy.precision.scaler.is_enabled()
    assert not torch.equal(before, module.layer.weight)


@pytest.mark.filterwarnings("ignore:precision=.16-mixed.")
def test_grad_scaler_skips_inf_steps_and_counts_them():
    class InfGrad(Linear):
        def on_after_backward(self):
            if self.global_step == 25:
                self.layer.weight.grad.fill_(float("inf"))

    def skipped(module):
        trainer = Trainer(max_steps=30, precision="16-mixed", **quiet())
        trainer.fit(module, loader())
        return trainer.strategy.precision.skipped_steps

    # The first steps overflow anyway while the scale backs off from 2**16; the injected inf adds exactly one.
    baseline = skipped(Linear())
    assert 0 < baseline < 30
    assert skipped(InfGrad()) == baseline + 1


@pytest.mark.filterwarnings("ignore:precision=.16-mixed.")
def test_unscale_is_idempotent_within_a_step():
    precision = MixedPrecision("16-mixed", "cpu")
    p = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([p], lr=0.1)
    precision.backward((p * 3).sum())
    precision.unscale(opt)
    precision.unscale(opt)  # GradScaler would raise on the second unscale_
    torch.testing.assert_close(p.grad, torch.full((2,), 3.0))
    assert precision.optimizer_step(opt) is True
    torch.testing.assert_close(p.detach(), torch.full((2,), 0.7))


@pytest.mark.filterwarnings("ignore:precision=.16-mixed.")
def test_precision_state_round_trips():
    a = make_precision("16-mixed", "cpu")
    a.scaler.scale(torch.ones(1))  # the scale tensor is created lazily
    a.scaler.update(1024.0)
    b = make_precision("16-mixed", "cpu")
    b.load_state_dict(a.state_dict())
    assert b.scaler.get_scale() == 1024.0
