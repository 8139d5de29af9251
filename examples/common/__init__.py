"""What the three training examples share: data, augmentation, model, loop and options.

The examples import it as ``common`` (their own directory is first on ``sys.path``); the
loader's Ray workers import it the same way, to unpickle the dataset.
"""

from common.cli import EMBEDDED, parse_args
from common.data import ImageClassification, ImageData, load_image_data
from common.model import SmallCNN
from common.ranks import Ranks
from common.report import RunRecord
from common.train import datasets, eval_loader, fit, make_reproducible, train_loader

__all__ = [
    "EMBEDDED",
    "ImageClassification",
    "ImageData",
    "Ranks",
    "RunRecord",
    "SmallCNN",
    "datasets",
    "eval_loader",
    "fit",
    "load_image_data",
    "make_reproducible",
    "parse_args",
    "train_loader",
]
