"""Layer 5: prompt suites, the benchmark runner, metrics, reports and plots."""
