import importlib
import subprocess
import sys

import pytest

import hasten
import hasten.sifting as sifting

# SageMaker module path -> names it provides (from SageMaker's smart sifting SDK reference)
SAGEMAKER_PATHS = {
    "dataloader.sift_dataloader": ["SiftingDataloader"],
    "sift_config.sift_configs": [
        "RelativeProbabilisticSiftConfig",
        "LossConfig",
        "SiftingBaseConfig",
    ],
    "loss.abstract_sift_loss_module": ["Loss"],
    "data_model.data_model_interface": ["SiftingBatch", "SiftingBatchTransform"],
    "data_model.list_batch": ["ListBatch"],
    "data_model.tensor_batch": ["TensorBatch"],
    "exceptions": [
        "SiftConfigValidationException",
        "UnsupportedDataFormatException",
        "LossImplementationNotProvidedException",
    ],
}


@pytest.mark.parametrize("path", list(SAGEMAKER_PATHS))
def test_sagemaker_path_resolves_to_hasten_objects(path):
    module = importlib.import_module(f"hasten.smart_sifting.{path}")
    for name in SAGEMAKER_PATHS[path]:
        assert getattr(module, name) is getattr(sifting, name)
        assert name in module.__all__


def test_exceptions_at_package_level_and_top_level_names():
    import hasten.smart_sifting as sm

    assert sm.SiftConfigValidationException is sifting.SiftConfigValidationException
    for name in (
        "SiftingDataloader",
        "RelativeProbabilisticSiftConfig",
        "LossConfig",
        "SiftingBaseConfig",
        "Loss",
    ):
        assert getattr(hasten, name) is getattr(sifting, name)


def test_importing_sifting_pulls_no_heavy_optional_package():
    code = (
        "import sys, hasten.sifting, hasten.smart_sifting.dataloader.sift_dataloader; "
        "bad = [m for m in ('transformers', 'lightning', 'matplotlib', 'sklearn') if m in sys.modules]; "
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
