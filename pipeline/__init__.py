"""hicache-pipeline: declarative KV-cache backup/load-back pipelines for MLA/DSA models."""
