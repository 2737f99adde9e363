import pytest
import torch

from hasten.bench.models import MODEL_NAMES, get_model_spec


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_tiny_model_trains_one_step(name):
    spec = get_model_spec(name, "tiny")
    model = spec.build(seed=0)
    batch = spec.make_batch(torch.Generator().manual_seed(1))
    loss = spec.loss(model, batch)
    assert loss.ndim == 0 and torch.isfinite(loss)
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None for g in grads)
    # The mean of per-sample losses is the scalar loss (equal-length samples); eval mode turns
    # dropout off so both forwards see the same network. fp32 tolerance.
    model.eval()
    with torch.no_grad():
        per_sample = spec.per_sample_loss(model, batch)
        loss = spec.loss(model, batch)
    assert per_sample.shape == (spec.batch_size,)
    torch.testing.assert_close(per_sample.mean(), loss, rtol=1e-5, atol=1e-6)


def test_build_is_seeded_and_leaves_global_rng_alone():
    spec = get_model_spec("mlp", "tiny")
    state = torch.random.get_rng_state()
    a, b, c = spec.build(seed=3), spec.build(seed=3), spec.build(seed=4)
    assert torch.equal(torch.random.get_rng_state(), state)
    pa, pb, pc = (next(m.parameters()) for m in (a, b, c))
    assert torch.equal(pa, pb)
    assert not torch.equal(pa, pc)


@pytest.mark.parametrize(("name", "size"), [("gpt3", "tiny"), ("gpt2", "huge")])
def test_unknown_name_or_size_raises(name, size):
    with pytest.raises(ValueError, match="choose one of"):
        get_model_spec(name, size)
