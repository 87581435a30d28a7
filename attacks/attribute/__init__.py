"""Attribute inference: what a trained model reveals about one sensitive attribute of a record."""

from attacks.attribute.model_inversion import (
    LOSSES,
    attribute_inference_summary,
    infer_attribute,
    nearest_candidate,
    prior_baseline,
)

__all__ = ["LOSSES", "attribute_inference_summary", "infer_attribute", "nearest_candidate", "prior_baseline"]
