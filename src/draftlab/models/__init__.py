"""Layer 1: loading models, a cache-aware forward, and rollback."""

from draftlab.models.cached import CachedModel
from draftlab.models.loading import LoadedModel, ModelSpec, check_compatible, load_model

__all__ = ["CachedModel", "LoadedModel", "ModelSpec", "check_compatible", "load_model"]
