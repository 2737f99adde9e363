"""The first-call check: a compiled variant that disagrees with eager is caught, retried with safer
settings, run eagerly if none agrees, and reported; the check itself leaves no trace.

The miscompile is planted as a hasten graph pass that detaches an activation: the outputs stay
right, the gradients of every layer before it become zero (what the CNN case looks like).
Tolerances: fp32, relative 1e-2 (``hasten.compiler.check.TOLERANCES``); gradients that must equal
eager's are compared at torch's default fp32 tolerances.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import hasten
from hasten.compiler import check as check_mod
from hasten.compiler.passes import registry
from hasten.compiler.runtime import HastenCompileWarning, HastenMiscompileWarning

pytestmark = pytest.mark.slow  # each test compiles a tiny model with Inductor (seconds)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture
def planted_miscompile(monkeypatch):
    """A pre-grad pass that detaches the input of the graph's last ReLU (grads before it: 0)."""

    def detach_before_relu(gm, example_inputs):
        relus = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is F.relu]
        if relus:
            node = relus[-1]
            with gm.graph.inserting_before(node):
                cut = gm.graph.call_method("detach", (node.args[0],))
            node.replace_input_with(node.args[0], cut)
            gm.recompile()
        return gm

    entry = registry.GraphPass("planted", "pre_grad", detach_before_relu, True, "wrong grads")
    monkeypatch.setitem(registry._REGISTRY, "planted", entry)
    return "planted"


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 3))


def _grads(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    F.cross_entropy(model(x), y).backward()
    return {
        n: torch.zeros_like(p) if p.grad is None else p.grad.clone()
        for n, p in model.named_parameters()
    }


def test_planted_miscompile_is_caught_retried_without_the_passes_and_reported(planted_miscompile):
    x, y = torch.randn(10, 6), torch.randint(0, 3, (10,))
    expected = _grads(_mlp(), x, y)
    model = hasten.compile(_mlp(), regions="whole")
    with pytest.warns(HastenMiscompileWarning) as caught:
        got = _grads(model, x, y)
    text = next(str(w.message) for w in caught if w.category is HastenMiscompileWarning)
    assert "worst 0." in text  # the first Linear's gradient, zeroed by the planted pass
    assert "hasten's graph passes off: matches eager" in text
    assert "It trains with hasten's graph passes off" in text
    for name, g in expected.items():
        torch.testing.assert_close(got[name], g, msg=name)
    # it stays fixed and quiet afterwards, and the report says what happened
    with warnings.catch_warnings():
        warnings.simplefilter("error", HastenMiscompileWarning)
        got = _grads(model, x, y)
    for name, g in expected.items():
        torch.testing.assert_close(got[name], g, msg=name)
    rep = hasten.compiler.compile_report(model)
    assert any("computed wrong results" in c for c in rep.checks)
    assert "first-call check" in str(rep)
    repro = text.split("Standalone reproducer: ")[1].split(".py")[0] + ".py"
    assert os.path.exists(repro)
    source = Path(repro).read_text()
    assert "BACKEND = 'hasten'" in source  # the passes were at fault
    compile(source, repro, "exec")  # a valid script


def test_when_no_setting_agrees_the_variant_runs_eagerly(planted_miscompile, monkeypatch):
    # the only rung offered keeps the planted pass on, so nothing compiled can agree
    monkeypatch.setattr(check_mod, "safer_settings", lambda cfg: [("the same settings", cfg)])
    x, y = torch.randn(10, 6), torch.randint(0, 3, (10,))
    expected = _grads(_mlp(), x, y)
    model = hasten.compile(_mlp(), regions="whole")
    with pytest.warns(HastenMiscompileWarning, match="No setting agreed, so this variant runs eag"):
        got = _grads(model, x, y)
    for _ in range(2):
        for name, g in expected.items():
            torch.testing.assert_close(got[name], g, msg=name)
        got = _grads(model, x, y)


def test_the_check_can_be_switched_off(planted_miscompile):
    x, y = torch.randn(10, 6), torch.randint(0, 3, (10,))
    model = hasten.compile(_mlp(), verify_first_call=False, regions="whole")
    with warnings.catch_warnings():
        warnings.simplefilter("error", HastenMiscompileWarning)
        got = _grads(model, x, y)
    assert float(got["0.weight"].abs().sum()) == 0.0  # the planted bug, unchecked
    assert hasten.compiler.compile_report(model).checks == ()
    with pytest.raises(TypeError, match="verify_first_call must be True or False"):
        hasten.CompileConfig(verify_first_call="yes")


class _BNDrop(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(6, 12)
        self.bn = nn.BatchNorm1d(12)
        self.drop = nn.Dropout(0.3)
        self.head = nn.Linear(12, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.drop(F.relu(self.bn(self.lin(x)))))


def test_a_checked_first_call_leaves_buffers_and_rng_as_one_eager_call_would():
    torch.manual_seed(0)
    eager = _BNDrop()
    compiled = hasten.compile(_BNDrop(), regions="whole")
    compiled.load_state_dict(eager.state_dict())
    x = torch.randn(16, 6)
    torch.manual_seed(123)
    # hasten's compiled dropout draws 31-bit integers (the cheap_dropout_rng pass): eager drawing
    # the same way is the reference the check itself uses
    with check_mod._eager_dropout_like_compiled(True):
        out_e = eager(x)
    after_e = torch.rand(3)  # where the RNG stands after one call
    torch.manual_seed(123)
    with warnings.catch_warnings():
        warnings.simplefilter("error", HastenMiscompileWarning)  # dropout masks matched
        out_c = compiled(x)
    after_c = torch.rand(3)
    torch.testing.assert_close(out_c, out_e)  # same masks: one draw from the same seed
    torch.testing.assert_close(after_c, after_e)
    torch.testing.assert_close(compiled.bn.running_mean, eager.bn.running_mean)
    torch.testing.assert_close(compiled.bn.running_var, eager.bn.running_var)
    assert int(compiled.bn.num_batches_tracked) == 1
    rep = hasten.compiler.compile_report(compiled)
    assert any("matches eager" in c for c in rep.checks), rep.checks


class _Cache:
    def __init__(self) -> None:
        self.items: list[torch.Tensor] = []


class _AppendsToCache(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, cache: _Cache) -> torch.Tensor:
        out = self.lin(x)
        cache.items.append(out.detach())
        return out


def test_a_call_with_a_stateful_object_is_not_run_again():
    model = hasten.compile(_AppendsToCache(), regions="whole")
    cache = _Cache()
    model(torch.randn(2, 4), cache)
    assert len(cache.items) == 1  # the forward ran once for the user, never for the check
    rep = hasten.compiler.compile_report(model)
    assert any("not checked: the call passes a _Cache" in c for c in rep.checks), rep.checks


class _RefusesThree(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.lin(x)
        if x.shape[0] == 3:
            raise ValueError("a batch of 3 is refused")
        return out


def test_a_first_call_that_raises_the_users_error_still_compiles_the_next_call():
    model = hasten.compile(_RefusesThree(), regions="whole")
    with pytest.raises(ValueError, match="batch of 3"):
        model(torch.randn(3, 4))
    with warnings.catch_warnings():
        warnings.simplefilter("error", HastenCompileWarning)  # no "captured no graph"
        for _ in range(2):
            model(torch.randn(5, 4)).sum().backward()
    rep = hasten.compiler.compile_report(model)
    assert rep.graph_count >= 1
    assert not any("runs eagerly instead of recompiling" in f for f in rep.fixes), rep.fixes


def test_checking_an_inference_mode_call_does_not_make_the_users_call_recompile():
    model = hasten.compile(nn.Sequential(nn.Linear(4, 4), nn.ReLU()), regions="whole")
    x = torch.randn(3, 4)  # a normal tensor, passed under inference_mode (as evaluation does)
    with torch.inference_mode():
        model(x)
        model(x)
    rep = hasten.compiler.compile_report(model)
    assert rep.graph_count == 1 and not rep.recompiles, str(rep)


class _Shift(nn.Module):
    """A next-token model's call: an embedding, then a head (``ids[:, :-1]`` in, logits out)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(16, 8)
        self.head = nn.Linear(8, 16)

    def forward(self, ids: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        return self.head(self.emb(ids) * scale)


def test_checking_a_call_on_sliced_or_expanded_inputs_does_not_make_the_users_call_recompile():
    # the check runs the compiled code first, on its copies: a contiguous copy of the slice
    # (strides (7, 1) against the user's (8, 1)) made every such model compile twice
    model = hasten.compile(_Shift(), regions="whole")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        ids = torch.randint(0, 16, (4, 8))
        scale = torch.ones(1, 1, 1).expand(4, 7, 8)  # strides (0, 0, 0): copied contiguous
        F.cross_entropy(
            model(ids[:, :-1], scale).reshape(-1, 16), ids[:, 1:].reshape(-1)
        ).backward()
        opt.step()
        opt.zero_grad()
    rep = hasten.compiler.compile_report(model)
    assert ids[:, :-1].stride() == (8, 1)
    assert rep.graph_count == 1 and not rep.recompiles, str(rep)


def test_the_checks_copies_keep_layout_and_view_ness_without_copying_a_views_whole_base():
    data = torch.arange(1000.0).reshape(100, 10)  # a dataset held in one tensor
    for t in (
        data[20:24],  # a batch sliced from it: a view with an offset
        data[20:24, :-1],  # strided
        torch.ones(1, 8).expand(4, 8),  # zero strides
        torch.randn(4, 8),  # a plain tensor: its copy must not be a view
        torch.randn(8, 4).t(),  # a transposed view
    ):
        c = check_mod._same_strides(t)
        assert (c.shape, c.stride(), c._base is None) == (t.shape, t.stride(), t._base is None)
        torch.testing.assert_close(c, t, rtol=0, atol=0)
        assert c.untyped_storage().data_ptr() != t.untyped_storage().data_ptr()
        assert c.untyped_storage().nbytes() <= 4 * 40 * 10  # the span, not the dataset


class _NumpyMask(nn.Module):
    """Masks features with NumPy's global generator, as Wav2Vec2's SpecAugment does."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import numpy as np

        keep = torch.from_numpy((np.random.random_sample(x.shape) > 0.5).astype("float32"))
        return self.lin(x * keep)


def test_a_model_drawing_from_numpys_generator_is_not_sent_to_eager():
    # TorchDynamo traces np.random as torch's RNG: compiled and eager draw differently by
    # design, so the check says it could not compare and the model stays compiled
    import numpy as np

    np.random.seed(0)
    model = hasten.compile(_NumpyMask(), regions="whole")
    with warnings.catch_warnings():
        warnings.simplefilter("error", HastenMiscompileWarning)
        model(torch.randn(4, 8)).sum().backward()
        model(torch.randn(4, 8)).sum().backward()
    rep = hasten.compiler.compile_report(model)
    assert any("NumPy's or Python's random generator" in c for c in rep.checks), rep.checks
    assert rep.graph_count >= 1 and not model._compiled_call_impl.code._eager_only


def test_the_comparison_matches_float64_norms_and_holds_one_chunk_at_a_time(monkeypatch):
    """``_compare`` reduces each pair chunk by chunk (float64 copies of every gradient at once
    doubled a base-size model's first-step peak); its errors are the float64 reference's."""
    from hasten.compiler import check

    monkeypatch.setattr(check, "_CHUNK", 1000)  # several chunks per tensor here
    g = torch.Generator().manual_seed(0)
    e_big = torch.randn(5003, generator=g)
    c_big = e_big + 1e-3 * torch.randn(5003, generator=g)
    e_small = torch.randn(7, 3, generator=g)
    c_small = e_small * 1.5
    pairs = [
        ("big", c_big, e_big),
        ("small", c_small, e_small),
        ("no compiled grad", None, torch.ones(4)),
        ("no eager grad", torch.full((4,), 1e-9), None),
        ("neither", None, None),
    ]
    worst, passed, note = check._compare(pairs, tol=1e-2)
    ref = {
        "big": float((c_big.double() - e_big.double()).norm() / e_big.double().norm()),
        "small": float((c_small.double() - e_small.double()).norm() / e_small.double().norm()),
        "no compiled grad": 1.0,
    }
    assert worst[0] == "no compiled grad" and worst[1] == pytest.approx(ref["no compiled grad"])
    assert not passed and note == ""
    small, _, _ = check._compare(pairs[1:2], tol=1e-2)
    assert small[1] == pytest.approx(ref["small"], rel=1e-12)
    only_big, ok, _ = check._compare(pairs[:1], tol=1e-2)
    assert only_big[1] == pytest.approx(ref["big"], rel=1e-9) and ok
    # eager overflowed: nothing to compare against
    inf = torch.tensor([1.0, float("inf")])
    assert check._compare([("x", torch.ones(2), inf)], tol=1e-2)[2] == (
        "eager produced inf/NaN on this batch"
    )
    shape = check._compare([("x", torch.ones(2), torch.ones(3))], tol=1e-2)
    assert shape[1] is False and "shape (2,) vs (3,)" in shape[2]
