"""``env_layers bench``: a bounded load test of a live OpenAI-compatible endpoint (docs/operating.md).

``load`` sends streamed chat completions at each concurrency level and times every token;
``report`` turns those timings into throughput and latency percentiles, a table, JSON and a plot.
"""
