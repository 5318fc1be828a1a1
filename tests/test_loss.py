"""Worked examples for the advantage, the overlong penalty and the DAPO policy loss, checked by
hand and by autograd. Run: python -m pytest -q tests/test_loss.py"""
import pytest
import torch

from rlep import group_advantages, overlong_penalty, policy_loss


def test_group_advantages_worked_example():
    # mean -0.5, unbiased std 1: (1 + 0.5) / 1 = 1.5 and (-1 + 0.5) / 1 = -0.5
    adv = group_advantages(torch.tensor([1.0, -1.0, -1.0, -1.0]), 4)
    assert torch.allclose(adv, torch.tensor([1.5, -0.5, -0.5, -0.5]), atol=1e-5)


def test_group_advantages_rlep_example():
    # 16 wrong fresh rollouts + 2 correct replays (docs/paper.md: the advantage): mean -7/9,
    # unbiased std 0.647, so replays (1 + 7/9) / 0.647 = +2.75 and fresh (-1 + 7/9) / 0.647 = -0.34
    rewards = torch.tensor([-1.0] * 16 + [1.0] * 2)
    adv = group_advantages(rewards, 18)
    assert adv[16:].tolist() == pytest.approx([2.7487] * 2, abs=1e-3)
    assert adv[:16].tolist() == pytest.approx([-0.3436] * 16, abs=1e-3)


def test_group_advantages_groups_are_consecutive_blocks_and_equal_groups_give_zero():
    adv = group_advantages(torch.tensor([1.0, 1.0, 1.0, 0.0, 2.0, 4.0]), 3)
    assert adv[:3].tolist() == [0.0, 0.0, 0.0]
    assert adv[3:].tolist() == pytest.approx([-1.0, 0.0, 1.0], abs=1e-5)  # mean 2, unbiased std 2
    assert group_advantages(torch.tensor([3.0]), 1).tolist() == [0.0]


def test_overlong_penalty_is_zero_then_linear_to_minus_factor():
    assert overlong_penalty(2560, 3072, 512) == 0.0
    assert overlong_penalty(2816, 3072, 512) == pytest.approx(-0.5)
    assert overlong_penalty(3072, 3072, 512) == pytest.approx(-1.0)
    assert overlong_penalty(3072, 3072, 512, factor=0.5) == pytest.approx(-0.5)
    assert overlong_penalty(100, 3072, 0) == 0.0


def _loss_and_grad(logprobs, old, adv, mask, **kw):
    logprobs = logprobs.clone().requires_grad_(True)
    loss, metrics = policy_loss(logprobs, old, adv, mask, **kw)
    loss.backward()
    return loss.item(), logprobs.grad, metrics


def test_ratio_one_reduces_to_reinforce_with_token_mean():
    logprobs = torch.log(torch.tensor([[0.5, 0.25, 0.5], [0.1, 0.2, 0.3]]))
    adv = torch.tensor([2.0, -1.0])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    loss, grad, metrics = _loss_and_grad(logprobs, logprobs.detach(), adv, mask)
    # -(2 + 2 - 1 - 1 - 1) / 5 tokens
    assert loss == pytest.approx(-1.0 / 5)
    # d/dlogp of -A r / N at r = 1
    expected = -torch.tensor([[2.0, 2.0, 0.0], [-1.0, -1.0, -1.0]]) / 5
    assert torch.allclose(grad, expected)
    assert metrics["clip_frac"] == 0.0


def test_clip_higher_and_dual_clip_by_hand():
    old = torch.zeros(1, 5)
    ratios = torch.tensor([[1.5, 0.5, 0.5, 1.5, 20.0]])
    adv_per_token = torch.tensor([1.0, 1.0, -1.0, -1.0, -1.0])
    # one response per token so each token gets its own advantage
    logprobs = torch.log(ratios).T
    mask = torch.ones(5, 1)
    loss, grad, metrics = _loss_and_grad(logprobs, old.T, adv_per_token, mask,
                                         clip_low=0.2, clip_high=0.28, clip_c=10.0)
    # A>0, r=1.5: clipped at 1.28 -> -1.28 (no grad). A>0, r=0.5: -0.5 (grad).
    # A<0, r=0.5: clipped at 0.8 -> 0.8. A<0, r=1.5: 1.5 (grad).
    # A<0, r=20: 20 capped by the dual clip at c=10 -> 10 (no grad).
    per_token = torch.tensor([-1.28, -0.5, 0.8, 1.5, 10.0])
    assert loss == pytest.approx(per_token.mean().item(), abs=1e-5)
    # gradient of -A * r w.r.t. log r is -A * r, divided by the 5 tokens
    expected_grad = torch.tensor([0.0, -0.5, 0.0, 1.5, 0.0]) / 5
    assert torch.allclose(grad.squeeze(1), expected_grad, atol=1e-6)
    assert metrics["clip_frac"] == pytest.approx(2 / 5)
    assert metrics["dual_clip_frac"] == pytest.approx(1 / 5)


def test_num_tokens_is_the_normalizer_and_masked_tokens_get_no_gradient():
    torch.manual_seed(0)
    logprobs = -torch.rand(3, 4)
    # ratios within the clip range: every kept token has a gradient
    old = logprobs + 0.1 * torch.rand(3, 4) - 0.05
    adv = torch.tensor([1.0, -2.0, 0.5])
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]])
    loss_default, grad_default, _ = _loss_and_grad(logprobs, old, adv, mask)
    loss_global, grad_global, _ = _loss_and_grad(logprobs, old, adv, mask, num_tokens=32.0)
    assert loss_global == pytest.approx(loss_default * mask.sum().item() / 32.0, rel=1e-5)
    assert torch.allclose(grad_global, grad_default * mask.sum() / 32.0)
    assert (grad_default[mask == 0] == 0).all() and (grad_default[mask == 1] != 0).all()


def test_micro_batches_with_a_global_normalizer_sum_to_the_full_batch_loss():
    # The trainer splits a mini-batch into micro-batches and divides each by the mini-batch token
    # count: the sum must equal the token mean over the whole mini-batch (the classic GRPO
    # reimplementation bug).
    torch.manual_seed(1)
    logprobs, old = -torch.rand(4, 6), -torch.rand(4, 6)
    adv = torch.randn(4)
    mask = (torch.rand(4, 6) > 0.3).long()
    full, _ = policy_loss(logprobs, old, adv, mask)
    n = mask.sum()
    parts = []
    for i in (0, 2):
        micro = slice(i, i + 2)
        loss, _ = policy_loss(logprobs[micro], old[micro], adv[micro], mask[micro], num_tokens=n)
        parts.append(loss)
    assert (parts[0] + parts[1]).item() == pytest.approx(full.item(), rel=1e-6)
