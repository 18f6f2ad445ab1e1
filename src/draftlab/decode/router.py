"""Per-request dtype choice: run each generation with the copy of the target predicted fastest for it.

On a CPU with native bfloat16 the dtypes cross over: bfloat16 prefills a long prompt twice as fast
as float32 and verifies 8 drafts for the price of about one step, while float16 or float32 decode
one token about 7% faster. No single dtype is fastest for every prompt, so a speculative method
holds the target in each candidate dtype and predicts, before each generation, its time in each:
prefill(prompt) + new tokens / expected rate, the rate coming from the cost curve and the
acceptance learned so far (shared by all copies). Every copy decodes losslessly for its own dtype.
"""

from __future__ import annotations

from draftlab.decode.loop import SpeculativeDecoder
from draftlab.decode.stats import Generation
from draftlab.sampling import SamplingParams


class DtypeRouter:
    def __init__(self, decoders: dict[str, SpeculativeDecoder]) -> None:
        if any(d.sizer is None for d in decoders.values()):
            raise ValueError("every routed decoder needs a round sizer (its cost model)")
        self.decoders = decoders

    def predicted_ms(self, dtype: str, prompt_tokens: int, max_new_tokens: int) -> float:
        sizer = self.decoders[dtype].sizer
        assert sizer is not None
        middle = prompt_tokens + max_new_tokens // 2
        prefill = sizer.cost.target.prefill(prompt_tokens)
        return prefill + (max_new_tokens - 1) / sizer.tokens_per_ms(middle)

    def choose(self, prompt_tokens: int, max_new_tokens: int) -> str:
        return min(self.decoders, key=lambda d: self.predicted_ms(d, prompt_tokens, max_new_tokens))

    def generate(self, prompt_ids: list[int], max_new_tokens: int, params: SamplingParams) -> Generation:
        dtype = self.choose(len(prompt_ids), max_new_tokens)
        out = self.decoders[dtype].generate(prompt_ids, max_new_tokens, params)
        out.stats.dtype = dtype
        return out
