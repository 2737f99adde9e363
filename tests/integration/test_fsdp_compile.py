"""``hasten.compile`` on FSDP2 (``fully_shard``) models under ``torchrun --nproc_per_node=2``
(gloo, CPU): compiled by region, matching eager FSDP."""

from __future__ import annotations

import pytest

pytest.importorskip("hasten.compiler")

from tests._helpers import torchrun

# fp32, Inductor vs eager: reordered reductions only, over 4 AdamW steps
LOSS_RTOL, PARAM_ATOL = 1e-4, 1e-5


@pytest.mark.slow
def test_compiled_fsdp2_compiles_real_graphs_and_matches_eager_fsdp2(tmp_path):
    ranks = torchrun("fsdp_compile.py", tmp_path, timeout=500)
    # blocks: 3 identical blocks traced once (train + eval), plus input and output layers;
    # sequential: each sharded Linear's forward (compiled before fully_shard); root_only: the
    # whole model is one unit
    expected_graphs = {"blocks": 6, "sequential": 4, "root_only": 2}
    for r in ranks:
        for name, c in r.items():
            assert c["graphs"] == expected_graphs[name], (name, c)
            assert c["variants"] == ["eval_no_grad", "train_grad"], (name, c)
            assert c["recompiles"] == 0 and c["breaks"] == 0 and c["fallback"] is None, (name, c)
            assert c["warnings"] == [], (name, c)  # no recompile warning, no "nothing compiled"
            assert any("FSDP2" in f for f in c["fixes"]), (name, c)
            assert c["keys_equal"], name
            for a, b in zip(c["eager"], c["compiled"]):
                assert a == pytest.approx(b, rel=LOSS_RTOL), (name, c)
            assert c["max_param_diff"] < PARAM_ATOL, (name, c)
    assert ranks[0]["blocks"]["eager"] != ranks[1]["blocks"]["eager"]  # different data per rank
