"""Finding the PaliGemma tokenizer without downloading it (it is gated on the Hub).

Looked for in this order: the path given (`model.<pi>.tokenizer_path`, `policy.load(...,
tokenizer=)`); a `tokenizer/` folder inside the policy directory, then next to it (the layout of
the shared fixtures and of our exports); the local Hugging Face cache under the name LeRobot's
preprocessor writes. Its absence is one error that says where we looked.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from raytrain_vla.models.pi_gemma.config import PALIGEMMA_TOKENIZER

TOKENIZER_DIR = "tokenizer"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model",
                   "special_tokens_map.json", "added_tokens.json")  # fmt: skip


def _is_tokenizer_dir(path: Path) -> bool:
    return (path / "tokenizer.json").is_file() or (path / "tokenizer.model").is_file()


def find_tokenizer(
    given: str = "",
    policy_dir: Path | None = None,
    hub_name: str = PALIGEMMA_TOKENIZER,
    key: str = "model.<pi>.tokenizer_path",
) -> Path:
    """The tokenizer directory (see the module docstring); FileNotFoundError naming every
    place looked in."""
    looked = []
    if given:
        path = Path(given).expanduser()
        if _is_tokenizer_dir(path):
            return path.resolve()
        raise FileNotFoundError(f"'{key}': {path} holds no tokenizer.json / tokenizer.model")
    if policy_dir is not None:
        for candidate in (policy_dir / TOKENIZER_DIR, policy_dir.parent / TOKENIZER_DIR):
            looked.append(str(candidate))
            if _is_tokenizer_dir(candidate):
                return candidate.resolve()
    looked.append(f"the Hugging Face cache ({hub_name})")
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(repo_id=hub_name, local_files_only=True))
    except Exception:  # not in the cache: say where we looked
        pass
    raise FileNotFoundError(
        f"no PaliGemma tokenizer found (looked in: {'; '.join(looked)}); download it once "
        f"(`huggingface-cli download {hub_name} --local-dir DIR`, gated: accept its licence "
        f"first) and give it with {key if '(' in key else key + '=DIR'}"
    )


def load_tokenizer(path: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


def copy_tokenizer(source: Path, target: Path) -> None:
    target.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        if (source / name).is_file():
            shutil.copy2(source / name, target / name)
