"""What a command's arguments become before anything runs: models loaded by role, their cost profiles,
and the policy that chooses dtype, compilation and what fits the time budget.

Below `cli/` (which only parses and prints), above `bench/` and the decoders.
"""
