"""Layer 3: acceptance rules that turn a proposal plus the target's logits into final tokens."""

from draftlab.verify.rules import AcceptanceRule, BildRule, SpeculativeRule, Verdict

__all__ = ["AcceptanceRule", "BildRule", "SpeculativeRule", "Verdict"]
