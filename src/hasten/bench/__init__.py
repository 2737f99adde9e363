"""Benchmark building blocks: models built from configs and datasets that ship or generate offline.

Everything here works without internet: models get random weights from configs (never a hub
download), data ships inside a package (scikit-learn's digits) or is generated locally (MNIST-1D).
Optional packages (``transformers``, ``scikit-learn``, ``mnist1d``) are imported only when used;
install them with ``pip install 'hasten[bench]'``.
"""

from __future__ import annotations

__all__: list[str] = []
