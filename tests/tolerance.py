"""Float tolerances from the dtype's precision and the size of the computation, never a fixed 1e-9.

One bound covers the comparisons in these tests (Higham, *Accuracy and Stability of Numerical
Algorithms*, §3.1): a sum or dot product of n terms computed in a dtype with machine epsilon eps is
off by at most n·eps·Σ|terms|, whatever order the kernel sums in. That order is what differs
between CPUs: AVX2, AVX-512 and AMX kernels block a GEMM differently, and so do passes over 1, 3 or
9 tokens. Comparing two such results allows twice the bound; the bounds of chained steps add.
"""

from __future__ import annotations

import torch

EPS32 = torch.finfo(torch.float32).eps
EPS64 = torch.finfo(torch.float64).eps


def sum_tol(n: int, dtype: torch.dtype = torch.float32, scale: float = 1.0) -> float:
    """Two results of a sum of n terms of total magnitude `scale`, computed in different orders."""
    return 2 * n * torch.finfo(dtype).eps * scale


def reduction_length(config) -> int:
    """The longest chain of sums from the input embedding to a logit: per layer the attention over
    the context, the hidden and the MLP dot products, then the LM head's hidden dot product."""
    hidden = getattr(config, "hidden_size", None) or config.d_model
    inner = getattr(config, "intermediate_size", None) or getattr(config, "d_ff", None) or 4 * hidden
    layers = getattr(config, "num_hidden_layers", None) or config.num_layers
    context = getattr(config, "max_position_embeddings", None) or 512
    return layers * (context + 2 * hidden + inner) + hidden


def logits_tol(model, reference: torch.Tensor) -> float:
    """Logits of the same tokens from passes of other shapes (cached, batched, tree, full): the bound
    on sums as long as the model's longest reduction, scaled by the logits' size."""
    return sum_tol(reduction_length(model.config), torch.float32, max(1.0, float(reference.abs().max())))


def probs_tol(model, logits: torch.Tensor, temperature: float = 1.0) -> float:
    """Probabilities from those logits: softmax turns an absolute logit error d into a relative
    probability error of at most 2·d/T, and normalising over V cells adds V·eps."""
    return 2 * logits_tol(model, logits) / temperature + sum_tol(logits.shape[-1])


def assert_greedy_equal(lm, prompt_ids: list[int], got: list[int], want: list[int], what: str = "") -> None:
    """Greedy tokens of a method (`got`) equal plain decoding's (`want`), up to a near-tie.

    Over hundreds of tokens a random-initialised model meets positions whose top two logits lie
    within rounding of each other; another GEMM blocking (another CPU, or a pass over more tokens)
    may then pick the other one, and both continuations are the target's. So the sequences must be
    equal, or first differ where a full pass puts the two tokens within the logits' bound.
    """
    if got == want:
        return
    first = next((i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), None)
    assert first is not None, f"{what}: one is a prefix of the other ({len(got)} vs {len(want)} tokens)"
    model = lm.model
    with torch.no_grad():
        if lm.is_encoder_decoder:
            start = model.config.decoder_start_token_id
            start = model.config.pad_token_id if start is None else start
            decoder = torch.tensor([[start, *want[:first]]])
            logits = model(input_ids=torch.tensor([prompt_ids]), decoder_input_ids=decoder).logits[0, -1]
        else:
            logits = model(torch.tensor([prompt_ids + want[:first]])).logits[0, -1]
    logits = logits.float()
    gap = float(logits[want[first]] - logits[got[first]])
    bound = 2 * logits_tol(model, logits)
    assert abs(gap) <= bound, (
        f"{what}: differs from plain decoding at token {first} ({got[first]} vs {want[first]}), "
        f"where their logits are {gap:.3g} apart: no near-tie (bound {bound:.3g})"
    )


# Seeded chi-square tests draw other samples on another CPU (the probabilities round differently),
# so their thresholds are chosen for a known error rate, not for today's seeds. When the law holds,
# a p-value is uniform on [0, 1]: `p > FALSE_FAILURE` fails by chance with exactly that probability,
# and the suite's 7 such checks together fail a correct build in under 1% of draws.
FALSE_FAILURE = 1e-3
# A wrong rule must fall below this: a correct rule would, by chance, once in a million draws.
SHOWN_POWER = 1e-6
