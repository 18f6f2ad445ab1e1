"""llama-server's own drafters as methods, named as llama.cpp names them, and what the llama-server
engine runs for each of draftlab's methods (`--spec-type`)."""

from __future__ import annotations

from draftlab.decode.spec import MethodSpec, register
from draftlab.errors import DraftlabError

NAME = "llama-server"
# Drafters that need no model beside the target: llama.cpp's n-gram family.
NGRAM_TYPES = ("ngram-mod", "ngram-simple", "ngram-map-k", "ngram-cache")
# Our methods -> llama-server's --spec-type ("": plain decoding). sps drafts with our draft model
# exported to GGUF, eagle with our EAGLE-3 head and dflash with our DFlash drafter, both converted by
# llama.cpp's converter.
COUNTERPARTS = {
    "ar": "",
    "sps": "draft-simple",
    "eagle": "draft-eagle3",
    "eagle3": "draft-eagle3",
    "dflash": "draft-dflash",
}
# Drafters llama-server ships for which draftlab has no model yet: listed in reports, not run.
NOT_RUN = {
    "draft-mtp": "an MTP head",
    "draft-dspark": "a DSpark drafter",
}


def server_only(config, target, draft, cost):
    raise DraftlabError(f"method '{config.method}' is llama-server's own drafter: use --engine llama-server")


for _name in NGRAM_TYPES:
    register(
        _name,
        _name.upper(),
        server_only,
        f"llama-server's {_name} drafter (llama.cpp's n-gram speculation, --spec-type {_name})",
        engine=NAME,
    )


# Drafters combined as llama-server combines them (comma-separated types): the head's chain, and the
# n-gram hash where it has a match (llama.cpp gives the draftless type precedence).
COMBINED = {"eagle+ngram-mod": "draft-eagle3,ngram-mod"}
for _name, _types in COMBINED.items():
    register(
        _name,
        "EAGLE+NGRAM",
        server_only,
        f"llama-server with --spec-type {_types}: our EAGLE-3 head and llama.cpp's n-gram hash together",
        "head",
        engine=NAME,
    )


def counterpart(spec: MethodSpec) -> str | None:
    if spec.name in COMBINED:
        return COMBINED[spec.name]
    if spec.engine == NAME:
        return spec.name
    return COUNTERPARTS.get(spec.name)
