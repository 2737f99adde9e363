"""hasten.compile(model) makes the model's optimizer step with its fused kernel (optimizer.py).

Nothing here compiles: the models are hasten-compiled but never called, and gradients are set
by hand, so what is tested is the optimizer switch alone.
"""

from __future__ import annotations

import copy
import gc
import io
import logging

import pytest
import torch
import torch.optim.optimizer as torch_optimizer
from torch import nn

import hasten
from hasten.compiler import optimizer as fuse

# fp32: the fused kernel computes the same update in another order
RTOL, ATOL = 1e-5, 1e-7


def _model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 2))


def _grads(model: nn.Module, step: int) -> None:
    g = torch.Generator().manual_seed(100 + step)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=g)


def _train(model: nn.Module, opt: torch.optim.Optimizer, steps: int, start: int = 0) -> None:
    for i in range(start, start + steps):
        _grads(model, i)
        opt.step()


def _assert_same(a: nn.Module, b: nn.Module) -> None:
    for x, y in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(y, x, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize(
    ("cls", "kwargs"),
    [
        (torch.optim.AdamW, {"lr": 1e-2, "weight_decay": 0.1}),
        (torch.optim.Adam, {"lr": 1e-2, "amsgrad": True}),
        (torch.optim.SGD, {"lr": 1e-2, "momentum": 0.9, "nesterov": True}),
        (torch.optim.Adagrad, {"lr": 1e-2}),
    ],
)
def test_the_optimizer_of_a_compiled_model_steps_fused_with_the_same_numbers(cls, kwargs):
    eager, compiled = _model(), _model()
    hasten.compile(compiled)
    ref, opt = cls(eager.parameters(), **kwargs), cls(compiled.parameters(), **kwargs)
    _train(eager, ref, 6)
    _train(compiled, opt, 6)
    assert all(g["fused"] is True for g in opt.param_groups)
    assert all(not g["fused"] for g in ref.param_groups)  # a plain model's optimizer: untouched
    _assert_same(eager, compiled)


def test_fused_optimizer_false_keeps_the_optimizer_as_made():
    model = hasten.compile(_model(), fused_optimizer=False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    _train(model, opt, 1)
    assert opt.param_groups[0]["fused"] is None
    assert hasten.CompileConfig(fused_optimizer=False).fused_optimizer is False
    with pytest.raises(TypeError, match="fused_optimizer must be True or False"):
        hasten.CompileConfig(fused_optimizer="yes")


def test_explicit_user_choices_are_kept_and_defaults_in_other_groups_switch():
    model = hasten.compile(_model())
    first, second = list(model[0].parameters()), list(model[2].parameters())
    for flags in (
        {"foreach": False},
        {"foreach": True},
        {"fused": False},
        {"capturable": True},
        {"differentiable": True},
    ):
        opt = torch.optim.Adam([{"params": first, **flags}, {"params": second}], lr=1e-3)
        fuse._pre_step(opt, (), {})  # what the hook does before the first step (capturable=True
        # cannot step on CPU)
        kept = opt.param_groups[0]
        assert kept["fused"] in (None, False) and all(kept[k] == v for k, v in flags.items())
        assert opt.param_groups[1]["fused"] is True, flags


def test_created_before_compile_and_stepped_state_is_kept():
    eager, model = _model(), _model()
    ref = torch.optim.AdamW(eager.parameters(), lr=1e-2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)  # made and stepped before compiling
    _train(eager, ref, 3)
    _train(model, opt, 3)
    assert opt.param_groups[0]["fused"] is None
    hasten.compile(model)
    _train(eager, ref, 3, start=3)
    _train(model, opt, 3, start=3)
    assert opt.param_groups[0]["fused"] is True
    step = opt.state[next(model.parameters())]["step"]
    assert step.dtype == torch.float32 and float(step) == 6
    _assert_same(eager, model)


def test_checkpoint_loads_and_reads_as_made():
    eager, model = _model(), _model()
    ref = torch.optim.AdamW(eager.parameters(), lr=1e-2)
    _train(eager, ref, 3)
    saved = copy.deepcopy(ref.state_dict())  # an eager run's checkpoint
    model.load_state_dict(eager.state_dict())
    hasten.compile(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    opt.load_state_dict(saved)  # before the first step
    _train(eager, ref, 3, start=3)
    _train(model, opt, 3, start=3)
    assert opt.param_groups[0]["fused"] is True
    _assert_same(eager, model)
    # saved from the fused optimizer, it reads as the user made it and loads in a plain one
    state = opt.state_dict()
    assert state["param_groups"][0]["fused"] is None and opt.param_groups[0]["fused"] is True
    buf = io.BytesIO()
    torch.save(state, buf)
    plain = _model()
    plain.load_state_dict(model.state_dict())
    again = torch.optim.AdamW(plain.parameters(), lr=1e-2)
    again.load_state_dict(torch.load(io.BytesIO(buf.getvalue())))
    _train(plain, again, 2, start=6)
    _train(model, opt, 2, start=6)
    assert again.param_groups[0]["fused"] is None
    _assert_same(plain, model)
    # loaded while training (the groups are replaced by the saved ones): fused again
    opt.load_state_dict(saved)
    assert opt.param_groups[0]["fused"] is None
    _train(model, opt, 1, start=8)
    assert opt.param_groups[0]["fused"] is True


def test_lr_scheduler_changes_the_fused_step():
    eager, model = _model(), _model()
    hasten.compile(model)
    ref = torch.optim.AdamW(eager.parameters(), lr=1e-2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheds = [torch.optim.lr_scheduler.StepLR(o, step_size=1, gamma=0.5) for o in (ref, opt)]
    for i in range(4):
        for m, o, s in ((eager, ref, scheds[0]), (model, opt, scheds[1])):
            _train(m, o, 1, start=i)
            s.step()
    assert opt.param_groups[0]["fused"] is True and opt.param_groups[0]["lr"] == 1e-2 / 16
    _assert_same(eager, model)


def test_groups_added_later_and_parameters_without_a_fused_kernel():
    model = hasten.compile(_model())
    opt = torch.optim.SGD(model[0].parameters(), lr=1e-2)
    _train(model, opt, 1)
    opt.add_param_group({"params": model[2].parameters()})
    _train(model, opt, 1)
    assert [g["fused"] for g in opt.param_groups] == [True, True]
    # a group with a parameter the kernel cannot update (integer) is left alone
    holder = hasten.compile(nn.Module())
    holder.register_parameter("w", nn.Parameter(torch.zeros(3)))
    holder.register_buffer("n", torch.zeros(2, dtype=torch.long))
    wrong = nn.Parameter(torch.zeros(2, dtype=torch.long), requires_grad=False)
    sgd = torch.optim.SGD([{"params": [holder.w]}, {"params": [wrong]}], lr=1e-2)
    holder.w.grad = torch.ones(3)
    sgd.step()
    assert [g["fused"] for g in sgd.param_groups] == [True, None]


def test_other_optimizer_classes_and_compile_step_are_left_alone():
    model = hasten.compile(_model())

    class MyAdam(torch.optim.Adam):
        pass

    for opt in (torch.optim.RMSprop(model.parameters()), MyAdam(model.parameters())):
        _train(model, opt, 1)
        assert not opt.param_groups[0].get("fused")
    opt = torch.optim.Adam(model.parameters())
    hasten.compile_step(lambda: None, optimizers=opt, update="fused")
    _train(model, opt, 1)
    assert opt.param_groups[0]["fused"] is True and opt._hasten_update == "fused"


def test_said_once_in_the_log(caplog):
    model = hasten.compile(_model())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with caplog.at_level(logging.INFO, logger="hasten"):
        _train(model, opt, 3)
        opt.add_param_group({"params": [nn.Parameter(torch.zeros(2))]})
        _train(model, opt, 1, start=3)
    lines = [r.getMessage() for r in caplog.records if "fused kernel" in r.getMessage()]
    assert lines == [
        "hasten: AdamW steps with its fused kernel on cpu (1 of 1 param group): one "
        "multi-tensor update instead of a loop over the parameters; "
        "hasten.compile(model, fused_optimizer=False) keeps the optimizer as made"
    ]


def test_the_hook_goes_with_the_last_compiled_model():
    gc.collect()
    models = [hasten.compile(_model()) for _ in range(2)]
    assert fuse.hook_registered()
    opt = torch.optim.AdamW(models[0].parameters(), lr=1e-3)
    _train(models[0], opt, 1)
    ref = [weakref_to(m) for m in models]
    del models, opt
    gc.collect()
    assert all(r() is None for r in ref)  # the hook kept no model alive
    assert not fuse.hook_registered()
    assert not any(
        h is fuse._pre_step for h in torch_optimizer._global_optimizer_pre_hooks.values()
    )


def test_a_model_collected_during_an_optimizer_step_does_not_break_the_step():
    gc.collect()
    model = hasten.compile(_model())
    plain = _model(1)
    opt = torch.optim.AdamW(plain.parameters(), lr=1e-3)
    ref = weakref_to(model)

    def collect_in_step(optimizer, args, kwargs):
        gc.collect()  # a garbage collection while Optimizer.step iterates the global hooks

    # hasten's hook, then these two: removing hasten's while the second runs would change the
    # hooks' OrderedDict under the iteration that goes on to the third
    extra = [
        torch_optimizer.register_optimizer_step_pre_hook(collect_in_step),
        torch_optimizer.register_optimizer_step_pre_hook(lambda optimizer, args, kwargs: None),
    ]
    try:
        del model
        _train(plain, opt, 1)  # must not raise "OrderedDict changed size during iteration"
    finally:
        for handle in extra:
            handle.remove()
    assert ref() is None
    hasten.compile(_model())  # the next compile finds the inert hook and keeps using it
    assert (
        sum(h is fuse._pre_step for h in torch_optimizer._global_optimizer_pre_hooks.values()) == 1
    )


def weakref_to(obj):
    import weakref

    return weakref.ref(obj)


def test_a_group_split_across_devices_is_fused_only_where_every_device_has_the_kernel():
    model = hasten.compile(_model())
    elsewhere = nn.Parameter(torch.zeros(3, device="meta"))  # a device without a fused kernel
    first, second = list(model[0].parameters()), list(model[2].parameters())
    opt = torch.optim.AdamW([{"params": first}, {"params": [*second, elsewhere]}], lr=1e-3)
    fuse._pre_step(opt, (), {})  # what the hook does before the first step
    assert [g["fused"] for g in opt.param_groups] == [True, None]
