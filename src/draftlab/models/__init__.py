"""Models: loading through the Auto classes, the cache-aware forward and rollback, compiled passes,
the machine's cost profile, and the offline model catalogue. The package itself imports nothing heavy."""
