"""The method table: one row per method, each registered by the folder that implements it.

A `MethodSpec` names a method, says whether it needs a draft model or a head, whether it
speculates, which `DecoderConfig` settings it reads, how its draft length is reported, and where
its decoder is built. No torch here: reports read the table. The rows come from `METHOD_MODULES`
(each drafter's and each engine's `methods.py`), loaded on the table's first use; adding a drafter
is its folder plus one line there.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Iterator, MutableMapping
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Protocol

from draftlab.errors import DraftlabError

if TYPE_CHECKING:
    from draftlab.decode.cost import CostModel
    from draftlab.decode.stats import Generation
    from draftlab.models.loading import LoadedModel
    from draftlab.sampling import SamplingParams

# Where the rows are declared, in the order the table lists them.
METHOD_MODULES = (
    "draftlab.decode.plain",
    "draftlab.drafters.draft_model.methods",
    "draftlab.drafters.lookup.methods",
    "draftlab.drafters.hybrid.methods",
    "draftlab.drafters.suffix.methods",
    "draftlab.drafters.eagle3.methods",
    "draftlab.drafters.dflash.methods",
    "draftlab.engines",  # each engine's own rows (engines/<name>/methods.py), from its one list
)
FLAGS = ("draft", "head", "plain", "sized", "tree", "lossy")


@dataclass(frozen=True)
class Setting:
    """A setting a drafter declares with its rows (`register(..., settings=...)`): its command-line
    option (`--repeat-back` for `repeat_back`), default, bounds and record come from here, so that a
    drafter with a setting of its own edits neither `cli/` nor `DecoderConfig`."""

    name: str
    type: Callable[[str], Any]
    default: Any
    help: str
    minimum: float | None = None
    maximum: float | None = None
    # A rule the bounds cannot say: (test, what it requires), e.g. (lambda v: v > 0, "> 0").
    rule: tuple[Callable[[Any], bool], str] | None = None
    aliases: tuple[str, ...] = ()  # other flags for it (another tool's name, "--assistant-confidence")

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def check(self, value: Any) -> None:
        low = self.minimum is not None and value < self.minimum
        high = self.maximum is not None and value > self.maximum
        if low or high:
            if self.minimum is not None and self.maximum is not None:
                bounds = f"in [{self.minimum:g}, {self.maximum:g}]"
            else:
                bounds = f">= {self.minimum:g}" if self.minimum is not None else f"<= {self.maximum:g}"
            raise DraftlabError(f"{self.name} must be {bounds}, got {value}")
        if self.rule is not None and not self.rule[0](value):
            raise DraftlabError(f"{self.name} must be {self.rule[1]}, got {value}")


# Settings declared by drafters, beside DecoderConfig's own fields (filled with the table's rows).
SETTINGS: dict[str, Setting] = {}


class Decoder(Protocol):
    def generate(self, prompt_ids: list[int], max_new_tokens: int, params: SamplingParams) -> Generation: ...


@dataclass(frozen=True)
class DecoderConfig:
    """Every method setting, with its one default. The CLI reads its defaults from here."""

    method: str = "sps"
    gamma: int = 4  # sps: draft tokens per round (with cost-aware sizing: the most per round)
    use_cache: bool = True  # False recomputes the whole sequence each step (ablation)
    # sps and pld: False sizes every round from the machine's cost curve and the acceptance seen
    # so far (k = 0 is a plain target step); True drafts the full γ (or PLD's tokens) every round.
    fixed_k: bool = False
    # Tree methods: a fixed node budget per round (None: chosen each round from the cost curve;
    # without a profile, a chain).
    tree_budget: int | None = None
    # The target's passes of up to 8 tokens through a compiled package over a static cache
    # (models/compiled.py): chains and token trees of our own loop.
    compile: bool = False
    # Exact mode (models/exact.py): every target pass over a static cache, padded to one measured
    # width, so each position scores bit for bit as in plain decoding's pass (in every dtype).
    exact: bool = False
    # Drafters' own settings (`Setting`), as (name, value) pairs; `option(name)` reads one.
    options: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        if self.method not in REGISTRY:
            raise DraftlabError(f"unknown method '{self.method}' (choose from {', '.join(REGISTRY)})")
        if self.gamma < 1:
            raise DraftlabError(f"gamma must be >= 1, got {self.gamma}")
        if self.tree_budget is not None and self.tree_budget < 1:
            raise DraftlabError(f"tree budget must be >= 1, got {self.tree_budget}")
        if self.compile and not REGISTRY[self.method].compilable:
            raise DraftlabError(
                f"--compile runs the methods of draftlab's own loop, not '{self.method}' "
                f"({REGISTRY[self.method].engine}'s own decoding)"
            )

        if self.exact and not REGISTRY[self.method].compilable:
            raise DraftlabError(
                f"--exact runs the methods of draftlab's own loop, not '{self.method}' "
                f"({REGISTRY[self.method].engine}'s own decoding)"
            )

        for name, value in self.options:
            if name not in SETTINGS:
                raise DraftlabError(f"unknown setting '{name}'")
            SETTINGS[name].check(value)

    @property
    def spec(self) -> MethodSpec:
        return REGISTRY[self.method]

    def __getattr__(self, name: str) -> Any:
        """A drafter's own setting read as an attribute (`config.pld_tokens`), as the fields are."""
        if name.startswith("_") or name not in SETTINGS:
            raise AttributeError(name)
        return self.option(name)

    @classmethod
    def of(cls, **values: Any) -> DecoderConfig:
        """A config from fields and drafters' settings alike: `DecoderConfig.of(method="pld", pld_tokens=6)`
        (each setting checked as `options` are)."""
        options = tuple((k, values.pop(k)) for k in list(values) if k not in _FIELDS)
        return cls(**values, options=options)

    def option(self, name: str) -> Any:
        """A drafter's own setting: its value for this run, else its declared default."""
        return dict(self.options).get(name, SETTINGS[name].default)

    def with_options(self, **values: Any) -> DecoderConfig:
        """This config with some of the drafters' own settings changed (each checked)."""
        return dataclasses.replace(self, options=tuple({**dict(self.options), **values}.items()))

    def value(self, name: str) -> Any:
        """Any setting by name: a field of this class or a drafter's own."""
        return getattr(self, name) if name in _FIELDS else self.option(name)

    @property
    def needs_draft(self) -> bool:
        """Whether the method runs a second model beside the target: a draft model or an EAGLE head."""
        return self.spec.needs_draft or self.spec.needs_head

    @property
    def adaptive(self) -> bool:
        """Whether rounds are sized from the cost curve (the method supports it and k is not fixed)."""
        return self.spec.cost_aware and not self.fixed_k

    def settings(self) -> dict:
        """The settings this method reads, as recorded with every result."""
        out = {"use_cache": self.use_cache}
        out.update({name: self.value(name) for name in self.spec.params})
        if self.spec.cost_aware:
            out["fixed_k"] = self.fixed_k
        if self.spec.tree:
            out["tree_budget"] = self.tree_budget
        if self.compile:
            out["compile"] = True
        if self.exact:
            out["exact"] = True
        return out


_FIELDS = {f.name for f in fields(DecoderConfig)}

Builder = Callable[["DecoderConfig", "LoadedModel", "LoadedModel | None", "CostModel | None"], Decoder]


@dataclass(frozen=True)
class MethodSpec:
    name: str
    summary: str
    # "module:function" (imported when a decoder is built, so that reading the table imports no
    # torch), or the function itself.
    builder: str | Builder
    needs_draft: bool = False
    needs_head: bool = False  # drafts with a head that reads the target's features (EAGLE-3, DFlash)
    # Where a head method's head comes from: the command-line option naming it (its dest), and the
    # "module:function(name, target)" that loads it beside the target.
    head_option: str = "head"
    head_loader: str = ""
    head_kind: str = "a head"  # what the head is, for messages ("an EAGLE-3 head")
    head_default: str | None = None  # the catalogue head it takes beside the default target
    speculative: bool = True  # False: one target token per forward pass (a baseline)
    lossless: bool = True  # False: the output may differ from the target's by design (BiLD)
    cost_aware: bool = False  # rounds can be sized from the cost curve
    params: tuple[str, ...] = ()  # the DecoderConfig fields the method reads
    draft_length: str | None = None  # the DecoderConfig field reported as the method's γ
    seed_name: str = ""  # the name the seed reports used ("AS", "SPS", ...)
    tree: bool = False  # proposes token trees (decoder-only targets)
    # None: decoded by draftlab's own loop. Else the engine whose own decoder it is ("hf":
    # transformers' generate, "llamacpp": llama-cpp-python's, "vllm": a head only vLLM loads).
    engine: str | None = None
    settings: tuple[str, ...] = ()  # the drafter's own settings it declared (`Setting` names)

    def load_head(self, name: str, target):
        module, _, function = self.head_loader.partition(":")
        return getattr(importlib.import_module(module), function)(name, target)

    @property
    def external(self) -> bool:
        """Decoded by another library, not by our loop."""
        return self.engine is not None

    @property
    def compilable(self) -> bool:
        """Whether --compile can run it: the methods of our own loop, chains and trees (an EAGLE
        head's too: the head stays eager and reads the compiled target's features)."""
        return not self.external

    def __post_init__(self) -> None:
        for name in (*self.params, *([self.draft_length] if self.draft_length else [])):
            if name not in _FIELDS and name not in SETTINGS:
                raise ValueError(f"method '{self.name}' names an unknown setting '{name}'")

    def build(self, config: DecoderConfig, target, draft, cost) -> Decoder:
        builder = self.builder
        if isinstance(builder, str):
            module, _, function = builder.partition(":")
            builder = getattr(importlib.import_module(module), function)
        return builder(config, target, draft, cost)

    def gamma(self, config: DecoderConfig) -> int | None:
        """The draft length to report for this method (None where it has none)."""
        return config.value(self.draft_length) if self.draft_length else None


class _Table(MutableMapping[str, MethodSpec]):
    """The rows, read from METHOD_MODULES on first use (those modules register into it)."""

    def __init__(self) -> None:
        self._rows: dict[str, MethodSpec] = {}
        self._loaded = False

    def _load(self) -> dict[str, MethodSpec]:
        if not self._loaded:
            self._loaded = True
            for module in METHOD_MODULES:
                importlib.import_module(module)
        return self._rows

    def __getitem__(self, name: str) -> MethodSpec:
        return self._load()[name]

    def __setitem__(self, name: str, spec: MethodSpec) -> None:
        self._rows[name] = spec

    def __delitem__(self, name: str) -> None:
        del self._rows[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._load())

    def __len__(self) -> int:
        return len(self._load())


REGISTRY = _Table()


def register(
    name: str,
    seed_name: str,
    builder: str | Builder,
    summary: str,
    flags: str = "",
    params: tuple[str, ...] = (),
    engine: str | None = None,
    settings: tuple[Setting, ...] = (),
    head: tuple[str, str, str] | tuple[str, str, str, str] | None = None,
) -> MethodSpec:
    """Add one row. `flags`: draft (needs a draft model), head (an EAGLE-3 head, passed where a draft
    goes), plain (a baseline: one target token per pass), sized (rounds sized from the cost curve),
    tree (token trees), lossy (not lossless by design). The first of `params` is reported as γ.
    `settings`: the drafter's own (each also named in `params` to be recorded). `head`: a head
    method's (option, loader) where not EAGLE-3's `--head`."""
    unknown = set(flags.split()) - set(FLAGS)
    if unknown:
        raise ValueError(f"method '{name}' has unknown flags {sorted(unknown)}")
    for setting in settings:
        if setting.name in _FIELDS or SETTINGS.get(setting.name, setting) != setting:
            raise ValueError(f"method '{name}' declares setting '{setting.name}', which another already is")
    added = {s.name: s for s in settings if s.name not in SETTINGS}
    SETTINGS.update(added)
    try:
        spec = MethodSpec(
            name,
            " ".join(summary.split()),
            builder,
            needs_draft="draft" in flags,
            needs_head="head" in flags,
            speculative="plain" not in flags,
            cost_aware="sized" in flags,
            params=params,
            draft_length=params[0] if params else None,
            seed_name=seed_name,
            tree="tree" in flags,
            lossless="lossy" not in flags,
            engine=engine,
            settings=tuple(s.name for s in settings),
            **(
                dict(zip(("head_option", "head_loader", "head_kind", "head_default"), head, strict=False))
                if head
                else {}
            ),
        )
    except ValueError:
        for setting in added:
            del SETTINGS[setting]
        raise
    REGISTRY[name] = spec
    return spec


def unregister(name: str) -> None:
    """Take a row out, with the settings no other row declares."""
    spec = REGISTRY.pop(name)
    kept = {s for other in REGISTRY.values() for s in other.settings}
    for setting in spec.settings:
        if setting not in kept:
            SETTINGS.pop(setting, None)


def declared_settings() -> tuple[Setting, ...]:
    """Every drafter's own settings (the table's rows loaded first)."""
    len(REGISTRY)
    return tuple(SETTINGS.values())


def method_names() -> tuple[str, ...]:
    return tuple(REGISTRY)


def method_spec(name: str) -> MethodSpec:
    if name not in REGISTRY:
        raise DraftlabError(f"unknown method '{name}' (choose from {', '.join(REGISTRY)})")
    return REGISTRY[name]


def makes_trees(method: str | None) -> bool:
    """Whether the method proposes token trees (unknown methods: no)."""
    spec = REGISTRY.get(method or "")
    return bool(spec and spec.tree)


def is_speculative(method: str | None) -> bool:
    """Unknown methods (records from another version) count as speculative: they are not baselines."""
    spec = REGISTRY.get(method or "")
    return spec.speculative if spec else True


DEFAULTS = DecoderConfig()
