"""Adding an engine needs no edit of draftlab: an object with the `Engine` members, registered from
anywhere (here this test module), gets its option, runs beside our loop in `draftlab bench`, and
appears in the report."""

from __future__ import annotations

import json
import time

import pytest
import torch
from helpers import QUIET, check_error, write_suite

from draftlab import engines
from draftlab.bench.runner import Variant
from draftlab.cli import main
from draftlab.decode.stats import Generation, GenerationStats
from draftlab.engines.base import BenchRequest, EngineVariants
from draftlab.errors import DraftlabError


class Recompute:
    """Greedy decoding that runs the whole sequence through the model at every step: slow, and
    plainly the target's own tokens."""

    def __init__(self, lm):
        self.lm = lm

    @torch.no_grad()
    def generate(self, prompt_ids, max_new_tokens, params) -> Generation:
        ids, times = list(prompt_ids), []
        for _ in range(max_new_tokens):
            start = time.perf_counter()
            logits = self.lm.model(torch.tensor([ids])).logits[0, -1]
            ids.append(int(logits.argmax()))
            times.append(time.perf_counter() - start)
            if ids[-1] in self.lm.eos_token_ids:
                break
        new = ids[len(prompt_ids) :]
        stats = GenerationStats(
            prompt_tokens=len(prompt_ids),
            new_tokens=len(new),
            prefill_s=times[0],
            first_tokens=1,
            decode_s=sum(times[1:]),
            target_calls=len(new),
            rounds=len(new),
        )
        return Generation(new, self.lm.tokenizer.decode(new), stats)


class ToyEngine:
    name = "toy"
    suffix = "@toy"
    help = "a toy engine from a test module: plain greedy decoding by recomputation"
    default_methods = "ar"
    reads_weights = False
    predictable = True
    compiles = False
    batches = False

    def counterpart(self, spec):
        return "" if spec.name == "ar" else None

    def add_args(self, group):
        group.add_argument("--toy-note", default="plain", help="toy: a note recorded with its variants")

    def check_args(self, args, engines_run):
        if args.toy_note == "loud":
            raise DraftlabError("--toy-note must not be 'loud'")

    def methods(self, args):
        return self.default_methods

    def load_pair(self, args, need_draft, engines_run, plan=None):
        return None

    def joins(self, args, engines_run, target):
        return []

    def absent(self, target):
        return None

    def bench_variants(self, request: BenchRequest) -> EngineVariants:
        config = request.configs["ar"]
        params = {**config.settings(), "engine": self.name, "note": request.args.toy_note}
        label = "ar" + self.suffix
        variant = Variant(
            label, config, request.target, None, request.sampling, params, _decoder=Recompute(request.target)
        )
        return EngineVariants([variant], {label: label}, {"toy": {"note": request.args.toy_note}})


@pytest.fixture()
def toy_engine():
    engines.register(ToyEngine())
    yield "toy"
    engines.unregister("toy")


def test_an_engine_registered_from_outside_runs_beside_ours_in_bench(tiny_pair, tmp_path, capsys, toy_engine):
    target, _ = tiny_pair["llama"]
    suite = write_suite(
        tmp_path / "suite.jsonl", [{"id": "q1", "category": "qa", "prompt": "the cat sat on"}]
    )
    out = tmp_path / "run"
    argv = ["bench", "--target", str(target), "--dtype", "float32", "--suite", str(suite), "--full"]
    argv += ["--engines", f"hf,{toy_engine}", "--methods", "ar", "--max-new-tokens", "10", "--toy-note", "hi"]
    argv += ["--ar-dtypes", "none"]
    assert main([*argv, "--out", str(out), *QUIET]) == 0
    capsys.readouterr()
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    tokens = {r["label"]: r["tokens"] for r in records}
    assert set(tokens) == {"ar", "ar@toy"}
    assert tokens["ar@toy"] == tokens["ar"]  # float32 greedy: the same target, the same tokens
    run = json.loads((out / "run.json").read_text())
    assert run["extra"]["engines"] == ["hf", "toy"] and run["extra"]["toy"] == {"note": "hi"}
    assert run["extra"]["variants"]["ar@toy"]["note"] == "hi"
    assert "ar@toy" in (out / "report.md").read_text()


def test_a_registered_engines_option_is_checked_before_anything_loads(tiny_pair, capsys, toy_engine):
    target, _ = tiny_pair["llama"]
    argv = ["bench", "--target", str(target), "--engines", f"hf,{toy_engine}", "--toy-note", "loud"]
    check_error(capsys, argv, "--toy-note", "loud")


def test_a_method_the_engine_lacks_is_refused(tiny_pair, capsys, toy_engine):
    target, _ = tiny_pair["llama"]
    argv = ["bench", "--target", str(target), "--engines", toy_engine, "--methods", "pld"]
    check_error(capsys, argv, "pld", "toy")
