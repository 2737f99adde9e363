"""The hashed dropout noise of the ``cheap_dropout_rng`` pass (``passes/dropout.py``).

What the first-call check and users rely on: compiled and eager noise agree bit for bit (the
check draws eager dropout the same way and compares), the noise is uniform and unrelated from one
key to the next, one key is one draw of the default generator (``torch.manual_seed`` repeats a
run), and the hash is lowered as one expression (composed of aten ops it took minutes to compile).
The mask law itself (drop rate, scale, the backward's mask) is pinned in ``_pass_cases.py``.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch
import torch.nn.functional as F

import hasten
from hasten.compiler.hooks import usable
from hasten.compiler.passes import dropout as drop
from hasten.compiler.runtime import HastenMiscompileWarning

pytestmark = pytest.mark.skipif(
    not usable("inductor.lower_pointwise_op"), reason="this torch cannot lower the hash"
)

NOISE = torch.ops.hasten.dropout_noise.default


def _compiled_noise(key: torch.Tensor, numel: int) -> torch.Tensor:
    drop.hooks_inductor.lower_pointwise_op(NOISE, torch.int64, drop._lowered_hash)
    return torch.compile(lambda k: NOISE(k, numel), backend="inductor", fullgraph=True)(key)


@pytest.mark.parametrize("numel", [1, 17, 100_003])
def test_compiled_noise_is_eager_noise_bit_for_bit(numel):
    key = torch.tensor(0x2BADC0FFEE123456, dtype=torch.int64)
    eager = NOISE(key, numel)
    compiled = _compiled_noise(key, numel)
    assert eager.dtype == compiled.dtype == torch.int64
    assert torch.equal(compiled, eager)  # the vectorized loop and its scalar tail alike
    assert int(eager.min()) >= 0 and int(eager.max()) < 2**32


def test_noise_is_uniform_and_unrelated_between_neighbouring_keys():
    n = 1 << 20
    # keys one bit apart: were a key XORed into the raw index, one mask would be the other's
    # elements reordered; here each pair agrees where it drops only as often as chance does
    keys = [torch.tensor(k, dtype=torch.int64) for k in (4, 5, 4 + 2**32, 2**61 + 4)]
    us = [NOISE(k, n).double() / 2**32 for k in keys]
    sd_mean = math.sqrt(1 / 12 / n)
    for u in us:
        assert abs(u.mean().item() - 0.5) < 5 * sd_mean
        counts = torch.histc(u, 64, 0, 1)
        chi2 = ((counts - n / 64) ** 2 / (n / 64)).sum().item()
        assert chi2 < 63 + 5 * math.sqrt(2 * 63), chi2  # 63 degrees of freedom, 5 sigma
        lag1 = torch.corrcoef(torch.stack([u[:-1], u[1:]]))[0, 1].item()
        assert abs(lag1) < 5 / math.sqrt(n), lag1
    p, sd_both = 0.1, math.sqrt(0.01 * 0.99 / n)
    for i in range(len(us)):
        for j in range(i + 1, len(us)):
            both = ((us[i] < p) & (us[j] < p)).double().mean().item()
            assert abs(both - p * p) < 5 * sd_both, (i, j, both)
            assert not torch.equal(us[i].sort().values, us[j].sort().values)


def test_one_draw_per_call_repeats_under_manual_seed():
    x = torch.ones(3, 1000)
    torch.manual_seed(7)
    a = drop.cheap_dropout(x, 0.3)
    after_a = torch.rand(2)
    torch.manual_seed(7)
    b = drop.cheap_dropout(x, 0.3)
    torch.manual_seed(7)
    torch.randint(0, 2**62, (), dtype=torch.int64)  # the key: the only draw
    after_key = torch.rand(2)
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    torch.testing.assert_close(after_a, after_key, rtol=0, atol=0)
    c = drop.cheap_dropout(x, 0.3)  # the next call: another key, another mask
    assert not torch.equal(a != 0, c != 0)


class _Drops(torch.nn.Module):
    """Six dropouts in a row (GPT-2 has 37 in a step)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(6):
            x = F.dropout(self.lin(x), 0.1, training=self.training)
        return x


def test_compiled_dropout_lowers_the_hash_as_one_expression_and_matches_eager_masks(
    monkeypatch, tmp_path
):
    # Composed of aten ops, each round's x ^ (x >> k) is expanded again by every use when
    # Inductor inlines it (2**15 leaves a mask): GPT-2 124M's cold compile took 133 s, not 30 s.
    # Lowered, Inductor evaluates the hash body itself, with its own op handler.
    lowered = []
    real = drop._hash

    def counting(o, index, key):
        if o is not drop._TensorOps:
            lowered.append(o)
        return real(o, index, key)

    monkeypatch.setattr(drop, "_hash", counting)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))  # compiled here, not cached
    torch.manual_seed(0)
    model = _Drops().train()
    hasten.compile(model, regions="whole")  # the first call is checked against eager, masks too
    with warnings.catch_warnings():
        warnings.simplefilter("error", HastenMiscompileWarning)  # the masks matched
        model(torch.randn(8, 16)).sum().backward()
    rep = hasten.compiler.compile_report(model)
    assert any("matches eager" in c for c in rep.checks), rep.checks
    assert lowered, "the noise reached Inductor decomposed, not as hasten::dropout_noise"
