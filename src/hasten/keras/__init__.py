"""hasten for Keras 3: the fastest correct training configuration, and sifting in ``fit``.

``pip install 'hasten[keras]'`` (PyTorch backend) or ``'hasten[tensorflow]'``. Works on Keras's TensorFlow, PyTorch and JAX backends; select
the backend as Keras wants, with ``KERAS_BACKEND`` before ``keras`` is first imported.
TensorFlow is only needed on its backend (and for ``tf.data`` sources)::

    import hasten.keras

    model = hasten.keras.compile(model, (x[:64], y[:64]), precision="bf16")   # 1. compiler
    data = hasten.keras.SiftingPyDataset(x, y, batch_size=64,                # 2. sifting
                                         config=UnbiasedPruningConfig(prune_ratio=0.5),
                                         num_epochs=10)
    model.fit(data, epochs=10, callbacks=[data.callback()])

See ``docs/keras.md``. ``import hasten`` never imports Keras or TensorFlow; this subpackage
imports Keras only when one of its names is first used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_LAZY: dict[str, str] = {
    "compile": "hasten.keras._compile",
    "KerasCompileReport": "hasten.keras._compile",
    "CandidateReport": "hasten.keras._compile",
    "HastenKerasWarning": "hasten.keras._compile",
    "candidates_for": "hasten.keras._compile",
    "SiftingPyDataset": "hasten.keras.sifting",
    "SiftingCallback": "hasten.keras.sifting",
    "sifting_dataset": "hasten.keras.sifting",
}

__all__ = [
    "CandidateReport",
    "HastenKerasWarning",
    "KerasCompileReport",
    "SiftingCallback",
    "SiftingPyDataset",
    "candidates_for",
    "compile",
    "sifting_dataset",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'hasten.keras' has no attribute {name!r}")
    try:
        value = getattr(importlib.import_module(module), name)
    except ModuleNotFoundError as err:
        if err.name in ("keras", "tensorflow"):
            raise ModuleNotFoundError(
                f"hasten.keras needs {err.name}: "
                + (
                    "pip install 'hasten[tensorflow]' (Keras's TensorFlow backend), or "
                    "KERAS_BACKEND=torch with pip install 'hasten[keras]'"
                    if err.name == "tensorflow"
                    else "pip install 'hasten[keras]'"
                ),
                name=err.name,
            ) from err
        raise
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


if TYPE_CHECKING:  # pragma: no cover
    from hasten.keras._compile import (
        CandidateReport,
        HastenKerasWarning,
        KerasCompileReport,
        candidates_for,
        compile,
    )
    from hasten.keras.sifting import SiftingCallback, SiftingPyDataset, sifting_dataset
