"""The trained heads only vLLM loads, as methods, and each method's vLLM counterpart."""

from __future__ import annotations

from draftlab.decode.spec import MethodSpec, register
from draftlab.errors import DraftlabError

NAME = "vllm"
# Our method -> vLLM's speculative method ("": plain decoding). eagle3: the same heads as `eagle`.
COUNTERPARTS = {
    "ar": "",
    "sps": "draft_model",
    "pld": "ngram",
    "suffix": "suffix",
    "eagle": "eagle3",
    "eagle1": "eagle",
    "eagle3": "eagle3",
    "mtp": "mtp",
    "dflash": "dflash",
}


def vllm_only(config, target, draft, cost):
    raise DraftlabError(f"method '{config.method}' runs on the vllm engine only (--engine vllm)")


SUMMARY = "a trained speculator head, loaded by vLLM (--engine vllm --speculator FOLDER)"
register("eagle1", "EAGLE-1", vllm_only, SUMMARY, params=("gamma",), engine=NAME)
register("eagle3", "EAGLE-3", vllm_only, SUMMARY, params=("gamma",), engine=NAME)
register("mtp", "MTP", vllm_only, SUMMARY, params=("gamma",), engine=NAME)


def counterpart(spec: MethodSpec) -> str | None:
    return COUNTERPARTS.get(spec.name)
