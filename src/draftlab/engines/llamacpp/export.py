"""Write a transformers Llama-family checkpoint as a GGUF that llama.cpp runs: the shipped draft's
way onto `--engine llamacpp`.

The file holds what llama.cpp's `llama` architecture reads: the hyperparameters under `llama.*`,
the tensors under llama.cpp's names, and the tokenizer. The tokenizer's fields are copied from a
reference GGUF that shares the model's vocabulary (by default the target's own), checked token by
token against the Hugging Face tokenizer when llama.cpp loads the result.

Two facts the layout rests on (read in the GGUF specification and in how transformers' own GGUF
loader undoes them):
* llama.cpp's llama rotary embedding pairs dimension 2i with 2i + 1 of each head, where transformers
  pairs i with i + d/2; so the rows of q_proj (per query head) and k_proj (per key/value head) are
  reordered to interleave the two halves.
* GGUF lists a tensor's dimensions fastest-first, the reverse of torch; `GGUFWriter` reverses a
  numpy array's shape itself, so tensors are written in torch's row-major layout.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from draftlab.errors import DraftlabError
from draftlab.models.loading import LoadedModel

# --outtype: the matrices' storage (norms always stay float32), with llama.cpp's file type number.
# The storage also picks llama.cpp's kernels, hence the cost of a verification pass: on our CPUs
# Q4_0 (repacked for AVX2/AVX-512 at load) and BF16 verify 4 tokens for 1.3-1.6x a 1-token pass,
# Q4_1 and Q8_0 for 2.2-2.9x (docs/engines.md). Q4_0 is the gguf package's plain rounding and
# loses more than the others (`draftlab models export-gguf` prints the top-1 agreement).
OUTTYPES = {
    "f32": ("F32", 0),
    "f16": ("F16", 1),
    "bf16": ("BF16", 32),
    "q8_0": ("Q8_0", 7),
    "q4_0": ("Q4_0", 2),
}
LAYER_TENSORS = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


@dataclass(frozen=True)
class ExportInfo:
    path: str
    outtype: str
    tensors: int
    parameters: int
    bytes: int


def interleave_rope_rows(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """Reorder each head's rows from [first half, second half] to pairs (h0, h(d/2)), (h1, ...)."""
    rows, cols = weight.shape
    head_dim = rows // heads
    return weight.reshape(heads, 2, head_dim // 2, cols).transpose(1, 2).reshape(rows, cols)


def _check_supported(config) -> None:
    if config.model_type != "llama":
        raise DraftlabError(
            f"GGUF export supports Llama-architecture models (model_type 'llama'); this one is "
            f"'{config.model_type}'"
        )
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    if rope.get("rope_type", "default") != "default":
        raise DraftlabError(
            f"GGUF export supports plain rotary embeddings, not '{rope.get('rope_type')}' scaling"
        )
    if getattr(config, "attention_bias", False) or getattr(config, "mlp_bias", False):
        raise DraftlabError("GGUF export supports Llama models without attention or MLP biases")


def _rope_theta(config) -> float:
    rope = getattr(config, "rope_parameters", None) or {}
    return float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0)))


def _copy_tokenizer(writer, reference: Path) -> None:
    """Every `tokenizer.*` field of the reference GGUF, with its value types."""
    from gguf import GGUFReader, GGUFValueType  # noqa: PLC0415

    found = False
    for name, field in GGUFReader(reference).fields.items():
        if not name.startswith("tokenizer."):
            continue
        found = True
        kind = GGUFValueType(field.types[0])
        sub = GGUFValueType(field.types[1]) if kind == GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), kind, sub_type=sub)
    if not found:
        raise DraftlabError(f"reference GGUF '{reference}' holds no tokenizer to copy")


def export_gguf(lm: LoadedModel, out: Path, reference: Path, outtype: str = "f16") -> ExportInfo:
    """Write `lm` (a transformers Llama) to `out` with the tokenizer of the GGUF `reference`."""
    from gguf import GGMLQuantizationType, GGUFWriter, quants  # noqa: PLC0415

    if outtype not in OUTTYPES:
        raise DraftlabError(f"--outtype must be one of {', '.join(OUTTYPES)}, got '{outtype}'")
    config = lm.model.config
    _check_supported(config)
    qtype_name, file_type = OUTTYPES[outtype]
    qtype = GGMLQuantizationType[qtype_name]
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    state = {k: v.detach().to(torch.float32).cpu() for k, v in lm.model.state_dict().items()}
    tied = bool(getattr(config, "tie_word_embeddings", False))

    tensors: list[tuple[str, torch.Tensor]] = [("token_embd.weight", state["model.embed_tokens.weight"])]
    for i in range(config.num_hidden_layers):
        for hf, ours in LAYER_TENSORS.items():
            weight = state[f"model.layers.{i}.{hf}"]
            if hf.startswith("self_attn.q_proj"):
                weight = interleave_rope_rows(weight, heads)
            elif hf.startswith("self_attn.k_proj"):
                weight = interleave_rope_rows(weight, kv_heads)
            tensors.append((f"blk.{i}.{ours}", weight))
    tensors.append(("output_norm.weight", state["model.norm.weight"]))
    if not tied:
        tensors.append(("output.weight", state["lm_head.weight"]))

    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(f"{out.name}.{os.getpid()}.partial")  # two processes never share one
    writer = GGUFWriter(partial, "llama")
    writer.add_name(Path(lm.spec.name).name)
    writer.add_context_length(int(config.max_position_embeddings))
    writer.add_embedding_length(int(config.hidden_size))
    writer.add_block_count(int(config.num_hidden_layers))
    writer.add_feed_forward_length(int(config.intermediate_size))
    writer.add_head_count(int(heads))
    writer.add_head_count_kv(int(kv_heads))
    writer.add_key_length(int(head_dim))
    writer.add_value_length(int(head_dim))
    writer.add_rope_dimension_count(int(head_dim))
    writer.add_rope_freq_base(_rope_theta(config))
    writer.add_layer_norm_rms_eps(float(config.rms_norm_eps))
    writer.add_vocab_size(int(config.vocab_size))
    writer.add_file_type(file_type)
    _copy_tokenizer(writer, reference)
    parameters = 0
    for name, weight in tensors:
        parameters += weight.numel()
        array = weight.numpy()
        if weight.dim() == 1 or qtype == GGMLQuantizationType.F32:
            writer.add_tensor(name, array.astype(np.float32))
        elif qtype == GGMLQuantizationType.F16:
            writer.add_tensor(name, array.astype(np.float16))
        else:
            writer.add_tensor(name, quants.quantize(array, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    partial.replace(out)
    return ExportInfo(str(out), outtype, len(tensors), parameters, out.stat().st_size)
