"""RL algorithm functions: pure torch over (B, T) token tensors, chosen by name.

`advantages` (gae, grpo, reinforce and the `compute_advantages` registry), `gigpo` (step-wise
estimators over one row per env step: gigpo, step_reinforce, step_grpo, and
`broadcast_to_tokens`), `losses` (PPO actor and critic losses, log-probs, entropy),
`pg_variants` (the `pg_variant` registry: vanilla, ppo, tis, topr, cispo, kimi15), `kl`
(reference-KL penalty, KL loss and the penalty's controllers), `reward_norm` (reward
normalisation and clipping), `utils` (masked reductions).
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
    kl_loss,
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
from roll.algorithms.pg_variants import PG_VARIANTS, PGOptions, policy_gradient_loss
from roll.algorithms.utils import masked_mean, masked_sum, masked_var, masked_whiten

__all__ = [
    "ADV_ESTIMATORS",
    "PG_VARIANTS",
    "PGOptions",
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
    "kl_loss",
    "kl_penalty",
    "logprobs_from_logits",
    "make_kl_controller",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "policy_gradient_loss",
    "ppo_policy_loss",
    "select_groups_by_reward_std",
    "value_loss",
]
