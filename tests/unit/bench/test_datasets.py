import random

import numpy as np
import pytest
import torch

from hasten.bench.datasets import load_dataset


def test_digits_split_and_types():
    d = load_dataset("digits")
    assert d.x_train.dtype == torch.float32 and d.y_train.dtype == torch.int64
    assert len(d.y_train) + len(d.y_test) == 1797
    assert d.feature_shape == (64,)
    assert float(d.x_train.max()) <= 1.0
    assert set(d.y_test.tolist()) == set(range(10))


def test_mnist1d_is_generated_and_leaves_global_rngs_alone():
    np_before = np.random.get_state()[1].copy()
    py_before = random.getstate()
    d = load_dataset("mnist1d", num_samples=500)
    assert np.array_equal(np.random.get_state()[1], np_before)
    assert random.getstate() == py_before
    assert d.x_train.shape == (400, 40) and d.x_test.shape == (100, 40)
    again = load_dataset("mnist1d", num_samples=500)
    assert torch.equal(d.x_train, again.x_train)


def test_unknown_dataset():
    with pytest.raises(ValueError, match="choose one of"):
        load_dataset("imagenet")


def test_text_set_ships_in_a_package_and_is_split_without_leaks():
    d = load_dataset("text")  # alias of bbc_news
    assert d.name == "bbc_news" and d.num_classes == 5
    assert d.x_train.dtype == torch.int64 and d.x_train.shape[1] == 256
    assert len(d.y_train) + len(d.y_test) == 2116  # 2,225 articles less 109 repeats
    assert d.vocab[:2] == ("<pad>", "<unk>")
    assert int(d.x_train.max()) < len(d.vocab)
    assert set(d.y_test.tolist()) == set(range(5))
    # no test document appears in the training split
    train_rows = {tuple(r) for r in d.x_train.tolist()}
    assert not any(tuple(r) in train_rows for r in d.x_test.tolist())
    assert load_dataset("bbc_news") is d  # cached per process


def test_tokenize_vocab_and_encode():
    from hasten.bench.datasets import build_vocab, encode, tokenize

    assert tokenize("Don't STOP, 2 go!") == ["don't", "stop", "2", "go"]
    docs = [["a", "b", "a"], ["b", "c"], ["a"]]
    vocab = build_vocab(docs, max_size=4, min_count=2)
    assert vocab == ("<pad>", "<unk>", "a", "b")  # c seen once: dropped; a before b (count)
    ids = encode([["a", "c", "b"], []], vocab, max_tokens=2)
    assert ids.tolist() == [[2, 1], [0, 0]]


def test_mnist1d_classes_keeps_those_classes_relabelled():
    full = load_dataset("mnist1d", num_samples=500)
    d = load_dataset("mnist1d_classes", num_samples=500, seed=42, classes=(5, 6, 7, 8, 9))
    assert d.num_classes == 5 and set(d.y_train.tolist()) <= set(range(5))
    keep = full.y_train >= 5
    assert torch.equal(d.x_train, full.x_train[keep])
    assert torch.equal(d.y_train, full.y_train[keep] - 5)


def test_bbc_passages_and_the_pretraining_corpus_share_no_article():
    from hasten.bench.datasets import bbc_passage_split

    split = bbc_passage_split()
    d = split.task
    assert d.num_classes == 5 and d.x_train.shape[1] == 64
    # the pretraining articles, 40 %, less the near-repeats of fine-tuning or test articles
    assert 700 < len(split.corpus) < round(2116 * 0.4)
    assert int(d.x_train.max()) < len(d.vocab) and int(split.corpus.max()) < len(d.vocab)
    # passages of different articles, and the few that near-repeated articles share are dropped
    # from the test set: no test passage is also a training passage
    train_rows = {tuple(r) for r in d.x_train.tolist()}
    assert not any(tuple(r) in train_rows for r in d.x_test.tolist())
    # no 64-token stretch of the corpus, at any offset, is a training or a test passage
    # (a hash of each stretch first: the corpus has ~750k of them; equal hashes then compared)
    weights = torch.randint(1, 2**31, (64,), generator=torch.Generator().manual_seed(0))
    stretches = split.corpus.unfold(1, 64, 1).reshape(-1, 64)
    rows = torch.cat([d.x_train, d.x_test])
    same = torch.isin(stretches @ weights, rows @ weights)
    shared = {tuple(r) for r in stretches[same].tolist()} & {tuple(r) for r in rows.tolist()}
    assert not shared
    assert load_dataset("bbc_passages") is d  # cached per process
