"""Running an audit: every method's greedy tokens against plain decoding (differences rerun in float32,
or on one llama.cpp thread), and 2-token samples against the target's exact law, with a wrong rule
beside them to show the test's power.

The command line (cli/audit.py) hands in how to configure a method, price it and load a copy, and
the engine its rerun (`Recheck`: float32 copies here; llama.cpp's one-thread copies in its folder);
this module knows nothing of argparse or of any engine.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
import transformers

from draftlab.audit.checks import WRONG_RULE, first_divergence
from draftlab.audit.law import ResampleFromTargetRule, reuse_prefix, sample_pairs, two_token_law
from draftlab.decode.build import build_decoder, warm_compiled_passes
from draftlab.decode.cost import CostModel
from draftlab.decode.spec import DecoderConfig
from draftlab.models import attention
from draftlab.models.cached import cached
from draftlab.models.compiled import RESERVE
from draftlab.models.loading import LoadedModel, ModelSpec
from draftlab.sampling import SamplingParams
from draftlab.verify.rules import SpeculativeRule

GREEDY = SamplingParams()
AUDIT_TREE_BUDGET = 16  # nodes per round when the audit samples a tree method


class Progress(Protocol):
    def add(self, n: int) -> None: ...
    def say(self, text: str) -> None: ...
    def step(self) -> None: ...


@dataclass(frozen=True)
class AuditSettings:
    max_new_tokens: int
    samples: int
    seed: int
    params: SamplingParams  # the sampling check's


class Recheck(Protocol):
    """Where a greedy difference is rerun, and the record key of that rerun: an engine's own."""

    def key(self, target: LoadedModel, draft: LoadedModel | None) -> str | None:
        """The record key of the rerun this pair gets on a difference, or None (nothing to rerun)."""
        ...

    def copy(self, lm: LoadedModel) -> LoadedModel:
        """The copy of one model of the pair that the rerun decodes with."""
        ...


@dataclass(frozen=True)
class Float32Recheck:
    """Transformers models: a difference in bfloat16 or float16 is rerun on float32 copies."""

    load: Callable[[ModelSpec], LoadedModel]

    def key(self, target: LoadedModel, draft: LoadedModel | None) -> str | None:
        if attention.scores_rows_alone(target):  # a 4-bit target's tokens are ar's bit for bit
            return None
        low = {target.spec.dtype, draft.spec.dtype if draft else "float32"} != {"float32"}
        return "float32" if low else None

    def copy(self, lm: LoadedModel) -> LoadedModel:
        return self.load(dataclasses.replace(lm.spec, dtype="float32"))


@dataclass(frozen=True)
class Parts:
    """What the audit asks of its caller: a method's configuration, a pair's cost model, and the
    engine's rerun of a difference."""

    config_of: Callable[[str], DecoderConfig]
    cost_of: Callable[[LoadedModel, LoadedModel | None], CostModel]
    recheck: Recheck


def token_text(lm: LoadedModel, token: int | None) -> str:
    if token is None:
        return "(end)"
    return lm.tokenizer.decode([token])


def logit_gap(lm: LoadedModel, ids: list[int], a: int, b: int | None) -> float | None:
    """logit(a) - logit(b) where ar wrote a and the method b: how near a tie the choice was."""
    if b is None:
        return None
    if getattr(lm, "cached_model", None) is not None:  # a model that brings its own passes
        runner = cached(lm)
        runner.start(ids)
        logits = runner.forward(ids, keep=1)[-1]
    else:
        with torch.inference_mode():
            logits = lm.model(input_ids=torch.tensor([ids], device=lm.device)).logits[0, -1].float()
    return float(logits[a] - logits[b])


def divergence(
    target: LoadedModel, i: int, ids: list[int], ar: list[int], tokens: list[int], at: int, recheck: str
) -> dict:
    """The record of prompt i's first difference at `at`: both tokens, their texts, how near a tie
    (the logit gap) and the rerun's verdict to come (`recheck`: its key)."""
    want = ar[at] if at < len(ar) else None
    got = tokens[at] if at < len(tokens) else None
    return {
        "prompt": i + 1,
        "position": at,
        "ar_token": want,
        "method_token": got,
        "ar_text": token_text(target, want),
        "method_text": token_text(target, got),
        "logit_gap": logit_gap(target, ids + ar[:at], want, got) if want is not None else None,
        recheck: None,
    }


class Audit:
    def __init__(self, settings: AuditSettings, parts: Parts, bar: Progress) -> None:
        self.args = settings
        self.parts = parts
        self.bar = bar
        self.rechecked: tuple[LoadedModel, LoadedModel | None] | None = None
        self.ar_rechecked: dict[int, list[int]] = {}

    # ------------------------------------------------------------------ greedy

    def decoders(self, methods, target, draft, cost):
        configs = {m: self.parts.config_of(m) for m in ["ar", *methods]}
        return {m: build_decoder(c, target, draft, cost if c.adaptive else None) for m, c in configs.items()}

    def recheck_pair(self, target: LoadedModel, draft: LoadedModel | None):
        """The pair a difference is rerun on: the engine's copies (float32 ones, or llama.cpp's on one
        thread, where every pass size takes the same kernels)."""
        if self.rechecked is None:
            copy = self.parts.recheck.copy
            self.rechecked = (copy(target), copy(draft) if draft is not None else None)
        return self.rechecked

    def recheck_key(self, target, draft) -> str | None:
        return self.parts.recheck.key(target, draft)

    def greedy(self, audits, target, draft, cost, prompts):
        decoders = self.decoders([a.method for a in audits], target, draft, cost)
        # An audit run with --exact: each position scores as in plain decoding's pass, so a
        # difference is a defect, with no rerun to excuse it as rounding.
        exact = self.parts.config_of("ar").exact
        recheck = None if exact else self.recheck_key(target, draft)
        for audit, i, ids, ar, tokens, at in self._compared("greedy", decoders, audits, prompts):
            audit.greedy_prompts += 1
            audit.exact_prompts += int(exact and audit.lossless_claim)
            if at is None:
                audit.greedy_identical += 1
                audit.exact_identical += int(exact and audit.lossless_claim)
                continue
            record = divergence(target, i, ids, ar, tokens, at, recheck or "float32")
            if exact and audit.lossless_claim:
                del record["float32"]
                audit.exact_divergences.append(record)
                continue
            if recheck and audit.lossless_claim:
                record[recheck] = self.recheck(audit.method, i, ids, target, draft)
            audit.divergences.append(record)

    def _compared(self, stage: str, decoders, audits, prompts):
        """Per prompt, `ar`'s greedy tokens, then each audited method's: (audit, prompt index, ids,
        ar's tokens, the method's, their first difference or None)."""
        n = self.args.max_new_tokens
        for i, ids in enumerate(prompts):
            self.bar.say(f"{stage} · prompt {i + 1}/{len(prompts)} · ar")
            ar = decoders["ar"].generate(ids, n, GREEDY).tokens
            self.bar.step()
            for audit in audits:
                self.bar.say(f"{stage} · prompt {i + 1}/{len(prompts)} · {audit.method}")
                tokens = decoders[audit.method].generate(ids, n, GREEDY).tokens
                self.bar.step()
                yield audit, i, ids, ar, tokens, first_divergence(ar, tokens)

    def exact_greedy(self, audits, target, draft, cost, prompts) -> None:
        """Every lossless method of our own loop and `ar` again in exact mode (models/exact.py), where
        a pass of several tokens scores each position as one-token passes do: any difference left
        there is not rounding. In a low precision only (float32 is the reference the differences
        are rerun in already), and not on other engines or when the audit already ran exact."""
        config_of = self.parts.config_of
        chosen = [a for a in audits if a.lossless_claim and config_of(a.method).spec.compilable]
        low = {target.spec.dtype, draft.spec.dtype if draft is not None else "float32"} != {"float32"}
        # A model that brings its own cache-aware passes (another engine's) runs its own kernels.
        own_passes = getattr(target, "cached_model", None) is not None
        if own_passes or target.is_encoder_decoder or not chosen or not low:
            return
        if attention.scores_rows_alone(target):  # its plain greedy check is exact already
            return
        if config_of("ar").exact:
            return
        args = self.args
        # One static-cache bucket for every generation: a generation that grew into another would
        # attend over other slots from there on (models/exact.py).
        need = max(len(ids) for ids in prompts) + args.max_new_tokens + RESERVE
        decoders = {}
        # A copy: exact mode prices every pass at its padded width, which the other checks do not pad.
        cost = dataclasses.replace(cost) if cost is not None else None
        for method in ["ar", *(a.method for a in chosen)]:
            config = dataclasses.replace(config_of(method), exact=True)
            decoders[method] = build_decoder(config, target, draft, cost if config.adaptive else None)
            warm_compiled_passes(decoders[method], need, config)
        self.bar.add(len(prompts) * len(decoders))
        for audit, i, ids, ar, tokens, at in self._compared("exact mode", decoders, chosen, prompts):
            audit.exact_prompts += 1
            if at is None:
                audit.exact_identical += 1
                continue
            record = divergence(target, i, ids, ar, tokens, at, "float32")
            del record["float32"]  # no rerun: in exact mode a difference is a defect
            audit.exact_divergences.append(record)

    def recheck(self, method: str, i: int, ids: list[int], target, draft) -> str:
        args = self.args
        t32, d32 = self.recheck_pair(target, draft)
        self.bar.add(2 if i not in self.ar_rechecked else 1)
        how = (self.recheck_key(target, draft) or "float32").replace("_", "-")
        self.bar.say(f"greedy · prompt {i + 1} · {how} recheck · {method}")
        if i not in self.ar_rechecked:
            ar = build_decoder(self.parts.config_of("ar"), t32)
            self.ar_rechecked[i] = ar.generate(ids, args.max_new_tokens, GREEDY).tokens
            self.bar.step()
        config = self.parts.config_of(method)
        # A copy with its own passes (llama.cpp on one thread) rounds alike at every pass size, so how
        # rounds are sized cannot matter there, and fixed k spares profiling the copy.
        sized = config.adaptive and getattr(t32, "cached_model", None) is None
        cost = self.parts.cost_of(t32, d32 if config.needs_draft else None) if sized else None
        tokens = build_decoder(config, t32, d32, cost).generate(ids, args.max_new_tokens, GREEDY).tokens
        self.bar.step()
        return "matches" if tokens == self.ar_rechecked[i] else "diverges"

    # ------------------------------------------------------------------ sampling

    def sample(self, config: DecoderConfig, target, draft, ids, law, label, rule=None) -> dict:
        """One method at one prefix: `--samples` 2-token generations, their p-value under `law`."""
        t_reuse = reuse_prefix(target, ids)
        d_reuse = reuse_prefix(draft, ids) if draft is not None and config.needs_draft else None
        if config.spec.tree and config.tree_budget is None:
            # Without a cost model a tree method verifies a chain; a fixed budget tests the tree rule.
            config = dataclasses.replace(config, tree_budget=AUDIT_TREE_BUDGET)
        decoder = build_decoder(config, t_reuse, d_reuse)  # no cost model: every round drafts its k
        if rule is not None:
            decoder.rule = rule
            # The wrong rule is wrong in the classic rule's residual, which keyed sampling (what an
            # exact run samples with, and what the methods are tested in there) never reaches.
            decoder.keyed = False
        self.bar.say(label)
        seeds = range(self.args.seed, self.args.seed + self.args.samples)
        run = sample_pairs(decoder, ids, self.params, seeds, on_sample=self.bar.step)
        return {"p_value": law.p_value(run.counts), **run.to_dict()}

    @property
    def params(self) -> SamplingParams:
        return self.args.params

    def sampling(self, audits, target, draft, prefixes, alpha_per_test) -> dict | None:
        args = self.args
        configs = {a.method: self.parts.config_of(a.method) for a in audits}
        wrong = power_method(audits, configs, target, draft)
        self.bar.add(len(prefixes) * args.samples * (len(audits) + (wrong is not None)))
        power: dict | None = None
        if wrong is not None:
            power = {"rule": WRONG_RULE, "proposer_of": wrong, "prefixes": [], "shown": False}
        recheck = self.recheck_key(target, draft)
        for j, ids in enumerate(prefixes):
            law = two_token_law(target, ids, self.params, args.samples)
            where = f"sampling · prefix {j + 1}/{len(prefixes)}"
            for audit in audits:
                config = configs[audit.method]
                result = self.sample(config, target, draft, ids, law, f"{where} · {audit.method}")
                result.update(prefix=j + 1, cells=law.degrees_of_freedom + 1, law_cells=len(law.cells))
                if recheck and audit.lossless_claim and result["p_value"] < alpha_per_test:
                    t32, d32 = self.recheck_pair(target, draft)
                    law32 = two_token_law(t32, ids, self.params, args.samples)
                    self.bar.add(args.samples)
                    again = self.sample(config, t32, d32, ids, law32, f"{where} · {audit.method} · {recheck}")
                    result[f"{recheck}_p_value"] = again["p_value"]
                audit.sampling.append(result)
            if power is not None:
                result = self.sample(
                    configs[wrong],
                    target,
                    draft,
                    ids,
                    law,
                    f"{where} · wrong rule",
                    rule=ResampleFromTargetRule(),
                )
                result.update(prefix=j + 1, rejected=result["p_value"] < alpha_per_test)
                power["prefixes"].append(result)
        if power is not None:
            power["shown"] = any(r["rejected"] for r in power["prefixes"])
        return power


def power_method(audits, configs, target, draft) -> str | None:
    """The audited method whose decoder the wrong rule goes into: one with a speculative-sampling rule,
    a draft model's proposer (stochastic q) preferred."""
    found = []
    for audit in audits:
        if not audit.lossless_claim:
            continue
        decoder = build_decoder(configs[audit.method], target, draft)
        if isinstance(getattr(decoder, "rule", None), SpeculativeRule):
            found.append((getattr(decoder.proposer, "draft", None) is None, audit.method))
    return min(found)[1] if found else None


def versions() -> dict:
    return {"torch": torch.__version__, "transformers": transformers.__version__}
