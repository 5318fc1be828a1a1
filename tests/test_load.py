"""One host copy of the weights: under torchrun only rank 0 reads the checkpoint; the other
ranks build the model on the meta device and receive their shards. On 2 ranks (FSDP2 on
gloo) with the real SmolLM2-135M saved in bfloat16, as Qwen2.5-Math-7B is shipped: the
weights, the tie of the head to the embedding and the rotary buffers equal a direct load,
and rank 1's peak memory stays below rank 0's by most of the model's fp32 size; each decoder
layer is an FSDP2 unit of its own (a pass gathers one layer at a time). The policy is
built in train mode: with --gradient_checkpointing its layers run again in the backward.
Run: python -m pytest -q tests/test_load.py"""
import gc

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import FSDPModule
from transformers import AutoModelForCausalLM

from machinery import hub, ranks
import rlep


def peak_rss_bytes() -> int:
    """VmHWM: this process's own peak resident memory. (getrusage's ru_maxrss would carry
    the pytest parent's peak across the spawn.)"""
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def load(rank, port, model_dir, out):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)
    d = ranks.Dist(True, rank, 2, torch.device("cpu"), rank == 0)
    cfg = rlep.parse_config(["--preset", "cpu"])
    policy, _ = rlep.build_policy(model_dir, cfg, d)
    peak = peak_rss_bytes()
    model = policy.model
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    weights = get_model_state_dict(model, options=options)
    buffers = {name: b.clone() for name, b in model.named_buffers()}
    tied = model.lm_head.weight is model.model.embed_tokens.weight
    # FSDP2's units: each decoder layer its own, so a pass gathers one layer's weights at a time
    units = [isinstance(layer, FSDPModule) for layer in model.model.layers]
    torch.save({"peak": peak, "weights": weights, "buffers": buffers, "tied": tied,
                "units": units + [isinstance(policy, FSDPModule)]}, out / f"rank{rank}.pt")
    # FSDP2's modules sit in reference cycles holding gloo's work objects: freed while the
    # group lives, or their threads can abort the process at exit
    del policy, model
    gc.collect()
    dist.destroy_process_group()


def test_rank_zero_alone_reads_the_weights_and_every_rank_gets_them(tmp_path_factory,
                                                                    free_port, smollm2_cache):
    model_dir = tmp_path_factory.mktemp("smollm2") / "bf16"
    converted = AutoModelForCausalLM.from_pretrained(hub.model_folder("builtin:smollm2",
                                                                         str(smollm2_cache)))
    converted.to(torch.bfloat16).save_pretrained(model_dir)
    del converted
    out = tmp_path_factory.mktemp("ranks")
    mp.spawn(load, args=(free_port, str(model_dir), out), nprocs=2)
    ranks = [torch.load(out / f"rank{r}.pt") for r in range(2)]

    direct = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    expected = direct.state_dict()
    for rank in ranks:
        assert rank["tied"] and all(rank["units"])  # every decoder layer and the root
        assert len(rank["units"]) == direct.config.num_hidden_layers + 1
        for name, buffer in direct.named_buffers():
            assert torch.equal(rank["buffers"][name], buffer), name
    gathered = ranks[0]["weights"]
    assert all(torch.equal(gathered[k], expected[k]) for k in expected)
    # rank 0 held the full fp32 weights once; rank 1 only its shard and one tensor in flight
    fp32_bytes = 4 * direct.num_parameters()
    saving = ranks[0]["peak"] - ranks[1]["peak"]
    print(f"peak RSS: rank 0 {ranks[0]['peak'] / 2**20:.0f} MiB, rank 1 "
          f"{ranks[1]['peak'] / 2**20:.0f} MiB, the fp32 model {fp32_bytes / 2**20:.0f} MiB")
    assert saving > 0.5 * fp32_bytes


def layer_calls(model_path, *flags):
    """How often decoder layer 0 runs in one forward and backward of the built policy."""
    cfg = rlep.parse_config(["--preset", "tiny", *flags])
    policy, _ = rlep.build_policy(model_path, cfg, ranks.Dist(False, 0, 1, torch.device("cpu"),
                                                             True))
    calls = []
    # a pre-hook: the recomputation stops once it has what the backward needs
    policy.model.model.layers[0].register_forward_pre_hook(lambda *args: calls.append(1))
    sample = rlep.Sample([5, 6, 7], [8, 9], False, 0.0, advantage=1.0)
    policy(rlep.collate([sample], 0, "cpu")).sum().backward()
    return len(calls)


def test_the_policy_recomputes_its_layers_in_backward_with_gradient_checkpointing(tiny_model):
    """--gradient_checkpointing trades compute for memory: each decoder layer runs again in the
    backward (transformers skips that in eval mode: the policy must be in train mode)."""
    assert layer_calls(tiny_model) == 2
    assert layer_calls(tiny_model, "--no-gradient_checkpointing") == 1
