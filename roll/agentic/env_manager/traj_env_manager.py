"""Trajectory-wise env manager (StarPO): one training sample per episode.

The sample is the whole multi-turn conversation as one token sequence: the first prompt, then for
every turn the generated ids exactly as sampled (`response_mask` 1) followed by the ids that close
the turn and carry the next observation (`response_mask` 0). Step rewards are credited at the last
generated token of their turn.
"""

from __future__ import annotations

from roll.agentic.env_manager.base import BaseEnvManager, EpisodeSpec
from roll.agentic.rollout.records import Trajectory
from roll.utils.seeding import derive_seed


class TrajEnvManager(BaseEnvManager):
    async def run_episode(self, episode: EpisodeSpec) -> Trajectory:
        obs, info = self.env.reset(seed=episode.env_seed)
        token_ids = self.chat.initial_prompt(info.get("env_instruction"), obs)
        response_mask = [0] * len(token_ids)
        logprobs = [0.0] * len(token_ids)
        turn_ends: list[int] = []
        rewards: list[float] = []
        frames = [self.render_frame()] if episode.keep_frames else []
        versions: set[int] = set()
        num_valid, success, stop_reason, info = 0, False, "max_steps", {}

        for turn in range(self.spec.max_steps):
            if len(token_ids) + self.sampling.max_new_tokens > self.sequence_length:
                stop_reason = "max_tokens"
                break
            out = await self.generate(f"{episode.traj_id}/{turn}", token_ids,
                                      derive_seed(episode.sample_seed, turn))
            versions.add(out.policy_version)
            token_ids += out.token_ids
            response_mask += [1] * len(out.token_ids)
            logprobs += out.logprobs
            turn_ends.append(len(token_ids) - 1)

            obs, reward, terminated, truncated, info = await self.env_step(
                self.chat.response_text(out.token_ids))
            rewards.append(float(reward))
            num_valid += bool(info.get("action_is_valid", True))
            success = bool(info.get("success", False))
            if episode.keep_frames:
                frames.append(self.render_frame())
            if terminated or truncated:
                stop_reason = "terminated" if terminated else "truncated"
                break
            if turn + 1 < self.spec.max_steps:  # the observation is only needed for another turn
                nxt = self.chat.next_turn(obs, out.token_ids)
                token_ids += nxt
                response_mask += [0] * len(nxt)
                logprobs += [0.0] * len(nxt)

        metrics = {k: float(v) for k, v in (info.get("metrics") or {}).items()}
        return Trajectory(
            tag=self.spec.tag, traj_group_id=episode.traj_group_id, traj_id=episode.traj_id,
            env_seed=episode.env_seed, token_ids=token_ids, response_mask=response_mask,
            infer_logprobs=logprobs, turn_end_positions=turn_ends, step_rewards=rewards,
            success=success, stop_reason=stop_reason, policy_version=max(versions, default=0),
            num_actions=len(rewards), num_valid_actions=num_valid, metrics=metrics, frames=frames,
        )
