"""The benchmarks: scripts run as `python bench/NAME.py`. A package only so that import-linter can hold the
bench rule (pyproject.toml: bench/ uses the shared helpers of testing/, never tests/)."""
