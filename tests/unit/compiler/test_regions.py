"""Which parts of a model hasten compiles (regions) and which variant a call belongs to."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

from hasten.compiler.regions import plan_regions
from hasten.compiler.runtime import grad_variant


def test_grad_variant_names_train_eval_and_the_autograd_mode():
    assert grad_variant(True) == "train_grad"
    assert grad_variant(False) == "eval_grad"
    with torch.no_grad():
        assert grad_variant(True) == "train_no_grad"
    with torch.inference_mode():
        assert grad_variant(False) == "eval_inference"


def test_a_plain_model_is_one_region():
    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    assert plan_regions(model) == [(model, "call")]


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.drop = nn.Dropout(0.1)  # no parameters: not worth a region of its own
        self.blocks = nn.ModuleList(Block() for _ in range(2))
        self.head = nn.Sequential(nn.LayerNorm(4), nn.Linear(4, 3))


@pytest.fixture
def one_rank(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_fsdp2_units_are_compiled_by_region(one_rank):
    from torch.distributed.fsdp import fully_shard

    net = Net()
    for block in net.blocks:
        fully_shard(block)
    fully_shard(net)
    regions = plan_regions(net)
    assert regions == [
        (net.emb, "call"),  # parameters outside every leaf unit: whole call
        (net.blocks[0], "forward"),  # leaf units: forward only, FSDP's hooks stay eager
        (net.blocks[1], "forward"),
        (net.head, "call"),
    ]

    root_only = Net()
    fully_shard(root_only)
    assert plan_regions(root_only) == [(root_only, "forward")]


class Layer(nn.Module):
    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.fc(self.norm(x)))


class Stack(nn.Module):
    """Embedding, 4 identical layers and one odd one, a head: the shape of a small transformer."""

    def __init__(self, layers: int = 4) -> None:
        super().__init__()
        self.emb = nn.Embedding(16, 8)
        self.layers = nn.ModuleList([Layer() for _ in range(layers)] + [Layer(8)])
        self.layers.append(nn.Sequential(nn.Linear(8, 8)))  # another class: not a block
        self.head = nn.Linear(8, 3)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.emb(ids)
        for layer in self.layers:
            x = layer(x)
        return self.head(x).mean(dim=1)


def test_repeated_blocks_are_same_class_same_shapes_children_of_a_list():
    from hasten.compiler.regions import repeated_blocks

    net = Stack()
    assert repeated_blocks(net) == list(net.layers[:5])
    assert repeated_blocks(net, min_count=6) == []
    other = Net()
    assert repeated_blocks(other) == list(other.blocks)


def test_regions_modes_plan_whole_blocks_or_by_the_auto_rule():
    net = Stack()
    assert plan_regions(net, "whole") == [(net, "call")]
    assert plan_regions(net, "blocks") == [(b, "call") for b in net.layers[:5]]
    # "auto" starts as "whole"; its compile plan may install the blocks later (test_plan.py)
    assert plan_regions(net, "auto") == [(net, "call")]
    few = Stack(layers=1)  # 2 repeats are enough for "blocks"
    assert len(plan_regions(few, "blocks")) == 2
    plain = nn.Sequential(nn.Linear(2, 2), nn.ReLU())  # nothing repeats
    assert plan_regions(plain, "blocks") == [(plain, "call")]


def test_glue_modules_are_the_outermost_parameter_holders_outside_the_blocks():
    from hasten.compiler.regions import _glue_modules, repeated_blocks

    net = Stack()
    assert _glue_modules(net, repeated_blocks(net)) == [net.emb, net.layers[5], net.head]


def test_regions_is_validated():
    from hasten import CompileConfig

    assert CompileConfig().regions == "auto"
    with pytest.raises(ValueError, match="regions"):
        CompileConfig(regions="layers")


def test_glue_is_a_per_compile_setting_of_block_mode_validated():
    import hasten
    from hasten import CompileConfig

    assert CompileConfig().glue == "eager"
    with pytest.raises(ValueError, match="choose one of 'eager', 'modules', 'loss'"):
        CompileConfig(regions="blocks", glue="compiled")
    for regions in ("auto", "whole"):  # nothing around blocks to compile: named, with the fix
        with pytest.raises(ValueError, match="set regions='blocks' too"):
            CompileConfig(regions=regions, glue="modules")
    net = Stack()
    with_modules = plan_regions(net, "blocks", "modules")
    assert with_modules == [(b, "call") for b in net.layers[:5]] + [
        (m, "call") for m in (net.emb, net.layers[5], net.head)
    ]
    assert plan_regions(net, "blocks", "loss") == plan_regions(net, "blocks")  # not a module
    assert plan_regions(net, "whole", "modules") == [(net, "call")]
    cfg = CompileConfig(regions="blocks", glue="loss")
    assert cfg.replace(glue="eager").regions == "blocks"
    with pytest.raises(ValueError, match="glue='loss'"):
        cfg.replace(regions="whole")
    with pytest.raises(ValueError, match="set regions='blocks' too"):
        hasten.compile(Stack(), glue="modules")  # the keyword is validated as the field


def _train(model: nn.Module, steps: int = 4) -> list[float]:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    return train_steps(model, opt, torch.Generator().manual_seed(1), steps)


def train_steps(model: nn.Module, opt: torch.optim.Optimizer, g: torch.Generator, n: int):
    """``n`` steps of ``opt`` on random (4, 6) token batches drawn from ``g``; the losses."""

    def loss_of(model: nn.Module) -> torch.Tensor:
        ids, y = torch.randint(0, 16, (4, 6), generator=g), torch.randint(0, 3, (4,), generator=g)
        return nn.functional.cross_entropy(model(ids), y)

    return _loop(model, opt, n, loss_of)


def _loop(model: nn.Module, opt: torch.optim.Optimizer, n: int, loss_of) -> list[float]:
    losses = []
    for _ in range(n):
        loss = loss_of(model)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


@pytest.mark.slow
@pytest.mark.parametrize("glue", ["eager", "modules"])
def test_blocks_whole_and_eager_train_alike_fp32(glue, caplog):
    import copy
    import logging

    import hasten
    from hasten.compiler.api import compile_report

    torch.manual_seed(0)
    eager = Stack()
    whole, blocks = copy.deepcopy(eager), copy.deepcopy(eager)
    hasten.compile(whole, regions="whole")
    hasten.compile(blocks, regions="blocks", glue=glue)
    with caplog.at_level(logging.INFO, logger="hasten"):
        runs = {n: _train(m) for n, m in [("eager", eager), ("whole", whole), ("b", blocks)]}
    # fp32: equal up to kernel rounding (fused reductions reorder sums), after 4 AdamW steps
    for name in ("whole", "b"):
        assert runs[name] == pytest.approx(runs["eager"], rel=1e-5, abs=1e-6)
    for (n, p), (_, q), (_, w) in zip(
        eager.named_parameters(), blocks.named_parameters(), whole.named_parameters()
    ):
        torch.testing.assert_close(q, p, rtol=1e-5, atol=1e-6, msg=n)
        torch.testing.assert_close(w, p, rtol=1e-5, atol=1e-6, msg=n)
    report = compile_report(blocks)
    # one graph for the five blocks (shared code, no recompile), plus the glue's when compiled
    assert len(report.recompiles) == 0
    assert len(report.graphs) == (1 if glue == "eager" else 4)
    assert any("1 Layer shared by 5" in f for f in report.fixes)
    # the shared block's compile says so in its one log line
    assert any(
        "compiled Layer: 1 graph, 1 block shared by 5, " in r.getMessage() for r in caplog.records
    )
    assert blocks.state_dict().keys() == eager.state_dict().keys()


def test_a_training_kv_cache_gives_each_block_code_of_its_own():
    from types import SimpleNamespace

    from hasten.compiler.regions import builds_kv_cache

    net = Stack()
    assert not builds_kv_cache(net)  # no Transformers config
    net.config = SimpleNamespace(use_cache=True, to_dict=dict)
    assert builds_kv_cache(net)
    net.eval()
    assert not builds_kv_cache(net)  # evaluation: the cache is what generation wants
    net.train()
    net.config.use_cache = False
    assert not builds_kv_cache(net)


def _tiny_gpt2() -> nn.Module:
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(
        n_layer=2,
        n_embd=16,
        n_head=2,
        vocab_size=40,
        n_positions=16,
        use_cache=False,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,  # no RNG: eager and compiled alike
    )
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(cfg)


def _lm_steps(model: nn.Module, n: int = 4) -> list[float]:
    # SGD, not AdamW: the attention keys' bias has a zero gradient in exact arithmetic, so its
    # gradient is rounding noise, which Adam's normalisation would blow up to a full lr step
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    g = torch.Generator().manual_seed(2)

    def loss_of(model: nn.Module) -> torch.Tensor:
        ids = torch.randint(0, 40, (3, 12), generator=g)
        return model(input_ids=ids, labels=ids).loss

    return _loop(model, opt, n, loss_of)


@pytest.mark.slow
@pytest.mark.parametrize("loss", ["compiled", "eager"])
def test_a_transformers_loss_is_its_own_region_in_block_mode_fp32(loss):
    import copy
    import pickle

    import hasten
    from hasten.compiler.api import compile_report

    eager = _tiny_gpt2()
    eager.config.problem_type = None
    glue = "loss" if loss == "compiled" else "eager"
    blocks = hasten.compile(copy.deepcopy(eager), regions="blocks", glue=glue)
    want, got = _lm_steps(eager), _lm_steps(blocks)
    # fp32: equal up to kernel rounding (fused log-softmax/NLL reorders sums), after 4 AdamW steps
    assert got == pytest.approx(want, rel=1e-5, abs=1e-6)
    for (n, p), (_, q) in zip(eager.named_parameters(), blocks.named_parameters()):
        torch.testing.assert_close(q, p, rtol=1e-5, atol=1e-6, msg=n)
    report = compile_report(blocks)
    assert len(report.graphs) == (2 if loss == "compiled" else 1)  # the block (+ the loss)
    assert len(report.recompiles) == 0
    said = " ".join(report.fixes)
    assert ("loss function is compiled on its own" in said) == (loss == "compiled")
    # the compiled loss stood in during calls only: the model's own attributes are untouched
    assert "_loss_function" not in blocks.__dict__
    assert blocks.state_dict().keys() == eager.state_dict().keys()
    assert pickle.loads(pickle.dumps(blocks)).loss_function is eager.loss_function


@pytest.mark.slow
def test_a_loss_function_the_user_set_is_compiled_and_put_back():
    import hasten

    model = _tiny_gpt2()
    calls = []

    def mine(logits, labels, vocab_size, **kwargs):
        calls.append(1)  # runs while TorchDynamo traces it, and on eager fallbacks
        return nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, vocab_size), labels[:, 1:].reshape(-1)
        )

    model.loss_function = mine
    hasten.compile(model, regions="blocks", glue="loss")
    ids = torch.randint(0, 40, (3, 12), generator=torch.Generator().manual_seed(0))
    want = mine(model(input_ids=ids).logits, ids, 40)
    got = model(input_ids=ids, labels=ids).loss
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)  # fp32
    assert model.loss_function is mine
