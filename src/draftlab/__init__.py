"""draftlab: speculative decoding for Hugging Face models, measured honestly."""

from draftlab.errors import DraftlabError
from draftlab.sampling import SamplingParams

__version__ = "0.1.0"
__all__ = ["DraftlabError", "SamplingParams", "__version__"]
