"""Prompt lookup (PLD) and its token tree: drafts copied from earlier n-gram matches."""
