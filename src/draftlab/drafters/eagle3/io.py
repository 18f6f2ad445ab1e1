"""EAGLE-3 heads on disk, in the `speculators` format that vLLM loads (both ways).

A head folder holds `config.json` (speculators fields, the decoder layer's Llama config under
`transformer_layer_config`) and `model.safetensors` (`fc`, `layers.0.*`, `norm`, `lm_head`,
`embed_tokens`, and `d2t` / `t2d` when the draft vocabulary is smaller than the target's). Heads
published in EAGLE's own layout (`midlayer.*`, a plain Llama config with `draft_vocab_size`) load
too. Facts checked against vLLM 0.33's `llama_eagle3.py` and speculators 0.9's `Eagle3SpeculatorConfig`.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import LlamaConfig

from draftlab.drafters.eagle3.head import Eagle3Head, default_aux_layers
from draftlab.errors import DraftlabError
from draftlab.files import write_text

SPECULATORS_VERSION = "0.9.0"  # the speculators release whose config loader these files were checked with
WEIGHTS = "model.safetensors"


def is_head_folder(path: str | Path) -> bool:
    """Whether a folder holds an EAGLE-3 head (speculators or EAGLE layout) rather than a model."""
    config = Path(path).expanduser() / "config.json"
    try:
        data = json.loads(config.read_text())
    except (OSError, ValueError):
        return False
    if data.get("speculators_model_type") == "eagle3":
        return True
    return "draft_vocab_size" in data and any("Eagle3" in a for a in data.get("architectures") or [])


def save_head(
    head: Eagle3Head,
    folder: Path,
    verifier: str,
    verifier_architectures: list[str],
    speculative_tokens: int = 4,
    include_embedding: bool = False,
) -> None:
    """Write the head as vLLM and speculators load it (weights in the head's dtype). The embedding
    is the target's and left out unless asked for: vLLM and `load_head` then take the target's."""
    folder.mkdir(parents=True, exist_ok=True)
    layer = head.config.to_dict()
    for key in ("architectures", "transformers_version", "dtype", "torch_dtype", "_name_or_path"):
        layer.pop(key, None)
    layer.update(model_type="llama", num_hidden_layers=1, tie_word_embeddings=False)
    dtype = str(head.dtype).removeprefix("torch.")
    config = {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "speculators_version": SPECULATORS_VERSION,
        "draft_vocab_size": head.draft_vocab_size,
        "eagle_aux_hidden_state_layer_ids": list(head.aux_layers),
        "embed_requires_grad": False,
        "fc_norm": False,
        "norm_before_fc": False,
        # Written always: vLLM reads a missing value as True, speculators as False.
        "norm_before_residual": head.norm_before_residual,
        "norm_output": False,
        "target_hidden_size": None
        if head.target_hidden_size == head.config.hidden_size
        else head.target_hidden_size,
        "dtype": dtype,
        "transformer_layer_config": layer,
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [
                {
                    "proposal_type": "greedy",
                    "speculative_tokens": speculative_tokens,
                    "accept_tolerance": 0.0,
                    "verifier_accept_k": 1,
                }
            ],
            "verifier": {"name_or_path": verifier, "architectures": list(verifier_architectures)},
        },
    }
    state = {
        name: tensor.detach().cpu().contiguous()
        for name, tensor in head.state_dict().items()
        if not name.startswith("rotary.")
    }
    if not include_embedding:
        state.pop("embed_tokens.weight")
    if head.draft_vocab_size == head.config.vocab_size:
        # vLLM has no slot for d2t when the vocabularies are the same size.
        state.pop("d2t"), state.pop("t2d")
    save_file(state, str(folder / WEIGHTS), metadata={"format": "pt"})
    write_text(folder / "config.json", json.dumps(config, indent=2) + "\n")


def _read_config(folder: Path) -> dict:
    try:
        return json.loads((folder / "config.json").read_text())
    except OSError as exc:
        raise DraftlabError(f"cannot read head '{folder}': {exc.strerror or exc}") from None
    except ValueError:
        raise DraftlabError(f"head '{folder}': config.json is not JSON") from None


def load_head(
    path: str | Path,
    target_config=None,
    target_embedding: torch.Tensor | None = None,
    dtype: torch.dtype = torch.float32,
) -> Eagle3Head:
    """A head from a speculators (or EAGLE) folder. A head saved without its embedding takes the
    target's, as vLLM does; the aux layers default to vLLM's where the config names none."""
    folder = Path(path).expanduser()
    data = _read_config(folder)
    if data.get("speculators_model_type", "eagle3") != "eagle3":
        raise DraftlabError(f"head '{folder}' is a {data['speculators_model_type']} speculator, not eagle3")
    layer = dict(data.get("transformer_layer_config") or data)
    if layer.get("model_type", "llama") != "llama":
        raise DraftlabError(
            f"head '{folder}': only Llama-layer EAGLE-3 heads load (got {layer['model_type']})"
        )
    for key in ("fc_norm", "norm_before_fc"):
        if data.get(key):
            raise DraftlabError(f"head '{folder}': {key} heads are not supported")
    config = LlamaConfig(**{k: v for k, v in layer.items() if k not in ("architectures", "model_type")})
    config.num_hidden_layers = 1
    target_layers = getattr(target_config, "num_hidden_layers", None)
    aux = data.get("eagle_aux_hidden_state_layer_ids") or (
        (data.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    )
    if not aux:
        if target_layers is None:
            raise DraftlabError(f"head '{folder}' names no target layers; load it beside its target")
        aux = default_aux_layers(target_layers)
    head = Eagle3Head(
        config,
        int(data.get("draft_vocab_size") or config.vocab_size),
        tuple(int(i) for i in aux),
        data.get("target_hidden_size") or None,
        bool(data.get("norm_before_residual", True)),
    )
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise DraftlabError(f"head '{folder}' has no .safetensors weights")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        state.update(load_file(str(file)))
    state = {k.replace("midlayer.", "layers.0.").removeprefix("model."): v for k, v in state.items()}
    if "embed_tokens.weight" not in state:
        if target_embedding is None:
            raise DraftlabError(f"head '{folder}' has no embedding; load it beside its target")
        state["embed_tokens.weight"] = target_embedding.detach()
    if "d2t" not in state:
        state["d2t"] = torch.zeros(head.draft_vocab_size, dtype=torch.long)
        state["t2d"] = torch.ones(config.vocab_size, dtype=torch.bool)
    state.setdefault(
        "t2d",
        torch.zeros(config.vocab_size, dtype=torch.bool).index_fill_(
            0, torch.arange(head.draft_vocab_size) + state["d2t"], True
        ),
    )
    expected = {k for k in head.state_dict() if not k.startswith("rotary.")}
    missing = sorted(expected - set(state))
    if missing:
        raise DraftlabError(f"head '{folder}' lacks weights: {', '.join(missing[:4])}")
    try:
        head.load_state_dict({k: v for k, v in state.items() if k in expected}, strict=False)
    except RuntimeError as exc:
        first = str(exc).splitlines()[1].strip() if len(str(exc).splitlines()) > 1 else str(exc)
        raise DraftlabError(f"head '{folder}' does not fit its config: {first}") from None
    return head.to(dtype)


def load_head_lm(path: str, target, dtype: str | None = None):
    """The head at `path` (folder or registry name) beside its loaded target, checked to fit it. It
    runs in the target's dtype; beside a 4-bit target, in the dtype a draft would (`draft_dtype`:
    from Q8_0 blocks where the CPU computes bfloat16 natively, else float32: no package is built in
    an emulated dtype, and an eager bfloat16 head cost 1.5-3.9 of the target's compiled steps on a
    Zen3)."""
    from draftlab.drafters.eagle3.cached import HeadLM  # noqa: PLC0415 - eagle_cached imports the cache code
    from draftlab.models.loading import (  # noqa: PLC0415
        DTYPES,
        STORAGES,
        ModelSpec,
        draft_dtype,
        resolve_path,
    )

    if dtype is None:
        dtype = target.spec.dtype
        if dtype in STORAGES:
            dtype = draft_dtype(dtype, target.spec.device)
    folder = resolve_path(path)
    if not is_head_folder(folder):
        raise DraftlabError(f"'{path}' is not an EAGLE-3 head folder (no speculators eagle3 config.json)")
    tc = target.model.config
    head = load_head(folder, tc, target.model.get_input_embeddings().weight, DTYPES[dtype])
    if dtype in STORAGES:
        # Its matrices and its LM head from Q8_0 blocks, as a draft model's (`draft_dtype`). `fc`
        # too: fusing two rows of features through it in bfloat16 took 0.47 ms of a 1.7 ms
        # proposal on a Zen4, the compiled head pass 1.0 (stop 79).
        from draftlab.models import q4  # noqa: PLC0415

        q4.quantize_q8(head)
        q4.share_inputs(head)
    if head.config.vocab_size != target.vocab_size:
        raise DraftlabError(
            f"head '{path}' was made for a vocabulary of {head.config.vocab_size} tokens, target "
            f"'{target.spec.name}' has {target.vocab_size}"
        )
    if (
        max(head.aux_layers) > tc.num_hidden_layers
        or head.fc.in_features != len(head.aux_layers) * tc.hidden_size
    ):
        raise DraftlabError(
            f"head '{path}' reads target layers {list(head.aux_layers)} of width {head.target_hidden_size}; "
            f"target '{target.spec.name}' has {tc.num_hidden_layers} layers of width {tc.hidden_size}"
        )
    head.to(target.device).eval()
    return HeadLM(
        head,
        target.tokenizer,
        ModelSpec(path, dtype, target.spec.device),
        folder,
        set(target.eos_token_ids),
        target.context_length,
    )
