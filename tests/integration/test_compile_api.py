"""hasten.compile end to end (Inductor included, so slow): in place, same state_dict, picklable,
the backend by name, explain() on a planted graph break, the recompile guard."""

from __future__ import annotations

import copy
import io
import pickle
import warnings

import pytest
import torch
from torch import nn

import hasten
from hasten.compiler.hooks.dynamo import recompile_limit_patch
from hasten.compiler.runtime import RecompileWarning

pytestmark = pytest.mark.slow

# fp32, Inductor vs eager on tiny fp32 models: reordered reductions only
RTOL, ATOL = 1e-5, 1e-6


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))


@pytest.fixture(scope="module")
def compiled_mlp():
    torch._dynamo.reset()
    model = _mlp()
    keys = list(model.state_dict())
    returned = hasten.compile(model, regions="whole")
    x = torch.randn(5, 8)
    out = model(x)
    out.sum().backward()
    return model, returned, keys, x


def test_compile_returns_the_same_object_with_the_same_state_dict_keys(compiled_mlp):
    model, returned, keys, _ = compiled_mlp
    assert returned is model
    assert type(model) is nn.Sequential
    assert list(model.state_dict()) == keys
    assert not any(k.startswith("_orig_mod") for k in model.state_dict())


def test_compiled_matches_eager_and_actually_compiled(compiled_mlp):
    model, _, _, x = compiled_mlp
    eager = _mlp()
    eager.load_state_dict(model.state_dict())
    torch.testing.assert_close(model(x), eager(x), rtol=RTOL, atol=ATOL)
    rep = hasten.compiler.compile_report(model)
    assert rep.graph_count == 1  # nn.Sequential really is compiled (Module.compile() would not)
    assert rep.fallback is None


def test_compiled_model_pickles_saves_and_loads_as_a_plain_model(compiled_mlp):
    model, _, _, x = compiled_mlp
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    restored = pickle.loads(pickle.dumps(model))
    for copy_ in (loaded, restored):
        assert copy_._compiled_call_impl is None  # an ordinary eager module
        torch.testing.assert_close(copy_(x), model(x), rtol=RTOL, atol=ATOL)
    fresh = _mlp()
    fresh.load_state_dict(torch.load(io.BytesIO(_state_bytes(model))))
    torch.testing.assert_close(fresh(x), model(x), rtol=RTOL, atol=ATOL)


def _state_bytes(model: nn.Module) -> bytes:
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    return buf.getvalue()


def test_backend_is_registered_by_name():
    assert "hasten" in torch._dynamo.list_backends()
    model = _mlp()
    x = torch.randn(3, 8)
    compiled = torch.compile(model, backend="hasten")
    torch.testing.assert_close(compiled(x), model(x), rtol=RTOL, atol=ATOL)
    compiled_opts = torch.compile(
        _mlp(), backend="hasten", options={"passes": {"attention_to_sdpa": False}}
    )
    torch.testing.assert_close(compiled_opts(x), model(x), rtol=RTOL, atol=ATOL)


class PlantedBreak(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        print("planted graph break")  # the line explain() must point at
        return self.b(h).relu()


def test_explain_reports_a_planted_graph_break_with_its_source_line(capsys):
    model = PlantedBreak()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rep = hasten.explain(model, torch.randn(2, 4))
    assert rep.graph_count == 2
    # TorchDynamo counts this break once in hasten's frame, where it inlines forward, and once in
    # forward's own frame; the report lists breaks as Dynamo counts them (compiler/breaks.py)
    assert rep.graph_breaks and all("print" in b.reason for b in rep.graph_breaks)
    gb = rep.graph_breaks[-1]
    assert "print" in gb.reason
    assert gb.location.startswith(__file__)
    assert gb.source == 'print("planted graph break")  # the line explain() must point at'
    assert "print" in gb.suggestion
    assert rep.compile_seconds > 0
    text = str(rep)
    assert "graph break 1" in text and "planted graph break" in text
    assert all(p.grad is None for p in model.parameters())  # the model itself is untouched
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k])


class PythonCounter(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, scale: float) -> torch.Tensor:
        return self.lin(x) * scale


def test_recompile_guard_warns_with_the_failing_guard():
    torch._dynamo.reset()
    model = hasten.compile(PythonCounter(), dynamic=False, warn_recompiles=2, regions="whole")
    x = torch.randn(2, 4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for scale in (1.0, 2.0, 3.0):  # a changing Python float is guarded on: recompiles
            model(x, scale)
    msgs = [str(w.message) for w in caught if issubclass(w.category, RecompileWarning)]
    assert len(msgs) == 1, msgs
    assert "recompiled 2 times" in msgs[0] and "args[1] == " in msgs[0]
    assert "hasten_forward_PythonCounter" in msgs[0]
    rep = hasten.compiler.compile_report(model)
    assert len(rep.recompiles) == 2
    assert all("args[1]" in r.guard for r in rep.recompiles)


def test_recompile_limit_warns_that_torch_falls_back_to_eager():
    torch._dynamo.reset()
    model = hasten.compile(PythonCounter(), dynamic=False, warn_recompiles=0, regions="whole")
    x = torch.randn(2, 4)
    with (
        recompile_limit_patch(2),
        warnings.catch_warnings(record=True) as caught,
    ):
        warnings.simplefilter("always")
        for scale in (1.0, 2.0, 3.0, 4.0):
            out = model(x, scale)
    torch.testing.assert_close(out, model.lin(x) * 4.0, rtol=RTOL, atol=ATOL)  # still right
    msgs = [str(w.message) for w in caught if issubclass(w.category, RecompileWarning)]
    assert any("recompile limit (2)" in m and "runs it eagerly" in m for m in msgs), msgs


def test_post_grad_passes_run_through_inductors_hook_and_keep_the_cache_warm(monkeypatch, tmp_path):
    from torch._dynamo.utils import counters

    from hasten.compiler.passes import registry

    seen: list[int] = []

    def count_nodes(gm, example_inputs):
        seen.append(len(gm.graph.nodes))
        registry.record("graphs_seen")
        return gm

    entry = registry.GraphPass("count_nodes", "post_grad", count_nodes, True, "test only")
    monkeypatch.setitem(registry._REGISTRY, "count_nodes", entry)

    def run() -> hasten.compiler.report.CompileReport:
        torch._dynamo.reset()
        # A cache of its own: a cache warmed by an earlier run would skip the pass the first time.
        model = hasten.compile(
            nn.Sequential(nn.Linear(3, 5), nn.Tanh()), cache_dir=tmp_path, regions="whole"
        )
        model(torch.randn(4, 3)).sum().backward()
        return hasten.compiler.compile_report(model)

    first = run()
    assert len(seen) == 2  # forward and backward graph, through post_grad_custom_pre_pass
    stats = [s for s in first.pass_stats if s.name == "count_nodes"]
    assert [s.changes["graphs_seen"] for s in stats] == [1, 1]
    counters.clear()
    run()  # same graphs, same pass sources: Inductor's caches must hit, so the pass is not rerun
    hits = (
        counters["inductor"]["fxgraph_cache_hit"] + counters["aot_autograd"]["autograd_cache_hit"]
    )
    assert hits >= 1, dict(counters["inductor"])
    assert len(seen) == 2


def test_ddp_of_sequential_really_compiles(tmp_path):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch._dynamo.reset()
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        inner = _mlp()
        ddp = DDP(inner)
        assert hasten.compile(ddp, regions="whole") is ddp
        x = torch.randn(5, 8)
        out = ddp(x)
        out.sum().backward()
        rep = hasten.compiler.compile_report(ddp)
        assert rep.graph_count == 1  # torch.compile(DDP(nn.Sequential)) would capture none
        assert any("DistributedDataParallel(Sequential)" in f for f in rep.fixes)
        assert inner[0].weight.grad is not None
        torch.testing.assert_close(out, _mlp()(x), rtol=RTOL, atol=ATOL)
    finally:
        dist.destroy_process_group()


def test_many_compiled_models_in_one_process_do_not_share_a_recompile_budget():
    torch._dynamo.reset()
    x = torch.randn(3, 8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        models = [
            hasten.compile(_mlp(), regions="whole") for _ in range(10)
        ]  # more than the limit of 8
        for m in models:
            m(x)
    assert not [w for w in caught if issubclass(w.category, RecompileWarning)]
    for m in models:
        rep = hasten.compiler.compile_report(m)
        assert rep.graph_count == 1 and not rep.recompiles


def test_eval_under_no_grad_and_inference_mode_scoring_compile_their_own_graphs_quietly():
    # The loop every user writes: train, evaluate under no_grad, score under inference_mode
    # (what SiftingDataloader does), train again. Each call kind is a variant with its own
    # graph: no recompile of the training graph, no warning, no fallback.
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Dropout(0.0), nn.Linear(16, 4))
    eager = copy.deepcopy(model)
    hasten.compile(model, warn_recompiles=1, regions="whole")  # the most sensitive setting
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, eager)]
    x, y = torch.randn(6, 8), torch.randint(0, 4, (6,))

    def train_step() -> None:
        for m, opt in zip((model, eager), opts):
            m.train()
            opt.zero_grad()
            nn.functional.cross_entropy(m(x), y).backward()
            opt.step()

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            train_step()
            for m in (model, eager):
                m.eval()
            with torch.no_grad():
                torch.testing.assert_close(model(x), eager(x), rtol=RTOL, atol=ATOL)
            with torch.inference_mode():
                xi = torch.randn(6, 8)  # an inference tensor: another dispatch key set
                out = model(xi)
                torch.testing.assert_close(out, eager(xi), rtol=RTOL, atol=ATOL)
            torch.testing.assert_close(model(x), eager(x), rtol=RTOL, atol=ATOL)  # eval + grad
        train_step()
    assert not [w for w in caught if "hasten" in str(w.message)], [str(w.message) for w in caught]
    rep = hasten.compiler.compile_report(model)
    assert rep.fallback is None and not rep.recompiles, str(rep)
    assert sorted(g.variant for g in rep.graphs) == [
        "eval_grad",
        "eval_inference",
        "eval_no_grad",
        "train_grad",
    ]
    for a, b in zip(model.parameters(), eager.parameters()):
        torch.testing.assert_close(a, b, rtol=RTOL, atol=ATOL)


def _logits_zero_fills(model: nn.Module, x: torch.Tensor, labels: torch.Tensor) -> int:
    """How many logits-sized tensors the backward fills (the zero gradient of unused logits)."""
    loss, logits = model(x, labels)
    with torch.profiler.profile(record_shapes=True) as prof:
        loss.backward()
    shape = list(logits.shape)
    return sum(
        1
        for e in prof.events()
        if e.name in ("aten::fill_", "aten::zero_", "aten::zeros")
        and e.input_shapes
        and e.input_shapes[0] == shape
    )


def test_loss_computed_from_returned_logits_gets_no_zero_gradient_for_them():
    from tests._models import TinyLM

    torch._dynamo.reset()
    g = torch.Generator().manual_seed(0)
    x, labels = torch.randn(256, 8, generator=g), torch.randint(0, 4096, (256,), generator=g)
    eager = TinyLM()
    split, whole = copy.deepcopy(eager), copy.deepcopy(eager)
    hasten.compile(split, regions="whole")
    hasten.compile(whole, passes={"split_at_returned_logits": False}, regions="whole")
    assert _logits_zero_fills(whole, x, labels) >= 1  # the cost the split removes
    assert _logits_zero_fills(split, x, labels) == 0
    rep = hasten.compiler.compile_report(split)
    assert rep.graph_count == 1 and rep.fallback is None
    assert any(s.changes.get("graphs_split") for s in rep.pass_stats)
    # the same values and gradients as eager, also when the logits are backpropagated too
    for m in (eager, split):
        m.zero_grad()
        loss, logits = m(x, labels)
        (loss + logits.square().mean()).backward()
    torch.testing.assert_close(split(x, labels), eager(x, labels), rtol=RTOL, atol=ATOL)
    for a, b in zip(split.parameters(), eager.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=RTOL, atol=ATOL)


class _DropoutLM(nn.Module):
    """TinyLM with a training dropout: both the split pass and the cheap-dropout pass apply."""

    def __init__(self, vocab: int = 4096) -> None:
        super().__init__()
        self.body = nn.Linear(8, 16)
        self.drop = nn.Dropout(0.1)
        self.head = nn.Linear(16, vocab)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.head(self.drop(torch.tanh(self.body(x))))
        return nn.functional.cross_entropy(logits, labels), logits


def test_a_warm_start_of_a_split_graph_with_cheap_dropout_reuses_aotautograd_artifacts(tmp_path):
    # A split graph used to be compiled through DDPOptimizer's fakify_first_call, and the cheap
    # dropout pass put a Python function in the graph: AOTAutograd's cache refused both, so
    # every warm start re-traced and re-partitioned the joint graph (GPT-2 124M: ~9 s).
    from torch._dynamo.utils import counters

    g = torch.Generator().manual_seed(0)
    x, labels = torch.randn(256, 8, generator=g), torch.randint(0, 4096, (256,), generator=g)
    results = []
    for _ in range(2):  # cold, then warm: a fresh Dynamo state, the same on-disk cache
        torch._dynamo.reset()
        counters.clear()
        torch.manual_seed(0)
        model = hasten.compile(_DropoutLM(), cache_dir=tmp_path, regions="whole")
        torch.manual_seed(1)
        loss, _ = model(x, labels)
        loss.backward()
        rep = hasten.compiler.compile_report(model)
        assert rep.fallback is None
        assert any(s.changes.get("graphs_split") for s in rep.pass_stats)
        results.append((loss.detach(), dict(counters["aot_autograd"])))
    cold, warm = results[0][1], results[1][1]
    assert cold.get("autograd_cache_bypass", 0) == 0, cold
    assert cold.get("autograd_cache_miss", 0) == 2, cold  # two parts, both stored
    assert warm.get("autograd_cache_hit", 0) == 2, warm
    torch.testing.assert_close(results[1][0], results[0][0], rtol=RTOL, atol=ATOL)  # same seed
