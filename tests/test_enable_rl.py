"""A reinforcement-learning update runs unmodified under strict carbon.enable (docs/enable.md): a CleanRL-style
PPO agent — orthogonal initialization (QR), tanh MLPs, categorical and Gaussian policies (torch.distributions:
sampling, log_prob, entropy), advantage normalization, the clipped objectives, clip_grad_norm_ and Adam —
gives the same weights at 1 and 2 threads, and its action logits for a row do not depend on the batch.
torch.normal with tensor mean / std (Gaussian policies) is checked against its definition."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import torch
import torch.nn as nn
from torch.distributions import Categorical, Normal

import carbon
from tests.oracle import as_bits, bits_to_float, round_bits

F32 = torch.float32


pytestmark = pytest.mark.usefixtures("restore_num_threads", "carbon_disabled_after")


def _layer(n_in, n_out, std=math.sqrt(2)):
    layer = nn.Linear(n_in, n_out)
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, 0.0)
    return layer


class Agent(nn.Module):
    def __init__(self, obs=8, act=4, continuous=False):
        super().__init__()
        self.critic = nn.Sequential(_layer(obs, 32), nn.Tanh(), _layer(32, 32), nn.Tanh(), _layer(32, 1, 1.0))
        self.actor = nn.Sequential(_layer(obs, 32), nn.Tanh(), _layer(32, 32), nn.Tanh(), _layer(32, act, 0.01))
        self.continuous = continuous
        if continuous:
            self.logstd = nn.Parameter(torch.zeros(1, act))

    def policy(self, x):
        if self.continuous:
            mean = self.actor(x)
            return Normal(mean, self.logstd.expand_as(mean).exp())
        return Categorical(logits=self.actor(x))


def _ppo(threads: int, continuous: bool) -> str:
    torch.set_num_threads(threads)
    with carbon.enabled(seed=0):
        agent = Agent(continuous=continuous)
        opt = torch.optim.Adam(agent.parameters(), lr=2.5e-4, eps=1e-5)
        obs = torch.randn(128, 8)
        with torch.no_grad():
            dist = agent.policy(obs)
            actions = dist.sample()
            old_logp = dist.log_prob(actions)
            old_logp = old_logp.sum(1) if continuous else old_logp
            values = agent.critic(obs).flatten()
        advantages = torch.randn(128)
        returns = advantages + values
        for _ in range(2):
            for mb in torch.randperm(128).split(32):
                dist = agent.policy(obs[mb])
                logp, entropy = dist.log_prob(actions[mb]), dist.entropy()
                if continuous:
                    logp, entropy = logp.sum(1), entropy.sum(1)
                ratio = (logp - old_logp[mb]).exp()
                adv = advantages[mb]
                adv = (adv - adv.mean()) / (adv.std() + 1e-8)
                pg = torch.max(-adv * ratio, -adv * torch.clamp(ratio, 0.8, 1.2)).mean()
                v = agent.critic(obs[mb]).view(-1)
                v_clipped = values[mb] + torch.clamp(v - values[mb], -0.2, 0.2)
                v_loss = 0.5 * torch.max((v - returns[mb]) ** 2, (v_clipped - returns[mb]) ** 2).mean()
                loss = pg - 0.01 * entropy.mean() + 0.5 * v_loss
                opt.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), 0.5)
                opt.step()
    return carbon.fingerprint(agent, opt)


@pytest.mark.parametrize("continuous", [False, True], ids=["categorical", "gaussian"])
def test_ppo_update_gives_the_same_weights_at_one_and_two_threads(continuous):
    assert _ppo(1, continuous) == _ppo(2, continuous)


def test_policy_logits_of_a_row_do_not_depend_on_the_batch():
    with carbon.enabled(seed=1):
        agent = Agent()
        obs = torch.randn(64, 8)
        batch = agent.actor(obs)
        alone = torch.cat([agent.actor(obs[i:i + 1]) for i in range(64)])
    assert torch.equal(as_bits(batch.detach()), as_bits(alone.detach()))


def _rn(v) -> float:
    return bits_to_float(round_bits(Fraction(v), F32), F32)


def test_normal_with_tensor_mean_and_std_is_the_standard_draw_scaled_and_shifted():
    """torch.normal(mean, std) = RN(RN(n·std) + mean), n the standard draw carbon.enable's randn gives from the
    same generator state; mean and std broadcast."""
    g = torch.Generator().manual_seed(2)
    mean, std = torch.randn(3, 5, generator=g), torch.rand(1, 5, generator=g) * 3
    with carbon.enabled(seed=11):
        standard = torch.randn(3, 5)
    with carbon.enabled(seed=11):
        got = torch.normal(mean, std)
    with carbon.enabled(seed=11):
        scalar_std = torch.normal(mean, 0.25)
    with carbon.enabled(seed=11):
        scalar_mean = torch.normal(1.5, std.expand(3, 5))
    n, m, s = standard.tolist(), mean.tolist(), std.expand(3, 5).tolist()
    for i in range(3):
        for j in range(5):
            assert got[i, j].item() == _rn(Fraction(_rn(Fraction(n[i][j]) * Fraction(s[i][j]))) + Fraction(m[i][j]))
            assert scalar_std[i, j].item() == _rn(Fraction(_rn(Fraction(n[i][j]) * Fraction(0.25))) + Fraction(m[i][j]))
            assert scalar_mean[i, j].item() == _rn(Fraction(_rn(Fraction(n[i][j]) * Fraction(s[i][j]))) + Fraction(1.5))


def test_normal_keeps_the_tensor_arguments_dtype_and_checks_std():
    """torch.normal's result has mean's dtype (std's when mean is a number): a bfloat16 mean with a float32
    std (mixed-precision Gaussian policies) gives bfloat16, RN16(RN32(n·std)) + mean as torch's in-place steps
    (the product in the promoted float32, then rounded to the output); a negative std raises."""
    mean, std = torch.zeros(64, dtype=torch.bfloat16), torch.full((64,), 1.7)
    with carbon.enabled(seed=4):
        standard = torch.randn(64, dtype=torch.bfloat16)
    with carbon.enabled(seed=4):
        got = torch.normal(mean, std)
        with pytest.raises(RuntimeError, match="std >= 0.0"):
            torch.normal(torch.zeros(3), -torch.ones(3))
    assert got.dtype == torch.bfloat16
    s32 = Fraction(torch.tensor(1.7).item())
    for n, g in zip(standard.float().tolist(), got.float().tolist()):
        assert g == bits_to_float(round_bits(_rn(Fraction(n) * s32), torch.bfloat16), torch.bfloat16)  # mean 0
