import warnings

import pytest
import torch

from helpers import Linear, loader, quiet
from tasktrain import Trainer
from tasktrain.plugins import MixedPrecision as MixedPrecisionPlugin
from tasktrain.strategies.precision import MixedPrecision, make_precision, normalize_precision


@pytest.mark.parametrize("alias, name", [(None, "32-true"), (32, "32-true"), ("32", "32-true"), (16, "16-mixed"),
                                         ("16", "16-mixed"), ("bf16", "bf16-mixed"), (64, "64-true"),
                                         ("bf16-mixed", "bf16-mixed"), ("bf16-true", "bf16-true"),
                                         ("16-true", "16-true")])
def test_aliases(alias, name):
    assert normalize_precision(alias) == name
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = Trainer(precision=alias, accelerator="cpu", **quiet())
    # Lightning's Trainer runs 16-mixed on a CPU as bf16-mixed, saying so (its MixedPrecision plugin keeps fp16)
    assert trainer.precision == ("bf16-mixed" if name == "16-mixed" else name)
    switched = [w for w in caught if "AMP with fp16 is not supported on CPU" in str(w.message)]
    assert len(switched) == (name == "16-mixed")


FP16_PLUGIN = dict(plugins=[MixedPrecisionPlugin("16-mixed", "cpu")])  # fp16 AMP on a CPU, as Lightning's plugin


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


def test_16_mixed_on_cpu_is_bf16_mixed_as_lightnings_and_the_plugin_keeps_fp16():
    module = DtypeProbe()
    with pytest.warns(UserWarning, match="Using `precision='bf16-mixed'` instead"):
        trainer = Trainer(max_steps=2, precision=16, **quiet())
    trainer.fit(module, loader())
    assert module.seen[0] == torch.bfloat16 and trainer.strategy.precision.scaler is None

    module = DtypeProbe()
    before = module.layer.weight.detach().clone()
    with pytest.warns(UserWarning, match="precision='bf16-mixed' is the fast half precision on CPU"):
        trainer = Trainer(max_steps=40, **FP16_PLUGIN, **quiet())
    trainer.fit(module, loader())  # GradScaler starts at 2**16 and backs off over the first (skipped) steps
    assert module.seen[0] == torch.float16 and trainer.precision == "16-mixed"
    assert trainer.strategy.precision.scaler.is_enabled()
    assert not torch.equal(before, module.layer.weight)


@pytest.mark.filterwarnings("ignore:precision=.16-mixed.")
def test_grad_scaler_skips_inf_steps_and_counts_them():
    class InfGrad(Linear):
        def on_after_backward(self):
            if self.global_step == 25:
                self.layer.weight.grad.fill_(float("inf"))

    def skipped(module):
        trainer = Trainer(max_steps=30, **FP16_PLUGIN, **quiet())
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


# -- true half precision: "bf16-true" / "16-true" ----------------------------------------------------------------------
class HalfProbe(Linear):
    """Adam (its eps representable in float16) and what the step sees: the input's, the weight's and a new tensor's
    dtype."""

    def training_step(self, batch, batch_idx):
        x, y = batch
        self.seen = (x.dtype, self.layer.weight.dtype, torch.zeros(1).dtype)
        return torch.nn.functional.mse_loss(self(x), y)

    def configure_optimizers(self):
        self.optimizer = torch.optim.Adam(self.parameters(), lr=1e-2, eps=1e-4)
        return self.optimizer


def _fit_half(precision, strategy="single_device", max_steps=4):
    module = HalfProbe()
    before = module.layer.weight.detach().clone()
    trainer = Trainer(strategy=strategy, devices=1, max_steps=max_steps, precision=precision, **quiet())
    trainer.fit(module, loader())
    return module, before, trainer


@pytest.mark.filterwarnings("ignore:precision=.16-true. on CPU")
@pytest.mark.parametrize("precision, dtype", [("bf16-true", torch.bfloat16), ("16-true", torch.float16)])
def test_true_half_stores_parameters_and_steps_the_optimizer_in_half(precision, dtype):
    assert normalize_precision(precision) == precision
    module, before, trainer = _fit_half(precision)
    assert module.seen == (dtype, dtype, dtype)  # inputs cast, weights half, new tensors default to half
    assert torch.get_default_dtype() == torch.float32  # restored after the forward
    weight = module.layer.weight
    assert weight.dtype == dtype and torch.isfinite(weight).all() and not torch.equal(weight, before.to(dtype))
    state = module.optimizer.state[weight]
    assert state["exp_avg"].dtype == dtype and state["exp_avg_sq"].dtype == dtype  # no fp32 master copy anywhere
    assert trainer.strategy.precision.skipped_steps == 0 and not hasattr(trainer.strategy.precision, "scaler")


@pytest.mark.filterwarnings("ignore:precision=.16-true. on CPU")
@pytest.mark.parametrize("strategy", ["dp", "ddp", "fsdp"])
@pytest.mark.parametrize("precision, dtype", [("bf16-true", torch.bfloat16), ("16-true", torch.float16)])
def test_true_half_under_other_strategies(strategy, precision, dtype):
    module, before, trainer = _fit_half(precision, strategy, max_steps=2)
    assert module.seen == (dtype,) * 3
    weight = module.layer.weight
    assert weight.dtype == dtype and not torch.equal(weight.full_tensor() if strategy == "fsdp" else weight,
                                                     before.to(dtype))
    assert module.optimizer.state[weight]["exp_avg"].dtype == dtype
    if strategy == "fsdp":  # cast before fully_shard: the shards themselves are half
        assert type(weight).__name__ == "DTensor" and weight.to_local().dtype == dtype


def test_16_true_warns_about_adam_eps_that_float16_rounds_away():
    """Adam's default eps=1e-8 is 0 in float16: the first step divides 0 by 0 wherever a gradient's square
    underflows (measured: NaN weights). Lightning says nothing; tasktrain warns once, naming the fix."""
    precision = make_precision("bf16-true")
    p = torch.nn.Parameter(torch.ones(2, dtype=torch.bfloat16))
    p.grad = torch.ones(2, dtype=torch.bfloat16)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        precision.optimizer_step(torch.optim.Adam([p]))  # bfloat16 keeps 1e-8: no warning
    with pytest.warns(UserWarning, match="bf16-true"):
        precision = make_precision("16-true")  # on CPU: slow, says so
    p = torch.nn.Parameter(torch.ones(2, dtype=torch.float16))
    p.grad = torch.ones(2, dtype=torch.float16)
    with pytest.warns(UserWarning, match=r"Adam\(eps=1e-08\) is below torch.float16's smallest normal.*eps=1e-4"):
        precision.optimizer_step(torch.optim.Adam([p]))


def test_deepspeed_refuses_true_half_naming_the_mixed_mode():
    from tasktrain import Accelerator

    for precision, mixed in (("bf16-true", "bf16-mixed"), ("16-true", "16-mixed")):
        with pytest.raises(ValueError, match=f"not available under DeepSpeed.*fp32 master weights.*'{mixed}'"):
            Trainer(strategy="deepspeed", precision=precision, **quiet())
        with pytest.raises(ValueError, match=f"not available under DeepSpeed.*'{mixed}'"):
            Accelerator(strategy="deepspeed_stage_2", mixed_precision=precision)


@pytest.mark.filterwarnings("ignore:precision=.16-true. on CPU")
@pytest.mark.parametrize("mixed_precision, dtype", [("bf16-true", torch.bfloat16), ("16-true", torch.float16)])
def test_the_accelerator_takes_true_half(mixed_precision, dtype):
    from tasktrain import Accelerator

    accelerator = Accelerator(mixed_precision=mixed_precision)
    assert accelerator.mixed_precision == mixed_precision  # Accelerate has no name for it: ours
    model = torch.nn.Linear(4, 1)
    model, optimizer, data = accelerator.prepare(model, torch.optim.Adam(model.parameters(), eps=1e-4), loader())
    x, y = next(iter(data))
    assert x.dtype == dtype and model.weight.dtype == dtype
    out = model(torch.randn(2, 4))  # a tensor of the loop's own is cast too; the output comes back in fp32
    assert out.dtype == torch.float32
    accelerator.backward(torch.nn.functional.mse_loss(model(x), y.float()))
    optimizer.step()
    assert optimizer.optimizer.state[model.weight]["exp_avg"].dtype == dtype


@pytest.mark.filterwarnings("ignore:precision=.16-true. on CPU")
def test_16_true_with_adams_default_eps_warns_then_stops_at_the_nan_naming_bf16_true():
    """What the eps warning is about, end to end: Adam(eps=1e-8) under 16-true turns the weights NaN (a ReLU unit
    that no sample of a batch activates has gradient 0: 0 / (0 + eps rounded to 0)) and the fit stops with the
    non-finite loss error, which names bf16-true (not the mixed mode)."""
    class DefaultEps(HalfProbe):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.layer = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def configure_optimizers(self):
            self.optimizer = torch.optim.Adam(self.parameters(), lr=1e-2)
            return self.optimizer

    with pytest.warns(UserWarning, match=r"eps=1e-08"), \
            pytest.raises(FloatingPointError, match=r"became nan.*use precision='bf16-true' instead of '16-true'"):
        Trainer(max_epochs=1, precision="16-true", **quiet()).fit(DefaultEps(), loader())
