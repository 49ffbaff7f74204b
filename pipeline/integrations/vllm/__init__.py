"""vLLM's KV connector over this project's engine (docs/vllm.md): vLLM loads
`pipeline.integrations.vllm.PipelineConnector` itself from `--kv-transfer-config`."""

from pipeline.integrations.vllm.connector import PipelineConnector

__all__ = ["PipelineConnector"]
