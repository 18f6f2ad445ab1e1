"""Load a target or a draft through transformers' Auto classes, and check that a pair fits."""

from __future__ import annotations

import contextlib
import hashlib
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import torch
import transformers
from safetensors import SafetensorError
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForSeq2SeqLM,
    AutoTokenizer,
    GenerationConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from draftlab.errors import DraftlabError, first_line
from draftlab.hardware import (
    PROFILE_SCHEMA,
    compile_skip_reason,
    cpu_model_and_flags,
    effective_isa,
    hardware,
    kernel_env,
    supported_dtypes,
)
from draftlab.models import attention, kernels, q4, registry

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# Block storages and the dtype they compute in (models/q4.py): the target's linear layers from Q4_1
# blocks, or a model's (a draft's) from Q8_0 blocks quantized here; everything else as bfloat16.
STORAGES = {"q4_1": "bfloat16", "q8_0": "bfloat16"}
DTYPES |= {name: DTYPES[compute] for name, compute in STORAGES.items()}
# A draft's storage beside a block-storage target (`draft_dtype`).
Q8_STORAGE = "q8_0"
ATTN_IMPLEMENTATIONS = ("eager", "sdpa")
# Tokens whose role must agree between target and draft (the vocabularies being equal, their ids then do).
SPECIAL_TOKENS = ("bos_token", "eos_token")


@dataclass(frozen=True)
class ModelSpec:
    """How to load one model: a hub id, a local folder or a registry name, plus placement."""

    name: str
    dtype: str = "float32"
    device: str = "cpu"  # cpu, cuda, cuda:N, or auto (accelerate's device_map="auto")
    attn_implementation: str | None = None

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise DraftlabError(f"unknown dtype '{self.dtype}' (choose from {', '.join(DTYPES)})")
        if self.attn_implementation not in (None, *ATTN_IMPLEMENTATIONS):
            raise DraftlabError(
                f"unknown attention implementation '{self.attn_implementation}' (choose eager or sdpa)"
            )
        if not (self.device in ("cpu", "cuda", "auto") or self.device.startswith("cuda:")):
            raise DraftlabError(f"unknown device '{self.device}' (choose cpu, cuda, cuda:N or auto)")


@dataclass
class LoadedModel:
    engine: ClassVar[str] = "hf"  # what evaluates it: transformers (a GGUF model says llamacpp)
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    spec: ModelSpec
    path: str
    eos_token_ids: set[int] = field(default_factory=set)
    # A 4-bit storage's source: the GGUF's own blocks (the target itself) or quantized by draftlab.
    storage: str | None = None

    @property
    def is_encoder_decoder(self) -> bool:
        return bool(self.model.config.is_encoder_decoder)

    @property
    def device(self) -> torch.device:
        """Where inputs go: the embedding's device, also for a model split by device_map."""
        return self.model.get_input_embeddings().weight.device

    @property
    def vocab_size(self) -> int:
        return int(self.model.get_output_embeddings().weight.shape[0])

    @property
    def context_length(self) -> int | None:
        cfg = self.model.config
        if self.is_encoder_decoder:
            limit = self.tokenizer.model_max_length
            return int(limit) if limit and limit < 1_000_000 else None
        for key in ("max_position_embeddings", "n_positions", "seq_length"):
            value = getattr(cfg, key, None)
            if isinstance(value, int) and value > 0:
                return value
        return None

    @property
    def num_parameters(self) -> int:
        """Its weights, a tied embedding once; a block layer (models/q4.py) counts the matrix it holds."""
        params = sum(p.numel() for p in self.model.parameters())
        head = self.model.get_output_embeddings()
        tied = bool(getattr(self.model.config, "tie_word_embeddings", False))
        blocks = (m for m in q4.block_layers(self.model) if not (tied and m is head))
        return params + sum(m.in_features * m.out_features for m in blocks)

    def fingerprint(self, compiled: bool = False) -> dict:
        """Everything a cost curve of this model depends on: a profile with another one is re-measured.

        `compiled`: the target's passes through its compiled package (models/compiled.py), a curve of its own."""
        return {
            **({"compiled": COMPILED_PASSES} if compiled else {}),
            "model": self.spec.name,
            # What the cost depends on, not where the files are: a moved DRAFTLAB_HOME keeps its profiles.
            "shape": shape_key(self.path),
            "parameters": self.num_parameters,
            "dtype": self.spec.dtype,
            **(
                {
                    "storage": self.storage,
                    "prompts": q4.prompt_path(),
                    "kernel": kernels.version(),
                }
                if self.storage
                else {}
            ),
            "attn_implementation": self.model.config._attn_implementation,
            "hardware": hardware(self.device),
            "threads": torch.get_num_threads(),
            "kernel_env": kernel_env(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "schema": PROFILE_SCHEMA,
        }


# The version of the compiled passes (models/compiled.py), in their profiles' fingerprints: a curve
# measured before they changed prices passes that no longer run. 2: attention over a window. 3: in
# half precision, over an even number of query rows. 4: the curve measured up to the package's last
# context too (models/profile.py `with_far_context`), not only at 64 and 256.
COMPILED_PASSES = 4


def compute_dtype(dtype: str) -> str:
    """The dtype a model of `dtype` computes in: a 4-bit storage's, else itself (a draft beside a 4-bit
    target runs in it, and so does an engine without our storage)."""
    return STORAGES.get(dtype, dtype)


def draft_dtype(target_dtype: str, device: str = "cpu", isa_flags: list[str] | None = None) -> str:
    """The dtype a draft runs in beside a target of `target_dtype` (unless the user names one): the
    dtype the target computes in, or float32 where that is a half precision this CPU only emulates
    (`isa_flags`: the ISA torch may use, this CPU's by default). Beside the 4-bit target on a Zen3 a
    bfloat16 draft ran eagerly, no package being built in an emulated dtype, at half the target's
    compiled step: no draft token could pay.

    Beside a block-storage target where the CPU computes bfloat16 natively: Q8_0 blocks quantized
    here (`Q8_STORAGE`), as llama.cpp's drafts commonly run. A draft's step is a few small matrices
    and its output head, which torch multiplied at a third of the memory's speed: on a Zen4 its
    compiled bfloat16 step cost 2.7-3.3 ms beside the 4-bit target's 5.3, and the sizer almost never
    drafted (stop 78). A draft's storage moves what it proposes, never what the target accepts.
    (Where bfloat16 is emulated the draft stays float32: a Q8_0 one there is not measured.)"""
    dtype = compute_dtype(target_dtype)
    if not device.startswith("cpu"):
        return dtype
    flags = effective_isa(cpu_model_and_flags()[2]) if isa_flags is None else isa_flags
    if compile_skip_reason(dtype, flags) is not None:
        return "float32"
    return Q8_STORAGE if target_dtype in STORAGES and "avx2" in flags else dtype


def candidate_dtypes(name: str, device: str) -> list[str]:
    """What `--dtype auto` weighs for a target: the device's dtypes, and on a CPU the 4-bit storage
    where the target's own weights are Q4_1 (a catalogue GGUF): there it is the target itself in a
    quarter of bfloat16's bytes. A checkpoint quantized here is another model, so never chosen
    for the user."""
    dtypes = supported_dtypes(device)
    if device == "cpu" and q4.own_gguf(name) is not None:
        dtypes.append(q4.STORAGE)
    return dtypes


def shape_key(path: str) -> str:
    """A folder's config.json and the names and sizes of its weight files (a pass costs what the
    architecture and the bytes read make it cost, wherever the folder is); other paths as given."""
    folder = Path(path)
    if not folder.is_dir():
        return path
    digest = hashlib.sha256()
    for item in sorted(folder.iterdir()):
        if item.name == "config.json":
            digest.update(item.read_bytes())
        elif item.suffix in (".safetensors", ".bin"):
            digest.update(f"{item.name}:{item.stat().st_size}\n".encode())
    return digest.hexdigest()[:16]


def resolve_path(name: str) -> str:
    """A registry name becomes its local folder; anything else is passed through."""

    local = registry.resolve(name)
    return local if local is not None else name


def _looks_like_path(name: str) -> bool:
    # A hub id is "name" or "org/name"; anything else that names a folder is a path.
    return name.startswith((".", "/", "~")) or name.count("/") > 1 or Path(name).exists()


def load_model(spec: ModelSpec, weights: bool = True) -> LoadedModel:
    """`weights=False` builds the model on the meta device: its config, tokenizer, end tokens and
    parameter count without its memory, for runs where another engine (vLLM) holds the weights."""
    path = resolve_path(spec.name)
    if _looks_like_path(path) and not Path(path).expanduser().exists():
        raise DraftlabError(f"model '{spec.name}' not found: no such folder")
    path = str(Path(path).expanduser()) if Path(path).expanduser().exists() else path
    local = Path(path)
    if local.is_dir() and not (local / "config.json").exists():
        raise DraftlabError(
            f"model '{spec.name}': '{path}' is a folder without a model (config.json missing)"
        )
    if local.is_file():
        with open(local, "rb") as f:
            gguf = f.read(4) == b"GGUF"
        raise DraftlabError(
            f"model '{spec.name}' is a GGUF file: run it with --engine llamacpp (transformers loads folders)"
            if gguf
            else f"model '{spec.name}' is a file, not a model folder (a folder with config.json, or a .gguf file "
            "with --engine llamacpp)"
        )
    if spec.device.startswith("cuda") and not torch.cuda.is_available():
        raise DraftlabError(f"device '{spec.device}' requested but CUDA is not available")
    try:
        # Keep transformers' own retry chatter off the console; our one-line error says it all.
        logging.getLogger("huggingface_hub").setLevel(logging.ERROR)
        config = AutoConfig.from_pretrained(path)
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as exc:
        if local.is_dir():
            raise DraftlabError(
                f"model '{spec.name}': the config or tokenizer in '{path}' could not be read ({first_line(exc)})"
            ) from None
        raise DraftlabError(
            f"model '{spec.name}' is not available offline: it is not a local folder, not a registry name "
            f"(see `draftlab models list`) and not in the Hugging Face cache ({first_line(exc)})"
        ) from None
    auto_class = AutoModelForSeq2SeqLM if config.is_encoder_decoder else AutoModelForCausalLM
    if spec.dtype in STORAGES and spec.device != "cpu":
        raise DraftlabError(
            f"dtype {spec.dtype} runs on the CPU (draftlab's 4-bit kernel), not on '{spec.device}'"
        )
    # A 4-bit storage is quantized from the checkpoint's own precision (float32 at most), then the
    # rest of the model computes in the storage's dtype.
    kwargs: dict = {"dtype": torch.float32 if spec.dtype in STORAGES else DTYPES[spec.dtype]}
    if spec.attn_implementation:
        kwargs["attn_implementation"] = spec.attn_implementation
    if spec.device == "auto":
        kwargs["device_map"] = "auto"
    if not weights:
        with torch.device("meta"):
            model = auto_class.from_config(config, dtype=DTYPES[spec.dtype])
        with contextlib.suppress(OSError, ValueError):
            model.generation_config = GenerationConfig.from_pretrained(path)
        return LoadedModel(model.eval(), tokenizer, spec, path, _eos_ids(model, tokenizer))
    try:
        model = auto_class.from_pretrained(path, **kwargs)
    except (OSError, ValueError, SafetensorError) as exc:
        # SafetensorError: a weights file cut short (an interrupted copy or download).
        raise DraftlabError(
            f"model '{spec.name}' could not be loaded from '{path}': {first_line(exc)}"
        ) from None
    if spec.device != "auto":
        model.to(spec.device)
    model.eval()
    storage = None
    if spec.dtype in STORAGES:
        storage = q4.attach_q8(model) if spec.dtype == Q8_STORAGE else q4.attach(model, spec.name)
        model.to(DTYPES[spec.dtype])
        if q4.all_blocks(model):  # a dense matrix left would round rows by their pass anyway
            attention.attend_by_rows(model)
    return LoadedModel(model, tokenizer, spec, path, _eos_ids(model, tokenizer), storage)


def _eos_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> set[int]:
    ids: set[int] = set()
    gen_eos = getattr(model.generation_config, "eos_token_id", None)
    for value in (gen_eos, tokenizer.eos_token_id):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(int(v) for v in value)
    return ids


def check_compatible(target: LoadedModel, draft: LoadedModel) -> None:
    """Speculative decoding compares distributions token by token: the ids must mean the same."""
    t_vocab, d_vocab = target.tokenizer.get_vocab(), draft.tokenizer.get_vocab()
    if len(t_vocab) != len(d_vocab) or t_vocab != d_vocab:
        differing = next((tok for tok, i in t_vocab.items() if d_vocab.get(tok) != i), None)
        detail = (
            f"{len(t_vocab)} vs {len(d_vocab)} tokens"
            if len(t_vocab) != len(d_vocab)
            else f"token {differing!r} has id {t_vocab.get(differing)} vs {d_vocab.get(differing)}"
        )
        raise DraftlabError(
            f"incompatible tokenizers: target '{target.spec.name}' and draft '{draft.spec.name}' "
            f"have different vocabularies ({detail})"
        )
    for role in SPECIAL_TOKENS:
        t_token, d_token = getattr(target.tokenizer, role, None), getattr(draft.tokenizer, role, None)
        if t_token is not None and d_token is not None and t_token != d_token:
            raise DraftlabError(
                f"incompatible tokenizers: target '{target.spec.name}' and draft '{draft.spec.name}' "
                f"have different {role.replace('_', ' ')}s ({t_token!r} vs {d_token!r})"
            )
    if target.is_encoder_decoder != draft.is_encoder_decoder:
        raise DraftlabError(
            f"incompatible models: target '{target.spec.name}' and draft '{draft.spec.name}' "
            "must both be decoder-only or both encoder-decoder"
        )


def needed_context(lm: LoadedModel, prompt_tokens: int, max_new_tokens: int) -> int:
    """Positions a generation uses: the prompt and every new token (an encoder holds the prompt only)."""
    return prompt_tokens + (0 if lm.is_encoder_decoder else max_new_tokens)


def check_context(
    target: LoadedModel, draft: LoadedModel | None, prompt_tokens: int, max_new_tokens: int
) -> None:
    """Refuse before generating when the target or the draft cannot hold the prompt and the new tokens.

    A draft with a shorter context than the target (a GPT-2 draft with n_positions 64) would
    otherwise fail mid-run with an IndexError in its position embeddings.
    """
    wants = f"a prompt of {prompt_tokens} tokens plus max_new_tokens={max_new_tokens}"
    limit = target.context_length
    if limit is not None and needed_context(target, prompt_tokens, max_new_tokens) > limit:
        raise DraftlabError(
            f"{wants} exceeds the model's context of {limit} tokens (target '{target.spec.name}')"
        )
    if draft is None or draft.context_length is None:
        return
    needed = needed_context(draft, prompt_tokens, max_new_tokens)
    if needed > draft.context_length:
        raise DraftlabError(
            f"draft '{draft.spec.name}' has a context of {draft.context_length} tokens, target "
            f"'{target.spec.name}' {limit if limit is not None else 'unlimited'}: {wants} needs {needed}"
        )
