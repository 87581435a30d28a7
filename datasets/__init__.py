"""Data sources, splits and partitioners shared by every study.

The package is named ``datasets`` after Flower's app-template habit of folder = import
name. It therefore shadows Hugging Face's ``datasets``: this project must not depend on
it, directly or through ``flwr-datasets``.
"""

from datasets.base import ArrayDataset, DataError
from datasets.registry import DATASETS, load_dataset

__all__ = ["ArrayDataset", "DATASETS", "DataError", "load_dataset"]
