"""A real `vllm.LLM` with this project's connector on the GPU host: does a prompt's prefix,
written to the file store by one engine, come back from the store in a fresh engine, and what
is its time to first token against recomputing it? (Issue 64; tests/gpu/vllm_carry.sh runs it.)

    python3 tests/gpu/vllm_llm_ttft.py <workdir> write   # engine 1: prompts P computed, stored
    python3 tests/gpu/vllm_llm_ttft.py <workdir> read    # engine 2: prompts Q computed, P loaded

A DeepSeek-V3 of 8 dense layers (its attention and MLP sizes, no MoE), dummy weights, eager.
Each phase prints one JSON line: per prompt the wall time of `generate` for one token (the time
to first token, in-process), vLLM's cached-token count and the greedy token."""

import json
import sys
import time
from pathlib import Path

from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt

PROMPT_TOKENS = 8192
PROMPTS = 3
DSV3_8_DENSE = {
    **{"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3"},
    **{"hidden_size": 7168, "intermediate_size": 18432, "vocab_size": 129280},
    **{"num_attention_heads": 128, "num_key_value_heads": 128, "q_lora_rank": 1536},
    **{"kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128},
    **{"num_hidden_layers": 8, "first_k_dense_replace": 8, "rope_theta": 10000.0},
    **{"max_position_embeddings": 16384, "bos_token_id": 0, "eos_token_id": 1},
    **{"torch_dtype": "bfloat16", "rms_norm_eps": 1e-6},
}


def prompt(seed: int) -> list[int]:
    """PROMPT_TOKENS token ids that no other seed's prompt shares a block with."""
    return [(seed * 7919 + i * 104729) % 120000 + 2 for i in range(PROMPT_TOKENS)]


def engine(workdir: Path) -> LLM:
    model = workdir / "dsv3-8-dense"
    model.mkdir(parents=True, exist_ok=True)
    (model / "config.json").write_text(json.dumps(DSV3_8_DENSE))
    # the host tier: as many pages as vLLM's KV cache has blocks (host_ratio 1)
    overrides = ["storage=file", f"storage.path={workdir / 'store'}", "workload.host_ratio=1"]
    return LLM(
        model=str(model),
        skip_tokenizer_init=True,
        load_format="dummy",
        enforce_eager=True,
        dtype="bfloat16",
        max_model_len=PROMPT_TOKENS + 16,
        max_num_batched_tokens=PROMPT_TOKENS + 16,
        gpu_memory_utilization=0.3,
        kv_transfer_config={
            "kv_connector": "PipelineConnector",
            "kv_connector_module_path": "pipeline.integrations.vllm",
            "kv_role": "kv_both",
            "kv_connector_extra_config": {"overrides": overrides},
        },
    )


def first_token(llm: LLM, token_ids: list[int]) -> dict:
    params = SamplingParams(max_tokens=1, temperature=0.0)
    start = time.perf_counter()
    (out,) = llm.generate([TokensPrompt(prompt_token_ids=token_ids)], params, use_tqdm=False)
    seconds = time.perf_counter() - start
    return {
        "ttft_ms": round(seconds * 1e3, 2),
        "num_cached_tokens": out.num_cached_tokens,
        "token": out.outputs[0].token_ids[0],
    }


def main() -> None:
    workdir, phase = Path(sys.argv[1]), sys.argv[2]
    (workdir / "store").mkdir(parents=True, exist_ok=True)
    llm = engine(workdir)
    first_token(llm, prompt(1000 if phase == "write" else 2000))  # warm-up, not measured
    result: dict = {"phase": phase, "prompt_tokens": PROMPT_TOKENS}
    if phase == "write":
        result["computed_P"] = [first_token(llm, prompt(seed)) for seed in range(PROMPTS)]
    else:
        stored = [p for p in (workdir / "store").rglob("*") if p.is_file()]
        result["store_files_at_start"] = len(stored)
        result["computed_Q"] = [first_token(llm, prompt(100 + s)) for s in range(PROMPTS)]
        result["loaded_P"] = [first_token(llm, prompt(seed)) for seed in range(PROMPTS)]
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
