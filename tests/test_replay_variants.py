"""The study's controls and its rescue metric: `--replay_loss nll` (replays imitated, advantages
over the fresh samples alone) with its loss checked by hand; `--phase2_prompts all` visiting
prompts the pool lacks, without replays; `rescued` counting a constructed all-wrong group.
Run: python -m pytest -q tests/test_replay_variants.py"""
import pytest
import torch
from transformers import AutoTokenizer

from machinery import data, files, metrics, ranks
import rlep

cpu = torch.device("cpu")


def sample(correct, replay=False, length=2):
    return rlep.Sample([1, 2], [3] * length, correct, 1.0 if correct else -1.0, replay,
                       vllm_logprobs=[-1.0] * length, old_logprobs=torch.full((length,), -1.0))


def test_rescued_counts_a_group_whose_fresh_samples_all_fail_and_a_replay_is_right(tiny_model):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    cfg = rlep.parse_config(["--preset", "tiny"])
    groups = {"rescued": [sample(False)] * 4 + [sample(True, True)] * 2,
              "one fresh right": [sample(True)] + [sample(False)] * 3 + [sample(True, True)] * 2,
              "replays wrong too": [sample(False)] * 4 + [sample(False, True)] * 2,
              "no replays": [sample(False)] * 4}
    for name, group in groups.items():
        for s in group:
            s.row_id = name
    update = {"trained_tokens": 0, "trained_response_tokens": 0}
    groups = list(groups.values())
    visits = [rlep.visit(group) for group in groups]
    gaps = metrics.logprob_gaps([s for g in groups for s in g])
    counts = metrics.step_counts(groups, visits, gaps, tokenizer, cfg, [0], update)
    record = metrics.step_record([counts])
    assert record["rescued"] == 1
    # of the three visits to pooled prompts (with replays), one was rescued
    assert record["rescued_frac"] == pytest.approx(1 / 3)
    visits = {v["id"]: v for v in record["visits"]}
    assert visits["rescued"]["rescued"] and visits["rescued"]["fresh_correct"] == 0
    assert visits["one fresh right"] == {"id": "one fresh right", "fresh_correct": 1,
                                         "replays": 2, "rescued": False}
    assert visits["no replays"]["replays"] == 0
    # summed over ranks
    assert metrics.step_record([counts, counts])["rescued"] == 2


def test_imitated_replays_take_no_advantage_and_their_loss_is_the_hand_computed_one(tiny_model):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    cfg = rlep.parse_config(["--preset", "tiny", "--n", "4", "--replay_loss", "nll"])
    cfg.overlong_buffer = 0
    row = {"id": "q", "problem": "3+4", "answer": "7"}
    prompt = tokenizer("3+4")["input_ids"]
    right = (tokenizer("Answer: 7")["input_ids"], None)
    wrong = (tokenizer("Answer: 5")["input_ids"], None)
    group = rlep.build_group(row, prompt, [right, wrong, wrong, wrong], tokenizer, cfg,
                             tokenizer.eos_token_id, ["Answer: 7", "7\nAnswer: 7"])
    # advantages over the 4 fresh alone: R = [1, -1, -1, -1] gives [1.5, -0.5, -0.5, -0.5]
    assert [s.advantage for s in group[:4]] == pytest.approx([1.5, -0.5, -0.5, -0.5], abs=1e-4)
    assert [s.advantage for s in group[4:]] == [0.0, 0.0] and all(s.replay for s in group[4:])
    # the loss of a two-sample batch at ratio 1: one fresh (Â = 1.5), one replay (Â = 0)
    logprobs = torch.tensor([[-0.5, -1.0, 0.0], [-2.0, -1.0, -3.0]])  # (B, T)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    replays = torch.tensor([False, True])
    advantages = torch.tensor([1.5, 0.0])
    loss, _ = rlep.policy_loss(logprobs, logprobs, advantages, mask, num_tokens=5)
    imitation = rlep.imitation_loss(logprobs, mask * replays[:, None], num_tokens=5)
    # by hand: -(1.5 + 1.5) / 5 for the fresh; -(-2 - 1 - 3) / 5 for the replay
    assert loss.item() == pytest.approx(-3.0 / 5)
    assert imitation.item() == pytest.approx(6.0 / 5)
    # through an update: with every fresh sample wrong, PPO has no signal (all Â = 0) and the
    # imitation term alone raises the replays' likelihood; without it nothing moves
    all_wrong = rlep.build_group(row, prompt, [wrong] * 4, tokenizer, cfg,
                                 tokenizer.eos_token_id, ["Answer: 7", "7\nAnswer: 7"])
    assert all(s.advantage == 0.0 for s in all_wrong)
    d = ranks.Dist(False, 0, 1, cpu, True)
    for coef in (1.0, 0.0):
        # no weight decay: with a zero gradient nothing may move
        cfg.replay_coef, cfg.lr, cfg.weight_decay = coef, 1e-3, 0.0
        policy, optimizer = rlep.build_policy(tiny_model, cfg, d)
        batch = rlep.collate(all_wrong[4:], 0, cpu)
        with torch.no_grad():
            before = (policy(batch) * batch["completion_mask"]).sum()
        stats, _ = rlep.ppo_update(policy, optimizer, {0: all_wrong}, 6, cfg, d, 0, seed=0)
        with torch.no_grad():
            after = (policy(batch) * batch["completion_mask"]).sum()
        if coef:
            assert stats["grad_norm"] > 0 and after > before + 0.05
        else:
            assert stats["grad_norm"] == 0.0 and after == before


def test_phase_two_on_all_prompts_visits_unpooled_ones_without_replays(tiny_model, tiny_engine,
                                                                       tmp_path):
    cfg = rlep.parse_config(["--preset", "tiny", "--out_dir", str(tmp_path), "--val_every", "0",
                             "--phase2_prompts", "all"])
    cfg.phase2_steps = 3
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    train_rows = data.read_rows(cfg.train_file)
    pooled = train_rows[::4]
    pool = [{**row, "responses": [f"Answer: {row['answer']}"] * 3} for row in pooled]
    d = ranks.setup_distributed()
    rlep.phase_two(cfg, pool, train_rows, tiny_engine, tokenizer, tokenizer.eos_token_id,
                   tiny_model, d, [], rlep.RunState())
    rows = files.read_jsonl(str(tmp_path / "phase2" / "metrics.jsonl"))
    visits = [v for r in rows for v in r["visits"]]
    assert len(visits) == 3 * cfg.prompts_per_step
    in_pool = {row["id"] for row in pooled}
    unpooled = [v for v in visits if v["id"] not in in_pool]
    assert unpooled and all(v["replays"] == 0 and not v["rescued"] for v in unpooled)
    assert all(v["replays"] == cfg.replay_m for v in visits if v["id"] in in_pool)
    # the visits follow the training set's order, not the pool's: as phase one draws them
    order = rlep.step_prompts(len(train_rows), cfg.prompts_per_step, 0, cfg.seed)
    assert [v["id"] for v in rows[0]["visits"]] == [train_rows[i]["id"] for i in order]
