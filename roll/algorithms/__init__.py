"""RL algorithm functions: pure torch over (B, T) token tensors, chosen by name.

`advantages` (gae, grpo, reinforce and the `compute_advantages` registry), `gigpo` (step-wise
estimators over one row per env step: gigpo, step_reinforce, step_grpo, and
`broadcast_to_tokens`), `losses` (PPO actor and critic losses, log-probs, entropy), `kl`
(reference-KL penalty and its controllers), `utils` (masked reductions).
"""

from roll.algorithms.advantages import (
    ADV_ESTIMATORS,
    compute_advantages,
    compute_gae,
    compute_grpo_advantages,
    compute_reinforce_returns,
)
from roll.algorithms.filters import group_reward_std_stats, select_groups_by_reward_std
from roll.algorithms.gigpo import (
    broadcast_to_tokens,
    compute_gigpo_advantages,
    compute_step_grpo_advantages,
    compute_step_reinforce_advantages,
)
from roll.algorithms.kl import (
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    kl_penalty,
    make_kl_controller,
)
from roll.algorithms.losses import (
    agg_loss,
    entropy_from_logits,
    logprobs_from_logits,
    ppo_policy_loss,
    value_loss,
)
from roll.algorithms.utils import masked_mean, masked_sum, masked_var, masked_whiten

__all__ = [
    "ADV_ESTIMATORS",
    "AdaptiveKLController",
    "FixedKLController",
    "agg_loss",
    "apply_kl_penalty",
    "broadcast_to_tokens",
    "compute_advantages",
    "compute_gae",
    "compute_gigpo_advantages",
    "compute_grpo_advantages",
    "compute_reinforce_returns",
    "compute_step_grpo_advantages",
    "compute_step_reinforce_advantages",
    "entropy_from_logits",
    "group_reward_std_stats",
    "kl_penalty",
    "logprobs_from_logits",
    "make_kl_controller",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "ppo_policy_loss",
    "select_groups_by_reward_std",
    "value_loss",
]
