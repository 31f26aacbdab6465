"""Data: bundled datasets, tokenize/detokenize pipelines, splits, corpus engines (local, Ray), token shards."""
