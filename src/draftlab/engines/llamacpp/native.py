"""llama.cpp's own speculative decoding (llama-cpp-python's prompt lookup) behind draftlab's interface,
as a reference peer: what a llama.cpp user gets without draftlab, as `hf-assisted` is for transformers.

llama-cpp-python 0.3.36 drives it from `Llama.generate`: after each sampled token its draft model
(`LlamaPromptLookupDecoding`: the continuation of the longest n-gram of the sequence found earlier in
it) proposes tokens, one pass evaluates the token and the proposal, and each position is sampled in
turn, keeping drafts while they equal the sample. That keeps the output exactly the target's (the
sample is the target's) but, unlike the speculative-sampling rule, accepts a draft under sampling
only when the sample happens to equal it. It needs logits for every position (`logits_all`), so the
peer runs its own `Llama` over the same GGUF: weights are memory-mapped and shared, the KV cache and
the scores buffer (n_ctx × vocabulary floats) are its own.
"""

from __future__ import annotations

from draftlab.decode.stats import Generation, GenerationStats
from draftlab.decode.timing import synchronized_clock
from draftlab.sampling import SamplingParams


class _Counted:
    """Counts the passes of a Llama (its `eval` calls) and the tokens its draft model proposed."""

    def __init__(self) -> None:
        self.passes = 0
        self.drafted = 0


def _lookup_class():
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding  # noqa: PLC0415

    class CountingLookup(LlamaPromptLookupDecoding):
        def __init__(self, counted: _Counted, max_ngram_size: int, num_pred_tokens: int) -> None:
            super().__init__(max_ngram_size=max_ngram_size, num_pred_tokens=num_pred_tokens)
            self.counted = counted

        def __call__(self, input_ids, *args, **kwargs):
            proposal = super().__call__(input_ids, *args, **kwargs)
            self.counted.drafted += len(proposal)
            return proposal

    return CountingLookup


class LlamaCppLookupDecoder:
    """`Llama.generate` with `LlamaPromptLookupDecoding`, timed and counted like every method."""

    def __init__(self, lm, max_ngram: int, num_pred_tokens: int) -> None:
        import llama_cpp  # noqa: PLC0415

        from draftlab.engines.llamacpp.load import open_llama  # noqa: PLC0415

        self.lm = lm
        self.counted = _Counted()
        lookup = _lookup_class()(self.counted, max_ngram, num_pred_tokens)
        self.llm = open_llama(
            llama_cpp,
            lm.path,
            lm.spec.name,
            lm.context_length,
            lm.threads,
            logits_all=True,
            draft_model=lookup,
        )
        evaluate = self.llm.eval

        def counted_eval(tokens):
            self.counted.passes += 1
            return evaluate(tokens)

        self.llm.eval = counted_eval  # Llama.generate calls self.eval once per pass

    def generate(self, prompt_ids: list[int], max_new_tokens: int, params: SamplingParams) -> Generation:
        llm, counted, eos = self.llm, self.counted, self.lm.eos_token_ids
        # A cache of the last prompt would make its prefill free on a repeat: every run starts cold.
        llm.reset()
        counted.passes = counted.drafted = 0
        if params.greedy:
            sampling = {"temp": 0.0}
        else:
            if params.seed is not None:
                llm.set_seed(params.seed)
            # Only what SamplingParams sets: llama-cpp-python's own defaults (min_p 0.05, top_k 40)
            # would change the law.
            sampling = {
                "temp": params.temperature,
                "top_k": params.top_k or 0,
                "top_p": params.top_p,
                "min_p": 0.0,
                "typical_p": 1.0,
                "repeat_penalty": 1.0,
            }
        tokens: list[int] = []
        t0 = synchronized_clock([self.lm.device])
        first = None
        stream = llm.generate(list(prompt_ids), reset=True, **sampling)
        try:
            for token in stream:
                if first is None:
                    first = synchronized_clock([self.lm.device])
                tokens.append(int(token))
                if token in eos or len(tokens) >= max_new_tokens:
                    break
        finally:
            stream.close()
        t_end = synchronized_clock([self.lm.device])
        first = t_end if first is None else first
        rounds = counted.passes
        stats = GenerationStats(
            prompt_tokens=len(prompt_ids),
            dtype=self.lm.spec.dtype,
            new_tokens=len(tokens),
            prefill_s=first - t0,
            first_tokens=min(1, len(tokens)),
            decode_s=t_end - first,
            target_calls=rounds,
            rounds=rounds,
            # Each pass yields one sampled token plus the drafts kept before it.
            drafted=counted.drafted,
            accepted=max(0, len(tokens) - rounds),
            draft_tokens_kept=max(0, len(tokens) - rounds),
        )
        return Generation(tokens, self.lm.tokenizer.decode(tokens, skip_special_tokens=True), stats)
