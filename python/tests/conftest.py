"""pytest set-up for kdaguard's Python tests: tests marked `gpu` need a CUDA device and the CUDA
kernels; without them they are reported skipped, never passed."""

import pytest
import torch


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device (H100/H200) and the CUDA kernels")


def pytest_collection_modifyitems(config, items):
    import kdaguard

    if torch.cuda.is_available() and kdaguard.built_with_cuda():
        return
    why = ("no CUDA device here" if not torch.cuda.is_available()
           else "this kdaguard module was built without the CUDA kernels")
    skip = pytest.mark.skip(reason=why)
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
