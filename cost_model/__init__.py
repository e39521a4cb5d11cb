"""How candidates are ranked before they are measured: features and an XGBoost ranker."""

from .features import featurize
from .xgb import XGBCostModel

__all__ = ["featurize", "XGBCostModel"]
