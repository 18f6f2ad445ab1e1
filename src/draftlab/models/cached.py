"""A model and its KV cache: feed new tokens, read their logits, roll back with `crop`.

The decode loop sees every model as one growing token sequence. For a decoder-only model
that sequence starts with the prompt; for an encoder-decoder model the prompt goes through
the encoder once and the sequence starts with the decoder start token.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import statistics
import time
import weakref
from collections.abc import Callable
from types import SimpleNamespace

import torch
from transformers import DynamicCache, EncoderDecoderCache
from transformers.modeling_outputs import BaseModelOutput

from draftlab.errors import DraftlabError
from draftlab.models import attention, exact, q4
from draftlab.models.compiled import (
    MAX_PASS,
    PASS_SIZES,
    RESERVE,
    bucket_mask,
    capacity,
    compiled_steps,
    pads,
)
from draftlab.models.loading import LoadedModel


class CachedModel:
    def __init__(
        self, lm: LoadedModel, use_cache: bool = True, compiled: bool = False, exact: bool = False
    ) -> None:
        self.lm = lm
        self.model = lm.model
        self.device = lm.device
        self._cuda = lm.device.type == "cuda"
        self._cpu = lm.device.type == "cpu"
        self.use_cache = use_cache
        # Exact mode (models/exact.py): every pass over a static cache, padded to one measured width.
        self.exact = exact
        self._probing = False
        if exact and (not use_cache or lm.is_encoder_decoder):
            raise DraftlabError("--exact needs a decoder-only target with its KV cache on")
        # Passes of up to 8 tokens through a compiled package over a static cache (models/compiled.py);
        # in exact mode without --compile, the same passes run eagerly.
        self.compiled = compiled_steps(lm, eager=not compiled) if compiled or exact else None
        if compiled and (not use_cache or lm.is_encoder_decoder):
            raise DraftlabError("--compile needs a decoder-only target with its KV cache on")
        self.forward_calls = 0
        # Σ s inside the model's own forward (a compiled package's runner, or the eager module): the
        # pass itself; the rest of forward() makes its inputs (decode/loop.py splits a round by it).
        self.model_s = 0.0
        params = inspect.signature(self.model.forward).parameters
        self._keeps_logits = "logits_to_keep" in params
        # transformers 5.24 renamed `past_key_values` to `cache` (the old name warns on every call).
        self._cache_arg = "cache" if "cache" in params else "past_key_values"
        self._cache: DynamicCache | EncoderDecoderCache | None = None
        self._encoder_out: BaseModelOutput | None = None
        self._tokens: list[int] = []  # the sequence fed so far (needed without a cache)
        self._tree: TreeArea | None = None  # the token tree being fed, if any
        self.features: torch.Tensor | None = None  # the last forward's hidden states, when asked for
        # The argmax of the last forward's returned rows, where its pass made them (a compiled
        # package's, models/compiled.py); None after an eager pass.
        self.argmax: list[int] | None = None
        # Passes of up to MAX_PASS tokens read their ids from one buffer, filled through numpy:
        # right after a pass `torch.tensor` of three ids took 18 us, this 8.
        self._ids = torch.zeros((1, MAX_PASS), dtype=torch.long)
        self._ids_np = self._ids.numpy()
        self._ids_views = [self._ids[:, :n] for n in range(MAX_PASS + 1)]
        if self.compiled is not None:
            self.compiled.masked = self._takes_tree_masks()  # its packages then take trees' masks

    @functools.cached_property
    def row_exact(self) -> bool:
        """Whether every pass after the prompt scores each row with the bits of a one-token pass: a
        4-bit target (models/q4.py) attending by rows (models/attention.py). Its lossless methods
        then write plain decoding's tokens when the prompt, too, goes through alone (decode/loop.py)."""
        return attention.scores_rows_alone(self.lm)

    @property
    def length(self) -> int:
        """How many tokens of the sequence the model has already consumed."""
        return len(self._tokens)

    @torch.inference_mode()
    def start(self, prompt_ids: list[int]) -> list[int]:
        """Reset for a new prompt and return the sequence's prefix (nothing is fed yet)."""
        self._tokens = []
        self._tree = None
        self._encoder_out = None
        config = self.model.config
        if self.lm.is_encoder_decoder:
            ids = torch.tensor([prompt_ids], device=self.device)
            # The encoder runs once per generation; forward_calls counts decoder passes only.
            self._encoder_out = self.model.get_encoder()(input_ids=ids, return_dict=True)
            self._cache = (
                EncoderDecoderCache(DynamicCache(config=config), DynamicCache(config=config))
                if self.use_cache
                else None
            )
            start = config.decoder_start_token_id
            if start is None:
                start = config.pad_token_id
            return [int(start)]
        if self.compiled is not None:
            self._cache = self.compiled.new_cache(len(prompt_ids) + RESERVE)
            if self.exact and not self._probing:
                # Measured by `warm` before timed work; a caller who skipped it pays here.
                self.exact_width(capacity(self._cache))
        else:
            self._cache = DynamicCache(config=config) if self.use_cache else None
        return list(prompt_ids)

    @torch.inference_mode()
    def forward(
        self,
        new_ids: list[int],
        keep: int | None = None,
        tree: list[int] | None = None,
        features: tuple[int, ...] = (),
        pad_to: int | None = None,
    ) -> torch.Tensor:
        """Logits [k, V] for the k new tokens, or for only the last `keep` of them.

        Asking only for the rows that are needed skips the output layer on the others, which
        matters for a long prompt fed together with a proposal.

        `tree` gives the parents of the last len(tree) new tokens, which then form a token tree
        hanging from the token before them: one pass scores every branch, each node seeing the
        sequence and its own ancestors only (an additive 4D mask and explicit positions, as
        SpecInfer and Medusa verify trees). A parent index counts the nodes of the current tree
        (-1 is its root), so a draft can grow a tree level by level over several calls; a call
        that feeds chain tokens first starts a new tree. Until `keep_path` or `crop`, the cache
        holds every node fed.

        `features` names hidden-state layers (`output_hidden_states` indices) to keep for every new
        token, side by side in `self.features` [k, layers·H]: what an EAGLE head drafts from.

        `pad_to`: a static-cache pass of fewer tokens runs as one of that many rows (exact mode's
        width unless given).
        """
        start = len(self._tokens)
        width = self._exact_width_now()
        if width is not None and start > 0 and len(new_ids) > width and tree is None:
            return self._in_passes_of(width, new_ids, keep, features)
        self._tokens.extend(new_ids)
        if self.use_cache and len(new_ids) <= MAX_PASS and self._cpu:
            self._ids_np[0, : len(new_ids)] = new_ids
            feed = self._ids_views[len(new_ids)]
        elif self.use_cache:
            feed = torch.tensor([new_ids], device=self.device)
        else:
            feed = torch.tensor([self._tokens], device=self.device)
        kwargs: dict = {"use_cache": self.use_cache, self._cache_arg: self._cache}
        if features:
            kwargs["output_hidden_states"] = True
        keep = len(new_ids) if keep is None else min(keep, len(new_ids))
        if self._keeps_logits:
            kwargs["logits_to_keep"] = keep
        if tree is None:
            self._tree = None
        else:
            if not self.use_cache or self._encoder_out is not None:
                raise DraftlabError("token trees need a decoder-only model with a KV cache")
            n_chain = len(new_ids) - len(tree)
            if self._tree is None or n_chain > 0:
                self._tree = TreeArea(start + n_chain)
            mask, positions = self._tree.extend(start, n_chain, tree, self.model.dtype)
            kwargs["attention_mask"] = mask.to(self.device)
            kwargs["position_ids"] = positions.to(self.device)
        # After the prompt, a 4-bit target's passes of any length score rows as they would alone.
        rowwise = q4.rowwise() if start > 0 and self.row_exact else contextlib.nullcontext()
        cuda = self._cuda
        if cuda:  # the pass's time must not include work queued before it
            torch.cuda.synchronize(self.device)
        t0 = time.perf_counter()
        if self.compiled is not None:
            if pad_to is None:
                pad_to = width  # exact mode's, looked up above (None while warming or probing)
            ran = self.compiled.run_s
            with rowwise:
                out = self._static_forward(feed, kwargs, pad_to)
            if self.compiled.run_s > ran and not cuda:  # a package ran: only its runner's time is the pass
                t0 = time.perf_counter() - (self.compiled.run_s - ran)
        elif self._encoder_out is not None:
            out = self.model(encoder_outputs=self._encoder_out, decoder_input_ids=feed, **kwargs)
        else:
            with rowwise:
                out = self.model(input_ids=feed, **kwargs)
        if cuda:  # a CUDA call returns once its kernels are queued
            torch.cuda.synchronize(self.device)
        self.model_s += time.perf_counter() - t0
        self.forward_calls += 1
        if features:
            n = len(new_ids)
            self.features = torch.cat([out.hidden_states[i][0, -n:] for i in features], dim=-1)
        # A package's logits come as [n, V] with their argmax (models/compiled.py), an eager
        # model's as [1, n, V]; right after a pass each view costs tens of microseconds, so the
        # usual pass, which keeps every row, returns its logits as they are.
        logits = out.logits
        if logits.dim() == 3:
            logits = logits[0]
        made = getattr(out, "argmax", None)
        self.argmax = None if made is None else made.tolist()[-keep:]
        return logits if keep == logits.shape[0] else logits[-keep:]

    def _exact_width_now(self) -> int | None:
        """Exact mode's width for the current bucket, once measured (None otherwise)."""
        if not self.exact or self.compiled is None or self._cache is None or self._probing:
            return None
        return self.compiled.exact_widths.get(capacity(self._cache))

    def _in_passes_of(self, width: int, new_ids: list[int], keep: int | None, features: tuple[int, ...]):
        """A pass longer than exact mode's width, run as passes of that width: each row is then
        scored as in plain decoding, whatever the length of the whole."""
        logits, hidden, picks = [], [], []
        for i in range(0, len(new_ids), width):
            logits.append(self.forward(new_ids[i : i + width], features=features))
            picks.append(self.argmax)
            if features:
                hidden.append(self.features)
        if features:
            self.features = torch.cat(hidden)
        keep = len(new_ids) if keep is None else min(keep, len(new_ids))
        self.argmax = None if any(p is None for p in picks) else [i for p in picks for i in p][-keep:]
        return torch.cat(logits)[-keep:]

    def warm(
        self,
        needed: int,
        sizes: tuple[int, ...] = PASS_SIZES,
        on_pass: Callable[[int, int], None] | None = None,
    ) -> None:
        """Get the package of the static cache that holds `needed` ready now (untimed: compiled,
        about 1.5 min on 2 cores, or loaded from an earlier run), and run passes of these sizes
        once; `on_pass(cache length, size)` follows each."""
        if self.compiled is None:
            return
        saved = (self._tokens, self._cache, self._tree, self.forward_calls)
        try:
            self._tokens, self._tree = [], None
            self._cache = self.compiled.new_cache(needed)
            # An eager pass first, as a prompt is: it allocates the cache's tensors, which the
            # package's export takes its shapes from.
            self.forward([0] * (MAX_PASS + 1))
            self.crop(0)
            for size in sizes:
                self.forward([0] * size)
                self.crop(0)
                if on_pass:
                    on_pass(capacity(self._cache), size)
            if self.compiled.pad_single is None and not self.exact:
                self._choose_padding()
            if self.exact:
                self.exact_width(capacity(self._cache))
        finally:
            self._tokens, self._cache, self._tree, self.forward_calls = saved

    def _choose_padding(self, repeats: int = 11) -> None:
        """Time one-token passes as they are and padded to two (models/compiled.py `pads`),
        alternately, so that a machine slowing down or speeding up meanwhile weighs on both alike."""
        steps = self.compiled
        times: dict[bool, list[float]] = {False: [], True: []}
        for i in range(repeats + 1):
            for padded in (False, True):
                steps.pad_single = padded
                t0 = time.perf_counter()
                self.forward([0])
                if i:  # the first round warms both
                    times[padded].append((time.perf_counter() - t0) * 1000)
        self.crop(0)
        medians = {"one": statistics.median(times[False]), "padded": statistics.median(times[True])}
        steps.single_ms = {k: round(v, 2) for k, v in medians.items()}
        steps.pad_single = pads(medians["one"], medians["padded"])

    def _static_forward(self, feed: torch.Tensor, kwargs: dict, pad_to: int | None = None):
        """A pass over the static cache: compiled for up to MAX_PASS tokens, eager for a prompt.
        A token tree's mask spans the nodes fed so far; a static cache's attention spans its
        whole bucket, so the mask is widened to it (the slots past the tree masked)."""
        # Padding rows take slots too, until given back.
        needed = len(self._tokens) + max((pad_to or 1) - feed.shape[1], 0)
        if needed > capacity(self._cache):
            self._cache = kwargs[self._cache_arg] = self.compiled.grown(self._cache, needed)
        if "attention_mask" in kwargs:
            kwargs["attention_mask"] = bucket_mask(kwargs["attention_mask"], capacity(self._cache))
        # A prompt runs eagerly, and so does any pass before the cache holds keys (a prompt of up
        # to MAX_PASS tokens): the package takes the shapes of the cache's tensors.
        if feed.shape[1] > MAX_PASS or not self._cache.layers[0].is_initialized:
            return self.model(input_ids=feed, **kwargs)
        # The package returns the hidden states whatever was asked: an EAGLE head's passes and
        # plain ones share it, and the compiled profile prices what both run.
        out = self.compiled(
            self._cache, feed, kwargs.get("position_ids"), kwargs.get("attention_mask"), pad_to=pad_to
        )
        hidden = out.hidden_states if kwargs.get("output_hidden_states") else None
        return SimpleNamespace(logits=out.logits, argmax=out.argmax, hidden_states=hidden)

    @torch.inference_mode()
    def keep_path(self, base: int, path: list[int]) -> None:
        """After a tree pass whose nodes start at `base`: keep only the nodes in `path`, in order.

        The kept nodes' keys and values move down to base, base + 1, ... in every layer of the
        cache, and the rest is cropped, so the cache is that of the path fed alone.
        """
        tokens = [self._tokens[base + i] for i in path]
        if self._cache is not None and path != list(range(len(path))):
            src = torch.tensor([base + i for i in path], device=self.device)
            for layer in _cache_layers(self._cache):
                if layer.keys is None or layer.keys.numel() == 0:
                    continue
                dst = slice(base, base + len(path))
                layer.keys[..., dst, :] = layer.keys.index_select(-2, src.to(layer.keys.device))
                layer.values[..., dst, :] = layer.values.index_select(-2, src.to(layer.values.device))
        self.crop(base + len(path))
        self._tokens[base:] = tokens

    def supports_trees(self) -> bool:
        """Whether a tree pass scores each branch as that branch alone would be (checked once).

        Models whose positions come from the 2D mask (Bloom's ALiBi) or whose attention ignores a
        custom 4D mask fail this, and tree methods then fall back to chains. So do they in exact
        mode: a tree's nodes sit in other cache slots than their chain's (models/exact.py).
        """
        return self._takes_tree_masks() and not self.exact

    def _takes_tree_masks(self) -> bool:
        ok = _TREE_SUPPORT.get(self.model)
        if ok is None:
            ok = _TREE_SUPPORT[self.model] = self._check_trees()
        return ok

    def exact_width(self, bucket: int) -> int:
        """Exact mode's width in this static-cache bucket, measured the first time (a few seconds:
        passes of every length over a fixed sequence); a one-line error where no width is exact."""
        steps = self.compiled
        if bucket not in steps.exact_widths:
            saved = (self._tokens, self._cache, self._tree, self.forward_calls)
            self._probing = True
            try:
                self._cache = steps.new_cache(bucket)
                steps.exact_widths[bucket] = exact.choose_width(self, bucket, steps.exact_order)
            finally:
                self._probing = False
                self._tokens, self._cache, self._tree, self.forward_calls = saved
        width = steps.exact_widths[bucket]
        if width is None:
            raise DraftlabError(
                f"--exact: no pass width up to {MAX_PASS} makes '{self.lm.spec.name}' ({self.lm.spec.dtype}) "
                "score a pass of several tokens as one-token passes on this CPU; run without --exact"
            )
        return width

    def _check_trees(self) -> bool:
        """A tree pass must score each branch as a chain pass over that branch does, up to rounding.

        Rounding is what the same branch shows between a one-pass and a token-by-token chain
        (other GEMM shapes, so other kernels and summation orders), and at least 8·eps of the
        model's dtype times the logits' size. In bfloat16 with AVX2 kernels that is about 0.5 on
        logits near 30, where an ignored tree mask is off by about 18: a fixed 1e-3 took every
        bfloat16 tree there for a broken one.
        """
        if not self.use_cache or self.lm.is_encoder_decoder:
            return False
        # Checked eagerly over a dynamic cache: whether the model's attention honours a custom 4D
        # mask does not depend on the cache, and a compiled check would build a package here.
        saved = (self._tokens, self._cache, self._encoder_out, self.forward_calls, self.compiled)
        self.compiled = None
        vocab = int(self.lm.vocab_size)
        prefix = [(7 * i + 3) % vocab for i in range(5)]
        nodes = [(11 * i + 5) % vocab for i in range(4)]  # root -> a -> b, root -> c -> d
        parents = [-1, 0, -1, 2]

        def chain(tokens: list[int], one_pass: bool) -> torch.Tensor:
            self.start(prefix)
            self.forward(prefix[:-1])
            if one_pass:
                return self.forward(tokens).float()
            return torch.cat([self.forward([t]).float() for t in tokens])

        try:
            self.start(prefix)
            self.forward(prefix[:-1])
            tree = self.forward(prefix[-1:] + nodes, tree=parents).float()
            error = noise = scale = 0.0
            for branch in ([0, 1], [2, 3]):
                tokens = prefix[-1:] + [nodes[i] for i in branch]
                alone = chain(tokens, one_pass=True)
                rows = [0] + [i + 1 for i in branch]
                error = max(error, float((tree[rows] - alone).abs().max()))
                noise = max(noise, float((chain(tokens, one_pass=False) - alone).abs().max()))
                scale = max(scale, float(alone.abs().max()))
            eps = torch.finfo(next(self.model.parameters()).dtype).eps
            ok = error <= max(4 * noise, 8 * eps * max(scale, 1.0))
        except Exception:  # noqa: BLE001 - any failure of a custom mask means: no trees here
            ok = False
        finally:
            self._tokens, self._cache, self._encoder_out, self.forward_calls, self.compiled = saved
        return ok

    @torch.inference_mode()  # a static cache's length is a tensor made under inference mode
    def crop(self, length: int) -> None:
        """Forget everything after the first `length` tokens of the sequence."""
        self._tree = None
        crop_sequence(self._tokens, self._cache, length)


def crop_sequence(tokens: list[int], cache, length: int) -> bool:
    """Drop everything after the first `length` tokens from a sequence and its KV cache (transformers'
    own, rolled back with `crop`); whether anything was dropped."""
    drop = len(tokens) - length
    if drop <= 0:
        return False
    del tokens[length:]
    if cache is not None:
        cache.crop(-drop)  # transformers 5 takes the number of tokens to remove
    return True


def compiles(lm) -> bool:
    """Whether `lm`'s passes can run from compiled packages: a decoder-only transformers model (not
    another engine's, which brings its own passes, nor an encoder-decoder), or a model with a CPU
    package of its own (an EAGLE-3 head)."""
    if getattr(lm, "packaged", False):
        return lm.device.type == "cpu"
    return getattr(lm, "cached_model", None) is None and not lm.is_encoder_decoder


def draft_compiles(draft, target) -> bool:
    """Whether a draft model's passes can run compiled beside its compiled target: one that compiles
    and is not the target's own model object, whose static cache (one per bucket and model,
    models/compiled.py) the target's passes fill."""
    return compiles(draft) and getattr(draft, "model", None) is not getattr(target, "model", None)


def cached(lm, use_cache: bool = True, compiled: bool = False, exact: bool = False):
    """The cache-aware model the decode loop drives: a `CachedModel` for a transformers model, or
    the model's own (llama.cpp's) when it brings one, with the same start / forward / crop."""
    own = getattr(lm, "cached_model", None)
    if own is None:
        return CachedModel(lm, use_cache, compiled, exact)
    if compiled and not compiles(lm):
        raise DraftlabError(
            "--compile is for the hf engine (compiled transformers passes); llama.cpp runs its own kernels"
        )
    if exact:
        raise DraftlabError("--exact is for the hf engine (our own passes); llama.cpp runs its own kernels")
    return own(use_cache, compiled=True) if compiled else own(use_cache)


# Whether a model verifies trees exactly, per model object: every decoder built on it shares the check.
_TREE_SUPPORT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class TreeArea:
    """The nodes of one token tree in the cache: slots base, base + 1, ... in feeding order."""

    def __init__(self, base: int) -> None:
        self.base = base
        self.parents: list[int] = []
        self.depth: list[int] = []
        self.ancestors: list[list[int]] = []  # per node: its ancestors and itself

    def extend(
        self, past: int, n_chain: int, parents: list[int], dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Add nodes; the additive mask [1, 1, n, past + n] and positions [1, n] of this call's
        n = n_chain + len(parents) tokens: chain tokens first (causal), then the new nodes."""
        first = len(self.parents)
        size = first + len(parents)
        for i, p in enumerate(parents, start=first):
            if not -1 <= p < i:
                raise ValueError(f"tree node {i} has parent {p}: parents must come before their children")
            self.parents.append(p)
            self.depth.append(self.depth[p] + 1 if p >= 0 else 1)
            self.ancestors.append((self.ancestors[p] if p >= 0 else []) + [i])
        n_new = n_chain + len(parents)
        allowed = torch.ones(n_new, past + n_new, dtype=torch.bool).tril(diagonal=past)
        for j in range(first, size):
            r = n_chain + j - first
            allowed[r, self.base :] = False
            allowed[r, [self.base + a for a in self.ancestors[j]]] = True
        mask = torch.zeros(n_new, past + n_new, dtype=dtype)
        mask.masked_fill_(~allowed, torch.finfo(dtype).min)
        positions = list(range(past, past + n_chain)) + [
            self.base - 1 + self.depth[j] for j in range(first, size)
        ]
        return mask[None, None], torch.tensor([positions])


def _cache_layers(cache):
    if isinstance(cache, EncoderDecoderCache):
        cache = cache.self_attention_cache
    return cache.layers
