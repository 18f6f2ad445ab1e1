"""DFlash: a block drafter that fills a block of masked positions from the target's hidden states in one pass."""
