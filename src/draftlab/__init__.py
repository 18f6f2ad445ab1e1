"""draftlab: speculative decoding for Hugging Face models, measured honestly.

The face stays light (no torch): `draftlab report` and the method table load without it.
"""

from draftlab.errors import DraftlabError

__version__ = "0.1.0"
__all__ = ["DraftlabError", "__version__"]
