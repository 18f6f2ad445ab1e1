"""DFlash drafters on disk, in the layout of the published checkpoints (z-lab's `DFlashDraftModel`):
`config.json` (a Qwen3 config with `block_size`, `num_target_layers` and `dflash_config`) and
`model.safetensors` with the drafter's own weights; the embedding and output head are the target's."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import Qwen3Config

from draftlab.drafters.dflash.head import DFlashDraft, default_taps
from draftlab.errors import DraftlabError
from draftlab.files import write_text

ARCHITECTURE = "DFlashDraftModel"
WEIGHTS = "model.safetensors"


def _read_config(folder: Path) -> dict | None:
    try:
        return json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return None


def is_dflash_folder(path: str | Path) -> bool:
    data = _read_config(Path(path).expanduser())
    return bool(data) and ARCHITECTURE in (data.get("architectures") or [])


def save_dflash(draft: DFlashDraft, folder: Path, verifier: str) -> None:
    """Write the drafter as its published checkpoints are laid out, in its own dtype."""
    folder.mkdir(parents=True, exist_ok=True)
    config = draft.config.to_dict()
    for key in ("transformers_version", "_name_or_path"):
        config.pop(key, None)
    config.update(
        architectures=[ARCHITECTURE],
        model_type="qwen3",
        dtype=str(draft.fc.weight.dtype).removeprefix("torch."),
        block_size=draft.block_size,
        dflash_config={"mask_token_id": draft.mask_token_id, "target_layer_ids": list(draft.taps)},
        verifier=verifier,
    )
    if draft.target_hidden_size != draft.config.hidden_size:
        config["target_hidden_size"] = draft.target_hidden_size
    if not draft.pruned:
        config.pop("draft_vocab_size", None)
    state = {name: t.detach().cpu().contiguous() for name, t in draft.state_dict().items()}
    save_file(state, str(folder / WEIGHTS), metadata={"format": "pt"})
    write_text(folder / "config.json", json.dumps(config, indent=2) + "\n")


def load_dflash(path: str | Path, dtype: torch.dtype = torch.float32) -> DFlashDraft:
    folder = Path(path).expanduser()
    data = _read_config(folder)
    if data is None:
        raise DraftlabError(f"cannot read DFlash drafter '{folder}': no readable config.json")
    if ARCHITECTURE not in (data.get("architectures") or []):
        raise DraftlabError(
            f"'{folder}' is not a DFlash drafter (config.json's architectures lack {ARCHITECTURE})"
        )
    extra = data.get("dflash_config") or {}
    if "mask_token_id" not in extra or "block_size" not in data:
        raise DraftlabError(
            f"DFlash drafter '{folder}': config.json lacks block_size or dflash_config.mask_token_id"
        )
    fields = {k: v for k, v in data.items() if k not in ("architectures", "model_type", "verifier")}
    config = Qwen3Config(**fields)
    config.block_size = int(data["block_size"])
    config.dflash_config = dict(extra)
    if "target_layer_ids" not in extra:
        target_layers = data.get("num_target_layers")
        if target_layers is None:
            raise DraftlabError(f"DFlash drafter '{folder}' names neither its taps nor its target's layers")
        config.dflash_config["target_layer_ids"] = list(default_taps(target_layers, config.num_hidden_layers))
    draft = DFlashDraft(config, data.get("target_hidden_size"))
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise DraftlabError(f"DFlash drafter '{folder}' has no .safetensors weights")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        state.update(load_file(str(file)))
    state = {k.removeprefix("model."): v for k, v in state.items()}
    expected = set(draft.state_dict())
    missing = sorted(expected - set(state))
    if missing:
        raise DraftlabError(f"DFlash drafter '{folder}' lacks weights: {', '.join(missing[:4])}")
    try:
        draft.load_state_dict({k: v for k, v in state.items() if k in expected})
    except RuntimeError as exc:
        lines = str(exc).splitlines()
        raise DraftlabError(
            f"DFlash drafter '{folder}' does not fit its config: {lines[-1].strip()}"
        ) from None
    return draft.to(dtype).eval()
