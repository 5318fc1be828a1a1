"""The training step's data-parallel math, without vLLM: the same groups through one update on 1
rank and split over 2 ranks (FSDP2 on gloo) give the same weights, also when a rank has no sample
in a mini-batch and when a group's rows train on both; π_θold is the policy at the step's start
in every epoch; a resumed checkpoint hands torch a CPU RNG state.
Run: python -m pytest -q tests/test_update.py"""
import copy
import gc

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from machinery import checkpoints, fsdp, planner, ranks
import forked
import rlep

cpu = torch.device("cpu")


def make_groups(num_prompts, n, seed, vocab=200):
    """Groups of n responses (some with one or two replays) with random tokens, lengths and
    advantages."""
    rng = np.random.default_rng(seed)
    groups = []
    for _ in range(num_prompts):
        prompt = rng.integers(3, vocab, rng.integers(3, 7)).tolist()
        size = n + int(rng.integers(0, 3))
        groups.append([rlep.Sample(prompt, rng.integers(3, vocab, rng.integers(2, 9)).tolist(),
                                   False, 0.0, replay=i >= n, advantage=float(rng.normal()))
                       for i in range(size)])
    return groups


def held(groups, rank, world, owners=None):
    """Rank `rank`'s groups of the list, {position: group}: positions rank, rank + world, ...,
    or on 2 ranks those whose owners[position] is `rank`."""
    if owners is None or world == 1:
        return {p: groups[p] for p in range(rank, len(groups), world)}
    return {p: groups[p] for p in range(len(groups)) if owners[p] == rank}


def update(rank, world, port, model_path, cfg, groups, out, owners=None):
    """One ppo_update on this rank's groups (held); every rank saves its metrics and the rows
    it received, rank 0 the full weights too."""
    torch.set_num_threads(1)
    if world > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world)
    d = ranks.Dist(world > 1, rank, world, cpu, rank == 0)
    policy, optimizer = rlep.build_policy(model_path, cfg, d)
    mini_batch = cfg.mini_batch_prompts * cfg.n
    mine = copy.deepcopy(held(groups, rank, world, owners))
    stats, trained = rlep.ppo_update(policy, optimizer, mine, mini_batch, cfg, d, 0, seed=7)
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    weights = get_model_state_dict(policy.model, options=options)
    # rows another rank generated, trained here
    received = len({id(s) for s in trained} - {id(s) for g in mine.values() for s in g})
    torch.save({"stats": stats, "received": received}, f"{out}.rank{rank}")
    if rank == 0:
        torch.save({"weights": weights, "stats": stats, "received": received}, out)
    # FSDP2's modules sit in reference cycles holding gloo's work objects: freed while the
    # group lives, or their threads can abort the process at exit
    del policy, optimizer
    gc.collect()
    if world > 1:
        dist.destroy_process_group()


def updates_on_one_and_two_ranks(tiny_model, tmp_path, port, cfg, groups, owners=None):
    """The groups' update on 1 rank and on 2 (rank 0's saved results of each), asserted the
    same: the weights to 1e-4 of how far they moved, the gradient norm to 1e-5; the response
    tokens the ranks trained add up to every sample's once an epoch (idle passes count none).
    Returns them, with the rows each of the 2 ranks received ("received", a list)."""
    update(0, 1, None, tiny_model, cfg, groups, tmp_path / "one.pt")
    forked.spawn(update, args=(2, port, tiny_model, cfg, groups, tmp_path / "two.pt", owners),
                 nprocs=2)
    one, two = torch.load(tmp_path / "one.pt"), torch.load(tmp_path / "two.pt")
    per_rank = [torch.load(f"{tmp_path / 'two.pt'}.rank{r}") for r in range(2)]
    tokens = cfg.epochs * sum(len(s.completion_ids) for g in groups for s in g)
    assert one["stats"]["trained_response_tokens"] == tokens
    assert sum(r["stats"]["trained_response_tokens"] for r in per_rank) == tokens
    two["received"] = [r["received"] for r in per_rank]
    base_policy = rlep.build_policy(tiny_model, cfg, ranks.Dist(False, 0, 1, cpu, True))[0]
    base = base_policy.model.state_dict()
    moved = sum(((one["weights"][k] - base[k]) ** 2).sum() for k in base).sqrt()
    gap = sum(((one["weights"][k] - two["weights"][k]) ** 2).sum() for k in base).sqrt()
    assert moved > 1e-3 and gap / moved < 1e-4, (
        f"1 vs 2 ranks differ by {gap / moved:.2e} of the update")
    assert one["stats"]["grad_norm"] == pytest.approx(two["stats"]["grad_norm"], rel=1e-5)
    return one, two


@pytest.mark.parametrize("share_prompts, mini_batch_prompts, num_prompts, micro_batch_tokens, "
                         "epochs", [
    # 4 mini-batches of 2 whole groups (shared prompts): each rank trains its own group
    (True, 2, 8, 0, 1),
    # 4 mini-batches of 1 whole group: in each, one rank has nothing and runs a
    # zero-gradient sample
    (True, 1, 4, 0, 1),
    # rows, not groups: a group's rows train on both ranks, sent by an exchange
    (False, 1, 4, 0, 1),
    # micro-batches by a token budget, longest rows first; two epochs: π_θold stays with
    # the rows a rank received
    (False, 2, 8, 60, 2),
])
def test_one_rank_and_two_ranks_make_the_same_update(tiny_model, tmp_path, free_port, share_prompts,
                                                     mini_batch_prompts, num_prompts,
                                                     micro_batch_tokens, epochs):
    cfg = rlep.parse_config(["--preset", "tiny", "--lr", "1e-3", "--micro_batch_size", "5",
                             "--mini_batch_prompts", str(mini_batch_prompts),
                             "--micro_batch_tokens", str(micro_batch_tokens),
                             "--epochs", str(epochs),
                             "--share_prompts" if share_prompts else "--no-share_prompts"])
    groups = make_groups(num_prompts, cfg.n, seed=3)
    one, two = updates_on_one_and_two_ranks(tiny_model, tmp_path, free_port, cfg, groups)
    assert len({len(g) for g in groups}) > 1  # groups of several sizes (replays)
    # shared prompts keep a group on its rank; rows move otherwise
    assert (sum(two["received"]) == 0) == share_prompts


def micro_batch_counts(cfg, groups, owners):
    """Each mini-batch's micro-batches per rank, as the planner makes them for groups held by
    the ranks owners[position]."""
    world = max(owners) + 1
    sizes = {p: planner.GroupSize(p, sum(len(s.completion_ids) for s in g),
                                    tuple(len(s.prompt_ids) + len(s.completion_ids) for s in g),
                                    owners[p])
             for p, g in enumerate(groups)}
    samples = sum(len(g) for g in groups)
    num_updates = max(1, round(samples / (cfg.mini_batch_prompts * cfg.n)))
    split = planner.Split(cfg.micro_batch_size, cfg.micro_batch_tokens, cfg.share_prompts)
    return [[len(micro_batches) for micro_batches in
             planner.plan_micro_batches(positions, sizes, world, split)]
            for positions in rlep.plan_mini_batches(len(groups), num_updates, 0, 0)]


def test_a_rank_with_fewer_micro_batches_than_the_passes_adds_nothing_to_the_update(
        tiny_model, tmp_path, free_port):
    """FSDP2's lockstep: in each mini-batch one rank holds two groups and the other one, cut
    into fewer micro-batches than the passes the busier rank needs; its missing passes must
    add exactly nothing (an idle pass), not its last micro-batch's tokens a second time. The
    groups are held where dynamic sampling can leave them, not at position % 2: shared prompts
    stay on the rank that holds them."""
    cfg = rlep.parse_config(["--preset", "tiny", "--lr", "1e-3", "--n", "4",
                             "--micro_batch_size", "2", "--mini_batch_prompts", "3",
                             "--share_prompts"])
    groups = make_groups(6, cfg.n, seed=3)
    owners = [0, 1, 0, 0, 1, 0]  # positions 3, 4 and 5 where position % 2 would not put them
    counts = micro_batch_counts(cfg, groups, owners)
    # checked here, so that a planner change cannot silently make the ranks even again
    assert len(counts) > 1 and all(min(c) >= 1 and c[0] != c[1] for c in counts), counts
    _, two = updates_on_one_and_two_ranks(tiny_model, tmp_path, free_port, cfg, groups, owners)
    assert two["received"] == [0, 0]


class OneLayer(torch.nn.Module):
    """The shape shard() reads of a causal LM (model.model.layers), one 4 x 4 linear layer."""

    def __init__(self):
        super().__init__()
        self.model = torch.nn.Module()
        self.model.layers = torch.nn.ModuleList([torch.nn.Linear(4, 4, bias=False)])

    def forward(self, x):
        return self.model.layers[0](x)


def reduce_on_rank(rank, port, model_path, out):
    """A bf16 run's shard() of OneLayer on 2 ranks; rank r's loss makes its local gradient
    scale_r in every weight (x is ones), exact in bf16: 1 on rank 0, 2^-9 on rank 1. Rank 0
    saves the reduced gradient, and the dtype of the weights the layer and a decoder layer of
    a bf16 run's policy (build_policy) computed with."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)
    d = ranks.Dist(True, rank, 2, cpu, rank == 0)
    model = OneLayer()
    fsdp.shard(model, model, d, gather_bf16=True)
    seen = []
    layer = model.model.layers[0]
    layer.register_forward_pre_hook(lambda module, args: seen.append(module.weight.dtype))
    # as ppo_update runs a bf16 run's forward
    with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False):
        y = model(torch.ones(1, 4))
    (y.float().sum() * (1.0 if rank == 0 else 2.0 ** -9)).backward()
    grad = layer.weight.grad.full_tensor()
    cfg = rlep.parse_config(["--preset", "tiny", "--dtype", "bfloat16"])
    policy, _ = rlep.build_policy(model_path, cfg, d)
    attention = policy.model.model.layers[0].self_attn.q_proj
    attention.register_forward_pre_hook(lambda module, args: seen.append(module.weight.dtype))
    sample = rlep.Sample([5, 6, 7], [8, 9], False, 0.0)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False):
        policy(rlep.collate([sample], 0, cpu))
    if rank == 0:
        torch.save({"grad": grad, "gathered": seen}, out)
    del model, policy
    gc.collect()
    dist.destroy_process_group()


def test_a_bf16_run_gathers_bf16_weights_and_reduces_gradients_in_fp32(tiny_model, tmp_path,
                                                                       free_port):
    """Local gradients 1 and 2^-9 (each exact in bf16): their mean over the 2 ranks, 0.5 +
    2^-10, needs 10 bits of mantissa where bf16 has 8; reduced in bf16 it rounds to 0.5. FSDP2
    on gloo shows it on a CPU (it reduces in reduce_dtype there too)."""
    forked.spawn(reduce_on_rank, args=(free_port, tiny_model, tmp_path / "reduced.pt"), nprocs=2)
    reduced = torch.load(tmp_path / "reduced.pt")
    expected = (1.0 + 2.0 ** -9) / 2
    assert torch.tensor(expected).bfloat16().item() != expected  # bf16 cannot hold it
    assert reduced["grad"].dtype == torch.float32
    assert reduced["grad"].tolist() == [[expected] * 4] * 4
    # the weights a bf16 run's forward computes with: gathered in bf16
    assert reduced["gathered"] == [torch.bfloat16, torch.bfloat16]


def test_the_second_epoch_uses_the_old_logprobs_of_the_steps_start(tiny_model, monkeypatch):
    cfg = rlep.parse_config(["--preset", "tiny", "--lr", "0.02", "--epochs", "2",
                             "--mini_batch_prompts", "2", "--micro_batch_size", "6"])
    d = ranks.Dist(False, 0, 1, cpu, True)
    policy, optimizer = rlep.build_policy(tiny_model, cfg, d)
    groups = make_groups(4, cfg.n, seed=5)
    # log π_θ at the start of the step, one sample at a time
    with torch.no_grad():
        start = {id(s): policy(rlep.collate([s], 0, cpu))[0, :len(s.completion_ids)]
                 for g in groups for s in g}
    collated = []
    old_used = []
    real_collate = rlep.collate
    real_loss = rlep.policy_loss

    def recording_collate(samples, *a, **k):
        collated.append(samples)
        return real_collate(samples, *a, **k)

    def recording_loss(lp, old, *a, **k):
        old_used.append(old)
        return real_loss(lp, old, *a, **k)
    monkeypatch.setattr(rlep, "collate", recording_collate)  # what ppo_update calls
    monkeypatch.setattr(rlep, "policy_loss", recording_loss)
    mini_batch = cfg.mini_batch_prompts * cfg.n
    stats, _ = rlep.ppo_update(policy, optimizer, dict(enumerate(groups)), mini_batch, cfg, d, 0,
                               seed=1)
    # per epoch: collate every micro-batch, then train on them in order
    assert len(old_used) == len(collated)
    seen = [id(s) for samples in collated for s in samples]
    assert sorted(seen) == sorted(2 * list(start))  # every sample once per epoch
    for samples, old in zip(collated, old_used):
        for i, s in enumerate(samples):
            assert torch.allclose(old[i, :len(s.completion_ids)], start[id(s)], atol=1e-5)
    # the policy moved: recomputing π_θold per epoch would differ
    assert abs(stats["ratio_mean"] - 1) > 1e-3


def test_each_later_epoch_takes_the_mini_batches_in_its_own_seeded_order(tiny_model,
                                                                         monkeypatch):
    """4 prompts, a mini-batch each, 3 epochs: the first epoch trains them in the step's order,
    each later one in a shuffled order of the same mini-batches, drawn for that epoch."""
    cfg = rlep.parse_config(["--preset", "tiny", "--epochs", "3", "--mini_batch_prompts", "1",
                             "--micro_batch_size", "16", "--lr", "0"])
    d = ranks.Dist(False, 0, 1, cpu, True)
    policy, optimizer = rlep.build_policy(tiny_model, cfg, d)
    groups = make_groups(4, cfg.n, seed=6)
    position = {id(s): p for p, g in enumerate(groups) for s in g}
    collated = []
    real_collate = rlep.collate

    def recording_collate(samples, *a, **k):
        collated.append(position[id(samples[0])])
        return real_collate(samples, *a, **k)
    monkeypatch.setattr(rlep, "collate", recording_collate)  # what ppo_update calls
    later = []
    for seed in range(5):
        collated.clear()
        rlep.ppo_update(policy, optimizer, dict(enumerate(groups)), cfg.n, cfg, d, 0, seed=seed)
        # a micro-batch a group: collated an epoch at a time, in the epoch's order
        epochs = [collated[:4], collated[4:8], collated[8:]]
        assert epochs[0] == [0, 1, 2, 3] and all(sorted(e) == [0, 1, 2, 3] for e in epochs)
        later.append(epochs[1:])
    assert any(second != [0, 1, 2, 3] for second, _ in later)
    assert any(second != third for second, third in later)


def test_resume_hands_torch_a_cpu_rng_state(tiny_model, tmp_path, monkeypatch):
    cfg = rlep.parse_config(["--preset", "tiny"])
    d = ranks.Dist(False, 0, 1, cpu, True)
    policy, optimizer = rlep.build_policy(tiny_model, cfg, d)
    rlep.ppo_update(policy, optimizer, dict(enumerate(make_groups(4, cfg.n, seed=2))), 64, cfg,
                    d, 0, seed=0)
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    checkpoints.save(str(tmp_path), 1, policy, optimizer, tokenizer, cfg, d)
    ckpt = checkpoints.checkpoint_path(str(tmp_path), 1)
    assert checkpoints.latest_checkpoint(str(tmp_path)) == (1, ckpt)
    real_load = torch.load
    handed = []

    # what a GPU map_location does to every tensor of the state
    def device_load(f, map_location=None, **kwargs):
        state = real_load(f, map_location="cpu", **kwargs)
        if map_location == "cpu" or not isinstance(state, dict):
            return state
        return {k: v.to("meta") if torch.is_tensor(v) else v for k, v in state.items()}
    monkeypatch.setattr(torch, "load", device_load)
    monkeypatch.setattr(torch, "set_rng_state", handed.append)
    resumed, resumed_optimizer = rlep.build_policy(ckpt, cfg, d)
    checkpoints.load_trainer_state(ckpt, resumed, resumed_optimizer)
    assert len(handed) == 1 and handed[0].device.type == "cpu" and handed[0].dtype == torch.uint8
    for p, q in zip(policy.parameters(), resumed.parameters()):
        assert torch.equal(p, q)
        assert torch.equal(optimizer.state[p]["exp_avg_sq"],
                           resumed_optimizer.state[q]["exp_avg_sq"])
