"""`draftlab audit`'s machinery: the target's exact two-token law and sampling runs (law.py), the
checks and the verdict (checks.py), the run itself (runner.py) and its printed report (report.py)."""
