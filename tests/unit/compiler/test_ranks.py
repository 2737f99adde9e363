"""The torchrun rank gate: who compiles first, and how long the others wait (no torchrun here)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from hasten.compiler.ranks import RankGate, rank_gate


def test_no_gate_outside_torchrun_or_alone_on_the_node(monkeypatch, tmp_path):
    for var in ("TORCHELASTIC_RUN_ID", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    assert rank_gate(600, str(tmp_path)) is None
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    assert rank_gate(600, str(tmp_path)) is None  # one rank on this node: nothing to share
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert rank_gate(0, str(tmp_path)) is None  # rank_wait_s=0 turns it off
    gate = rank_gate(600, str(tmp_path))
    assert gate is not None and gate.leader
    monkeypatch.setenv("LOCAL_RANK", "1")
    follower = rank_gate(600, str(tmp_path))
    assert follower is not None and not follower.leader
    assert follower.directory == gate.directory  # the same job shares one marker directory


def test_a_follower_waits_for_the_leaders_compile(tmp_path):
    leader, follower = RankGate(tmp_path, True, 60), RankGate(tmp_path, False, 60)
    order: list[str] = []

    def lead() -> None:
        with leader.turn("Block.1.train_grad"):
            time.sleep(0.5)
            order.append("leader compiled")

    t = threading.Thread(target=lead)
    t.start()
    time.sleep(0.1)
    with follower.turn("Block.1.train_grad"):
        order.append("follower compiles")
    t.join()
    assert order == ["leader compiled", "follower compiles"]
    assert follower.outcomes == ["followed"] and leader.outcomes == ["led"]
    assert 0.2 < follower.waited_s < 5


def test_a_failed_leader_compile_releases_the_follower(tmp_path):
    leader, follower = RankGate(tmp_path, True, 60), RankGate(tmp_path, False, 60)
    with pytest.raises(RuntimeError), leader.turn("k"):
        raise RuntimeError("compile failed")
    with follower.turn("k"):
        pass
    assert follower.outcomes == ["leader failed"] and follower.waited_s < 1


def test_a_dead_leader_releases_the_follower_at_once(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    (tmp_path / "k.start").write_text(proc.stdout.strip())  # it started compiling, then died
    follower = RankGate(tmp_path, False, 60)
    with follower.turn("k"):
        pass
    assert follower.outcomes == ["leader died"] and follower.waited_s < 2


def test_a_leader_that_never_shows_up_is_waited_for_a_bounded_time(tmp_path):
    follower = RankGate(tmp_path, False, 0.5)
    t0 = time.monotonic()
    with follower.turn("k"):
        pass
    assert follower.outcomes == ["timed out"] and 0.5 <= time.monotonic() - t0 < 3
