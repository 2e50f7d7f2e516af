"""Benchmarks behind `entroloop bench ...`: each returns figures that BENCHMARKS.md reports."""
