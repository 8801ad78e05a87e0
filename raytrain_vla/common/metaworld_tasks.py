"""Meta-World's task names, LeRobot's instruction for each, and the difficulty groups that
published MT50 results report (from LeRobot's `envs/metaworld_config.json`, so a policy trained
here reads the same instructions as one trained on `lerobot/metaworld_mt50`).

Pure data: config checks and `data inspect` use it without MuJoCo installed.
"""

from __future__ import annotations

DESCRIPTIONS: dict[str, str] = {
    "assembly-v3": "Pick up a nut and place it onto a peg",
    "basketball-v3": "Dunk the basketball into the basket",
    "bin-picking-v3": "Grasp the puck from one bin and place it into another bin",
    "box-close-v3": "Grasp the cover and close the box with it",
    "button-press-topdown-v3": "Press a button from the top",
    "button-press-topdown-wall-v3": "Bypass a wall and press a button from the top",
    "button-press-v3": "Press a button",
    "button-press-wall-v3": "Bypass a wall and press a button",
    "coffee-button-v3": "Push a button on the coffee machine",
    "coffee-pull-v3": "Pull a mug from a coffee machine",
    "coffee-push-v3": "Push a mug under a coffee machine",
    "dial-turn-v3": "Rotate a dial 180 degrees",
    "disassemble-v3": "Pick a nut out of a peg",
    "door-close-v3": "Close a door with a revolving joint",
    "door-lock-v3": "Lock the door by rotating the lock clockwise",
    "door-open-v3": "Open a door with a revolving joint",
    "door-unlock-v3": "Unlock the door by rotating the lock counter-clockwise",
    "hand-insert-v3": "Insert the gripper into a hole",
    "drawer-close-v3": "Push and close a drawer",
    "drawer-open-v3": "Open a drawer",
    "faucet-open-v3": "Rotate the faucet counter-clockwise",
    "faucet-close-v3": "Rotate the faucet clockwise",
    "hammer-v3": "Hammer a screw on the wall",
    "handle-press-side-v3": "Press a handle down sideways",
    "handle-press-v3": "Press a handle down",
    "handle-pull-side-v3": "Pull a handle up sideways",
    "handle-pull-v3": "Pull a handle up",
    "lever-pull-v3": "Pull a lever down 90 degrees",
    "peg-insert-side-v3": "Insert a peg sideways",
    "pick-place-wall-v3": "Pick a puck, bypass a wall and place the puck",
    "pick-out-of-hole-v3": "Pick up a puck from a hole",
    "reach-v3": "Reach a goal position",
    "push-back-v3": "Push the puck to a goal",
    "push-v3": "Push the puck to a goal",
    "pick-place-v3": "Pick and place a puck to a goal",
    "plate-slide-v3": "Slide a plate into a cabinet",
    "plate-slide-side-v3": "Slide a plate into a cabinet sideways",
    "plate-slide-back-v3": "Get a plate from the cabinet",
    "plate-slide-back-side-v3": "Get a plate from the cabinet sideways",
    "peg-unplug-side-v3": "Unplug a peg sideways",
    "soccer-v3": "Kick a soccer into the goal",
    "stick-push-v3": "Grasp a stick and push a box using the stick",
    "stick-pull-v3": "Grasp a stick and pull a box with the stick",
    "push-wall-v3": "Bypass a wall and push a puck to a goal",
    "reach-wall-v3": "Bypass a wall and reach a goal",
    "shelf-place-v3": "Pick and place a puck onto a shelf",
    "sweep-into-v3": "Sweep a puck into a hole",
    "sweep-v3": "Sweep a puck off the table",
    "window-open-v3": "Push and open a window",
    "window-close-v3": "Push and close a window",
}

# LeRobot's grouping of MT50 by difficulty, the one published VLA results (arXiv 2506.01844) use.
GROUPS: dict[str, tuple[str, ...]] = {
    "easy": (
        "button-press-v3", "button-press-topdown-v3", "button-press-topdown-wall-v3",
        "button-press-wall-v3", "coffee-button-v3", "dial-turn-v3", "door-close-v3",
        "door-lock-v3", "door-open-v3", "door-unlock-v3", "drawer-close-v3", "drawer-open-v3",
        "faucet-close-v3", "faucet-open-v3", "handle-press-v3", "handle-press-side-v3",
        "handle-pull-v3", "handle-pull-side-v3", "lever-pull-v3", "plate-slide-v3",
        "plate-slide-back-v3", "plate-slide-back-side-v3", "plate-slide-side-v3", "reach-v3",
        "reach-wall-v3", "window-close-v3", "window-open-v3", "peg-unplug-side-v3",
    ),
    "medium": (
        "basketball-v3", "bin-picking-v3", "box-close-v3", "coffee-pull-v3", "coffee-push-v3",
        "hammer-v3", "peg-insert-side-v3", "push-wall-v3", "soccer-v3", "sweep-v3",
        "sweep-into-v3",
    ),
    "hard": (
        "assembly-v3", "hand-insert-v3", "pick-out-of-hole-v3", "pick-place-v3", "push-v3",
        "push-back-v3",
    ),
    "very_hard": (
        "shelf-place-v3", "disassemble-v3", "stick-pull-v3", "stick-push-v3",
        "pick-place-wall-v3",
    ),
}  # fmt: skip
# Meta-World's MT10 benchmark (`metaworld.MT10().train_classes`, in its order).
MT10: tuple[str, ...] = (
    "reach-v3", "push-v3", "pick-place-v3", "door-open-v3", "drawer-open-v3", "drawer-close-v3",
    "button-press-topdown-v3", "peg-insert-side-v3", "window-open-v3", "window-close-v3",
)  # fmt: skip
MT50: tuple[str, ...] = tuple(DESCRIPTIONS)
# LeRobot's TASK_NAME_TO_ID (`envs/metaworld_config.json`): the `task_id` of `lerobot/metaworld_mt50`
# and of `data metaworld --layout lerobot`. Not MT50's order above (window-open is 48, -close 49).
TASK_INDEX: dict[str, int] = {
    "assembly-v3": 0, "basketball-v3": 1, "bin-picking-v3": 2, "box-close-v3": 3,
    "button-press-topdown-v3": 4, "button-press-topdown-wall-v3": 5, "button-press-v3": 6,
    "button-press-wall-v3": 7, "coffee-button-v3": 8, "coffee-pull-v3": 9, "coffee-push-v3": 10,
    "dial-turn-v3": 11, "disassemble-v3": 12, "door-close-v3": 13, "door-lock-v3": 14,
    "door-open-v3": 15, "door-unlock-v3": 16, "drawer-close-v3": 17, "drawer-open-v3": 18,
    "faucet-close-v3": 19, "faucet-open-v3": 20, "hammer-v3": 21, "hand-insert-v3": 22,
    "handle-press-side-v3": 23, "handle-press-v3": 24, "handle-pull-side-v3": 25,
    "handle-pull-v3": 26, "lever-pull-v3": 27, "peg-insert-side-v3": 28, "peg-unplug-side-v3": 29,
    "pick-out-of-hole-v3": 30, "pick-place-v3": 31, "pick-place-wall-v3": 32,
    "plate-slide-back-side-v3": 33, "plate-slide-back-v3": 34, "plate-slide-side-v3": 35,
    "plate-slide-v3": 36, "push-back-v3": 37, "push-v3": 38, "push-wall-v3": 39, "reach-v3": 40,
    "reach-wall-v3": 41, "shelf-place-v3": 42, "soccer-v3": 43, "stick-pull-v3": 44,
    "stick-push-v3": 45, "sweep-into-v3": 46, "sweep-v3": 47, "window-open-v3": 48,
    "window-close-v3": 49,
}  # fmt: skip
_BY_DESCRIPTION = {text: name for name, text in DESCRIPTIONS.items()}


MAX_PATH_LENGTH = 500  # Meta-World refuses to step an episode further


def check_max_steps(max_steps: int, key: str) -> None:
    """A step limit Meta-World allows (a ValueError naming `key` otherwise)."""
    if not 1 <= max_steps <= MAX_PATH_LENGTH:
        raise ValueError(
            f"bad value for {key!r}: {max_steps}, expected 1..{MAX_PATH_LENGTH} (Meta-World's "
            "path limit)"
        )


def group_of(task: str) -> str:
    return next(group for group, names in GROUPS.items() if task in names)


def resolve_tasks(spec: str) -> list[str]:
    """`mt10`, `mt50`, a difficulty group, or task names, comma-separated and in order, each
    task once (`-v3` may be left off). An unknown name is a ValueError that names it."""
    tasks: list[str] = []
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        if part.lower() in ("mt10", "mt50"):
            names = MT10 if part.lower() == "mt10" else MT50
        elif part in GROUPS:
            names = GROUPS[part]
        else:
            name = part if part.endswith("-v3") else f"{part}-v3"
            if name not in DESCRIPTIONS:
                raise ValueError(
                    f"unknown Meta-World task {part!r}: expected mt10, mt50, one of "
                    f"{', '.join(GROUPS)}, or a task name such as pick-place-v3"
                )
            names = (name,)
        tasks += [n for n in names if n not in tasks]
    if not tasks:
        raise ValueError(f"no Meta-World tasks in {spec!r}")
    return tasks


def task_of_instruction(instruction: str) -> str | None:
    """The task whose LeRobot instruction this is, else None."""
    return _BY_DESCRIPTION.get(instruction.strip())


def eval_tasks(spec: str, dataset_tasks: list[str]) -> list[str]:
    """The tasks a training run scores: `spec` if given, else the dataset's tasks that are
    Meta-World instructions. A ValueError when that leaves none."""
    if spec:
        return resolve_tasks(spec)
    names = [n for n in (task_of_instruction(t) for t in dataset_tasks) if n]
    if not names:
        raise ValueError(
            "eval.env=metaworld: none of the dataset's tasks is a Meta-World instruction "
            f"(e.g. {dataset_tasks[0]!r}); name the tasks with eval.tasks=mt10|NAME,..."
        )
    return list(dict.fromkeys(names))
