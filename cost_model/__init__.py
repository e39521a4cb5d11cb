"""How candidates are ranked before they are measured: named features, the transfer policy and an XGBoost ranker."""

from .features import FEATURE_SETS, TUNE_FEATURE_SETS, Columns, FeatureSet, TaskFeaturizer
from .ranker import TRANSFER_AS, Ranker
from .training import TrainingSet
from .xgb import XGBCostModel

__all__ = ["FEATURE_SETS", "TUNE_FEATURE_SETS", "Columns", "FeatureSet", "Ranker", "TRANSFER_AS", "TaskFeaturizer",
           "TrainingSet", "XGBCostModel"]
