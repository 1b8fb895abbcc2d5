"""Data: loaders (hub id, parquet, JSONL) that return `Problem`s, the DAPO template, prompt building."""
