"""Whether `draftlab bench` runs our own loop's methods through compiled packages (models/compiled.py).

`--compile` adds a compiled copy of every method of our loop beside the eager one; `--no-compile`
runs them eagerly only. Without either, the cost profiles decide: where this machine's cached
profile of the target's compiled passes predicts plain decoding at least 10% faster than the eager
profile does, every method but `ar` runs compiled only (the fastest way our loop runs it here) and
`ar` runs both ways; without a compiled profile the run stays eager and its plan says how to build one. The
package is built, and its profile measured, by `draftlab profile --compile` (the README's first
command runs it), never by a default run: a build takes minutes.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from draftlab.models.compiled import compiled_steps
from draftlab.models.cost_curve import compiled_wins
from draftlab.models.loading import LoadedModel
from draftlab.models.profile import load_cached
from draftlab.plan.profiles import machine_profile

# Where the two profiles are set against each other: a typical prompt and the default answer length.
PROMPT_TOKENS = 256
NEW_TOKENS = 64


@dataclass
class CompileChoice:
    compiled: bool  # compiled copies run
    eager: bool  # the eager methods run too (ar always does: our loop's own baseline)
    why: str

    def record(self) -> dict:
        return {"compiled": self.compiled, "eager_too": self.eager, "why": self.why}


def compile_choice(args: argparse.Namespace, target: LoadedModel) -> CompileChoice:
    flag = getattr(args, "compile", None)
    if flag:
        return CompileChoice(True, True, "--compile: compiled copies beside the eager methods")
    if flag is False:
        return CompileChoice(False, True, "--no-compile")
    name = f"{target.spec.name} in {target.spec.dtype}"
    # A model with its own cache-aware passes (another engine's, llama.cpp's) has no compiled ones of ours.
    own_passes = getattr(target, "cached_model", None) is not None
    if target.spec.device != "cpu" or target.is_encoder_decoder or own_passes:
        return CompileChoice(False, True, f"no compiled passes for {name} on {target.spec.device}")
    compiled = load_cached(target, compiled=True)
    if compiled is None:
        return CompileChoice(
            False,
            True,
            f"no compiled profile of {name} on this machine: `draftlab profile --compile` builds its "
            "package once and measures it, then bench runs the methods compiled where that is faster",
        )
    eager = machine_profile(target)
    eager_ms = eager.curve.plain_decoding_ms(PROMPT_TOKENS, NEW_TOKENS)
    compiled_ms = compiled.curve.plain_decoding_ms(PROMPT_TOKENS, NEW_TOKENS)
    figures = (
        f"plain decoding of a {PROMPT_TOKENS}-token prompt and {NEW_TOKENS} new tokens predicted "
        f"{compiled_ms / 1000:.2f} s compiled, {eager_ms / 1000:.2f} s eager ({target.spec.dtype})"
    )
    if compiled_wins(eager.curve, compiled.curve, PROMPT_TOKENS, NEW_TOKENS):
        return CompileChoice(True, False, f"compiled: {figures}")
    return CompileChoice(False, True, f"eager: {figures}")


def compile_seconds(target: LoadedModel) -> dict[str, dict]:
    """Per static-cache length, the seconds its compiled package took to get ready and whether it
    was built now or loaded, built by an earlier run (models/compiled.py)."""

    steps = compiled_steps(target)
    return {
        str(length): {"seconds": round(t, 1), "package": "loaded" if steps.loaded.get(length) else "built"}
        for length, t in steps.compile_seconds.items()
    }
