"""Benchmarks that time rmmjax against a reference in one run and print a table."""
