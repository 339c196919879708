"""Deskmate benchmarks (`make bench`, `python -m bench [--quick]`): .

Speed and quality targets live here rather than in timed tests, because the machines that run
the tests are shared and noisy. Every figure is a median or a ratio measured side by side in one
run, and `bench/results.json` records the machine it came from.
"""
