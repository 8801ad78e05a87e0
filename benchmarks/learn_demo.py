"""Does the tiny flow_vla genuinely learn the language-conditioned reaching task, and how fast?

Single process, pure torch, no Ray: expert episodes from the simulator in memory, mean/std
normalisation, LeRobot-style action chunks, AdamW + warmup/cosine, and every ``--eval-every``
steps one JSON line with the train loss, held-out action MSE (original units) next to the
mean-action baseline, closed-loop success, and success when the instruction names another disc
(a policy that uses language goes to the *named* disc, so that success should collapse).

    python benchmarks/learn_demo.py --steps 3000 --batch-size 64
"""

from __future__ import annotations

import argparse
import json
import math
import time

import numpy as np
import torch

from raytrain_vla.models.flow_vla.config import FlowVLAConfig
from raytrain_vla.models.flow_vla.model import FlowVLA, count_parameters
from raytrain_vla.models.flow_vla.tokenizer import tokenize
from raytrain_vla.sim import simulator as sim
from raytrain_vla.train.noise import flow_noise_and_time

CAM = "observation.image"


def build_dataset(seed: int, num_episodes: int, chunk: int, max_text_len: int) -> dict:
    """Every frame is a sample; its chunk is the next ``chunk`` actions, last action repeated."""
    rng = np.random.default_rng(seed)
    images, states, chunks, pads, texts = [], [], [], [], []
    for _ in range(num_episodes):
        ep = sim.rollout_expert(rng)
        t_len = len(ep.actions)
        idx = np.arange(t_len)[:, None] + np.arange(chunk)[None]
        pads.append(idx >= t_len)
        chunks.append(ep.actions[np.minimum(idx, t_len - 1)])
        images.append(ep.images)
        states.append(ep.states)
        texts += [ep.scene.instruction] * t_len
    tokens, mask = tokenize(texts, max_text_len)
    return {
        "images": torch.from_numpy(np.concatenate(images)).permute(0, 3, 1, 2).contiguous(),
        "state": torch.from_numpy(np.concatenate(states)),
        "actions": torch.from_numpy(np.concatenate(chunks)),
        "action_is_pad": torch.from_numpy(np.concatenate(pads)),
        "text_tokens": tokens,
        "text_mask": mask,
    }


class Normalizer:
    """Mean/std over training frames (padded chunk positions excluded)."""

    def __init__(self, data: dict):
        valid = data["actions"][~data["action_is_pad"]]
        self.s_mean, self.s_std = data["state"].mean(0), data["state"].std(0) + 1e-6
        self.a_mean, self.a_std = valid.mean(0), valid.std(0) + 1e-6

    def batch(self, data: dict, idx: torch.Tensor) -> dict:
        return {
            "images": {CAM: data["images"][idx].float() / 255.0},
            "state": (data["state"][idx] - self.s_mean) / self.s_std,
            "actions": (data["actions"][idx] - self.a_mean) / self.a_std,
            "action_is_pad": data["action_is_pad"][idx],
            "text_tokens": data["text_tokens"][idx],
            "text_mask": data["text_mask"][idx],
        }

    def obs(self, observations: list[dict], max_text_len: int) -> dict:
        tokens, mask = tokenize([o["instruction"] for o in observations], max_text_len)
        img = torch.from_numpy(np.stack([o["image"] for o in observations]))
        state = torch.from_numpy(np.stack([o["state"] for o in observations]))
        return {
            "images": {CAM: img.permute(0, 3, 1, 2).float() / 255.0},
            "state": (state - self.s_mean) / self.s_std,
            "text_tokens": tokens,
            "text_mask": mask,
        }


def val_mse(model: FlowVLA, norm: Normalizer, val: dict, seed: int) -> tuple[float, float]:
    """(policy MSE, mean-action MSE) over valid chunk positions, in original action units."""
    n, cfg = len(val["state"]), model.config
    sq_err, base_err, count = 0.0, 0.0, 0
    for start in range(0, n, 256):
        idx = torch.arange(start, min(start + 256, n))
        batch = norm.batch(val, idx)
        noise, _ = flow_noise_and_time(seed, 10**9, idx.tolist(), model.noise_shape)
        pred = model.sample_actions(batch, noise) * norm.a_std + norm.a_mean
        valid = ~val["action_is_pad"][idx]
        target = val["actions"][idx]
        sq_err += float((pred - target).square()[valid].sum())
        base_err += float((norm.a_mean - target).square()[valid].sum())
        count += int(valid.sum()) * cfg.action_dim
    return sq_err / count, base_err / count


def closed_loop(
    model: FlowVLA, norm: Normalizer, num_envs: int, exec_steps: int, seed: int, swap: bool
) -> tuple[float, float]:
    """Run envs in lockstep with batched inference; returns (success, reached instructed disc).

    With ``swap`` the instruction names another disc in the scene instead of the goal.
    """
    envs = [sim.ReachEnv(seed=seed + i) for i in range(num_envs)]
    obs = [env.reset() for env in envs]
    named = []
    for env, o in zip(envs, obs, strict=True):
        k = (env.scene.goal + 1) % sim.NUM_TARGETS if swap else env.scene.goal
        named.append(k)
        o["instruction"] = env.scene.instruction.replace(
            env.scene.colors[env.scene.goal], env.scene.colors[k]
        )
    done = [False] * num_envs
    success, reached = [False] * num_envs, [False] * num_envs
    cfg, round_ = model.config, 0
    while not all(done):
        active = [i for i in range(num_envs) if not done[i]]
        batch = norm.obs([obs[i] for i in active], cfg.max_text_len)
        noise, _ = flow_noise_and_time(seed, round_, active, model.noise_shape)
        chunk = (model.sample_actions(batch, noise) * norm.a_std + norm.a_mean).numpy()
        for row, i in enumerate(active):
            for a in chunk[row, :exec_steps]:
                instruction = obs[i]["instruction"]
                obs[i], ok, done[i] = envs[i].step(a)
                obs[i]["instruction"] = instruction
                success[i] |= ok
                dist = np.linalg.norm(envs[i].scene.targets[named[i]] - envs[i].pos)
                reached[i] |= bool(dist < sim.SUCCESS_TOL)
                if done[i] or (swap and reached[i]):
                    done[i] = True
                    break
        round_ += 1
    return float(np.mean(success)), float(np.mean(reached))


def lr_at(step: int, lr: float, warmup: int, total: int, min_ratio: float = 0.05) -> float:
    """Linear warm-up, then cosine to ``min_ratio * lr`` (the trainer's default schedule)."""
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return lr * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument("--beta", type=float, nargs=2, default=(1.5, 1.0), help="flow time Beta(a,b)")
    p.add_argument("--size", default="tiny")
    p.add_argument("--model-overrides", default="{}", help="JSON dict of FlowVLAConfig fields")
    p.add_argument("--episodes", type=int, default=1500)
    p.add_argument("--val-episodes", type=int, default=100)
    p.add_argument("--eval-envs", type=int, default=50)
    p.add_argument("--exec-steps", type=int, default=4, help="actions executed per chunk")
    p.add_argument("--eval-every", type=int, default=250)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    cfg = FlowVLAConfig.from_size(args.size, **json.loads(args.model_overrides))
    t0 = time.perf_counter()
    train = build_dataset(args.seed, args.episodes, cfg.chunk_size, cfg.max_text_len)
    val = build_dataset(args.seed + 1_000_003, args.val_episodes, cfg.chunk_size, cfg.max_text_len)
    norm = Normalizer(train)
    model = FlowVLA(cfg)
    info = {
        "event": "setup",
        "train_samples": len(train["state"]),
        "val_samples": len(val["state"]),
    }
    info.update(params=count_parameters(model), data_s=round(time.perf_counter() - t0, 2))
    print(json.dumps({**info, "args": vars(args)}), flush=True)

    opt = torch.optim.AdamW(
        model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=args.weight_decay,
        foreach=True,
    )  # fmt: skip
    n, rng = len(train["state"]), np.random.default_rng(args.seed)
    order, pos, train_s, losses = rng.permutation(n), 0, 0.0, []
    reached: dict[str, int] = {}  # first eval step meeting each target
    env_seed = 10_000 + args.seed
    for step in range(args.steps + 1):
        if step % args.eval_every == 0 or step == args.steps:
            model.eval()
            mse, base = val_mse(model, norm, val, args.seed)
            succ, _ = closed_loop(model, norm, args.eval_envs, args.exec_steps, env_seed, False)
            swap_succ, swap_named = closed_loop(
                model, norm, args.eval_envs, args.exec_steps, env_seed, True
            )
            rec = {"step": step, "train_s": round(train_s, 1)}
            rec["loss"] = round(float(np.mean(losses)), 4) if losses else None
            rec.update(val_mse=mse, mean_action_mse=base, mse_ratio=round(mse / base, 3))
            rec.update(success=succ, swapped_success=swap_succ, swapped_reached_named=swap_named)
            print(json.dumps(rec), flush=True)
            if rec["mse_ratio"] <= 0.3:
                reached.setdefault("mse_ratio<=0.3", step)
            if succ >= 0.8:
                reached.setdefault("success>=0.8", step)
            losses = []
            model.train()
        if step == args.steps:
            break
        t_step = time.perf_counter()
        if pos + args.batch_size > n:
            order, pos = rng.permutation(n), 0
        idx = torch.from_numpy(order[pos : pos + args.batch_size])
        pos += args.batch_size
        batch = norm.batch(train, idx)
        noise, t = flow_noise_and_time(
            args.seed, step, idx.tolist(), model.noise_shape, tuple(args.beta)
        )
        for g in opt.param_groups:
            g["lr"] = lr_at(step, args.lr, args.warmup, args.steps)
        loss = model.compute_loss(batch, noise, t).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        opt.step()
        losses.append(loss.item())
        train_s += time.perf_counter() - t_step
    done = {"event": "done", "ms_per_step": round(1e3 * train_s / max(1, args.steps), 1)}
    print(json.dumps({**done, "first_step": reached}), flush=True)


if __name__ == "__main__":
    main()
