"""The decode loop that joins a proposer, the target and an acceptance rule; the method table
(spec.py, no torch), the builders (build.py) and the statistics a generation returns (stats.py)."""
