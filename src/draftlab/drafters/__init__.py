"""One folder per drafting algorithm: its proposer, its rows of the method table (methods.py) and what
trains it. Adding a drafter is a new folder here plus its name in decode/spec.py METHOD_MODULES."""
