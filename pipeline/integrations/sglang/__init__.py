"""SGLang's HiCache L3 backed by this project's stores: `PipelineStorage`, built by SGLang's
dynamic storage factory (docs/sglang.md). Importing it needs SGLang."""

from pipeline.integrations.sglang.backend import PipelineStorage

__all__ = ["PipelineStorage"]
