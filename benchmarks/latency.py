"""Inference latency of every method on the same prompts, side by side in one run.

    python benchmarks/latency.py --samples 3 --repeats 10 --new-tokens 16 --json scratch/latency.json

One model load; each method is installed, timed, and removed in turn, on the same MDQA-style
prompts (10 Natural Questions passages, about 1.5k tokens with SmolLM2's tokenizer). Two
workloads per method, prompt and repeat: the prefill (one forward over the prompt, logits at
its last position only) and the cached generation of exactly ``--new-tokens`` tokens greedily
with a KV cache (end-of-sequence is ignored so every method does the same amount of work).
Methods are interleaved per prompt and repeat (A B C ..., then the reverse order on the
next repeat), so a burst of load on a shared machine hits them alike; CUDA is synchronised
around every timed call. For each method and workload the table gives the median time per
sample (median over repeats, then over samples) with the 10-90 % spread over repeats, and
the median of the paired ratios to vanilla (same prompt, same repeat) with their 10-90 %
spread. At least 10 repeats.

The paper's H100 ratios to vanilla (Llama-2-7B): Ms-PoE 1.45x, MoICE 2.42x,
Attention Buckets 4.76x, LPES 1.00x.

Methods are named by their label in the table of methods (``lpes_harness.methods.METHODS``), which
is what the leaderboard reads back; ``--methods`` also takes the table's keys (``poshidden,fitm``).
The three rivals run as their lm-eval models do: positional hidden-state scaling with the channel of
``--poshidden-setting`` (latency does not depend on which channel), Found in the Middle with its
K dummy copies as rows of one batch and its own decoding step, STRING at ``--string-offset`` (its
default, a third of the trained length, is past these prompts' length, where no distance is shifted).
LPES's base and both scaling, and PI at those scalings ("PI base", "PI both", the names the leaderboard
looks them up by), run a stand-in curve. A method that refuses the model (MoICE on Gemma-3) is left out
of the run, with its reason printed and kept in the ``--json`` file's ``refused``.

``--setting METHOD:ARGS`` (repeatable) also times a method at other parameters, as a row of a board ran it
(``--setting "fitm:spans_per_copy=10,temperature=5e-05,strength=0.5"``: one dummy copy, 2 forwards a token
instead of 11); its line is named ``LABEL (ARGS)`` and the ``--json`` file's ``settings`` says what it ran,
so that the leaderboard gives such a row its own ratio instead of its method's at its defaults.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
import warnings

from lpes_harness.evaluation.leaderboard import latency_label
from lpes_harness.core.files import atomic_write_json
from lpes_harness.core.models import machine_description, positive_int
import torch

PAPER_RATIOS = {"Ms-PoE": 1.45, "MoICE": 2.42, "Buckets": 4.76, "LPES": 1.00}
# Every method of the table of methods, each RoPE scaling once, named as the leaderboard looks a row up
# (latency_label: its method's label, and PI at base / both scaling as "PI base" / "PI both").
PI_BASE, PI_BOTH = latency_label("PI", "base"), latency_label("PI", "both")
METHODS = ("vanilla", "LPES", "LPES base", "LPES both", "PI", PI_BASE, PI_BOTH, "Ms-PoE", "Buckets", "MoICE",
           "Positional hidden-state scaling", "Found in the Middle", "STRING", "PCD")
# The methods with parameters of their own, which --setting may time at other values than their defaults.
SETTABLE = ("Ms-PoE", "Buckets", "MoICE", "Positional hidden-state scaling", "Found in the Middle", "STRING", "PCD")


def mdqa_prompts(n: int, num_docs: int = 10, seed: int = 0) -> list[str]:
    """MDQA-shaped prompts: one question's gold passage among other questions' passages."""
    from lpes_harness.tasks import mdqa
    from lpes_harness.tasks.data import find_shared_file, read_jsonl

    records = read_jsonl(find_shared_file(mdqa.DEFAULT_DATA_FILE), mdqa.REQUIRED_KEYS)
    rng = random.Random(seed)
    prompts = []
    for index in rng.sample(range(len(records)), n):
        others = rng.sample([i for i in range(len(records)) if i != index], num_docs - 1)
        documents = [records[i]["ctxs"][0] for i in others]
        documents.insert(rng.randrange(num_docs), records[index]["ctxs"][0])
        prompts.append(
            mdqa.PROMPT_TEMPLATE.format(
                search_results=mdqa.format_documents(documents), question=records[index]["question"]
            )
        )
    return prompts


def stand_in_curve(n_layers: int) -> list[float]:
    """Latency does not depend on the values, only on scales != 1: a smooth curve from 1 to 1.8."""
    return [1.0 + 0.8 * i / max(1, n_layers - 1) for i in range(n_layers)]


def lpes_scales(path: str | None, n_layers: int) -> list[float]:
    if path:
        from lpes_harness.core.scales_file import read_scales_file

        return list(read_scales_file(path))
    return stand_in_curve(n_layers)


def method_names(text: str) -> list[str]:
    """``--methods``: labels of the table of methods, or its keys, -> labels (unknown names kept, refused later)."""
    from lpes_harness.methods import METHODS as TABLE

    names = [m.strip() for m in text.split(",") if m.strip()]
    return [TABLE[m].label if m in TABLE else m for m in names]


def parse_setting(text: str) -> tuple[str, str, dict]:
    """``--setting METHOD:ARGS`` -> (its line's name, the method's label, its arguments as lm-eval parses them).
    METHOD: a key or label of the table of methods with arguments of its own (not LPES or PI: their curve
    is ``--lpes-scales``)."""
    from lm_eval.utils import simple_parse_args_string

    from lpes_harness.methods import METHODS as TABLE

    method, sep, args = (part.strip() for part in text.partition(":"))
    label = TABLE[method].label if method in TABLE else method
    if not sep or not args or label not in SETTABLE:
        raise ValueError(f"--setting {text!r}: give METHOD:KEY=VALUE,... with METHOD one of "
                         f"{', '.join(sorted(SETTABLE))} (or its key in the table of methods)")
    arguments = simple_parse_args_string(args)
    check_setting(label, arguments)
    return f"{label} ({args})", label, arguments


def check_setting(label: str, arguments: dict) -> None:
    """A ``--setting``'s arguments checked as its lm-eval model checks ``--model_args``, before the model loads
    (ValueError): a name its method does not take, and a value its ``check_arguments`` refuses. Else a typo would
    show as a TypeError at install, and a bad value as the method refusing the model."""
    import inspect

    from lpes_harness.methods import METHODS as TABLE
    from lpes_harness.methods import poshidden
    from lpes_harness.core.rope_anatomy import LPESError

    module = next(entry for entry in TABLE.values() if entry.label == label).load()
    # Positional hidden-state scaling takes its setting file too: resolve_arguments names and checks all four.
    takes = poshidden.resolve_arguments if module is poshidden else module.install
    names = [name for name in inspect.signature(takes).parameters if name != "model"]
    unknown = sorted(set(arguments) - set(names))
    if unknown:
        raise ValueError(f"--setting {label!r}: {label} takes no {', '.join(unknown)}; its arguments: {', '.join(names)}")
    check = takes if module is poshidden else getattr(module, "check_arguments", None)
    if check is not None:
        checked = inspect.signature(check).parameters
        try:
            check(**{name: value for name, value in arguments.items() if name in checked})
        except LPESError as err:  # MethodError and the checks it shares with LPES
            raise ValueError(f"--setting {label!r}: {err}") from None


def make_methods(model, tokenizer, scales: list[float], gates: str | None, poshidden_setting: str | None,
                 string_offset: int, settings: tuple[str, ...] = ()):
    """name -> (install, remove, next_logits) on the one loaded model: every method at its defaults, then
    each ``--setting`` (:func:`parse_setting`) under its own name."""
    from lpes_harness.core import rope
    from lpes_harness.methods import buckets, fitm, moice, mspoe, pcd, poshidden, string_shift
    from lpes_harness.core.models import cache_keyword

    def plain_next_logits(ids, mask, positions, cache):
        out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1,
                    **{cache_keyword(model): cache})
        return out.logits[:, -1]

    def bucket_next_logits(ids, mask, positions, cache):
        return buckets.forward_logits(model, ids, mask, positions, cache, last_only=True)

    def fitm_next_logits(ids, mask, positions, cache):
        return fitm.forward_logits(model, ids, mask, positions, cache, last_only=True)

    def pcd_next_logits(ids, mask, positions, cache):
        return pcd.forward_logits(model, ids, mask, positions, cache, last_only=True)

    def none(_model=None):
        return None

    dummy_ids = tokenizer(fitm.DUMMY_TEXT, add_special_tokens=False)["input_ids"]

    def installed(module, next_logits, **arguments):
        return lambda: module.install(model, **arguments), lambda: module.remove(model), next_logits

    def hidden_scaling(**arguments):
        # A setting file names the channel, band and factor; its own arguments override it, as poshidden_hf's.
        hidden = poshidden.resolve_arguments(**arguments)
        return installed(poshidden, plain_next_logits, channels=hidden["channels"], factor=hidden["factor"],
                         layers=hidden["layers"])

    # label -> arguments -> (install, remove, next_logits), for the methods a --setting may set.
    settable = {
        "Ms-PoE": lambda **a: installed(mspoe, plain_next_logits, **a),
        "Buckets": lambda **a: installed(buckets, bucket_next_logits, **a),
        "MoICE": lambda **a: installed(moice, plain_next_logits, **{"gates": gates, **a}),
        "Positional hidden-state scaling": hidden_scaling,
        "Found in the Middle": lambda **a: installed(fitm, fitm_next_logits, dummy_ids=dummy_ids, **a),
        "STRING": lambda **a: installed(string_shift, plain_next_logits, **{"shifted_offset": string_offset, **a}),
        "PCD": lambda **a: installed(pcd, pcd_next_logits, **a),
    }
    assert set(settable) == set(SETTABLE)

    def lpes(factors, scaling="position"):
        return lambda: rope.install(model, factors, scaling), lambda: rope.remove(model), plain_next_logits

    pi = [sum(scales) / len(scales)] * len(scales)
    # Base and both scaling: the stand-in curve (a position scales file says nothing about a base curve).
    base = stand_in_curve(len(scales))
    return {
        "vanilla": (none, none, plain_next_logits),
        "LPES": lpes(scales),
        "LPES base": lpes(base, "base"),
        "LPES both": lpes(base + base, "both"),
        "PI": lpes(pi),
        PI_BASE: lpes([1.8] * len(scales), "base"),
        PI_BOTH: lpes([1.8] * (2 * len(scales)), "both"),
        "Ms-PoE": settable["Ms-PoE"](),
        "Buckets": settable["Buckets"](),
        "MoICE": settable["MoICE"](),
        "Positional hidden-state scaling": hidden_scaling(setting=poshidden_setting,
                                                          channels=None if poshidden_setting else "0"),
        "Found in the Middle": settable["Found in the Middle"](),
        "STRING": settable["STRING"](),
        "PCD": settable["PCD"](),
    } | {name: settable[label](**arguments) for name, label, arguments in map(parse_setting, settings)}


def synchronize(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def time_prefill(model, next_logits, input_ids) -> float:
    """One forward over the prompt (a fresh cache), as the first step of generation does it."""
    from transformers import DynamicCache

    mask = torch.ones_like(input_ids)
    positions = torch.arange(input_ids.shape[1], device=input_ids.device)[None]
    synchronize(input_ids.device)
    start = time.perf_counter()
    with torch.no_grad():
        next_logits(input_ids, mask, positions, DynamicCache(config=model.config))
    synchronize(input_ids.device)
    return time.perf_counter() - start


def time_generation(model, next_logits, input_ids, new_tokens: int) -> float:
    from transformers import DynamicCache

    from lpes_harness.methods.decoding import greedy_generate

    synchronize(input_ids.device)
    start = time.perf_counter()
    with torch.no_grad():
        out = greedy_generate(
            next_logits, lambda: DynamicCache(config=model.config), input_ids, None, input_ids.shape[1] + new_tokens
        )
    synchronize(input_ids.device)
    elapsed = time.perf_counter() - start
    assert out.shape[1] == input_ids.shape[1] + new_tokens
    return elapsed


def spread(values: list[float]) -> dict:
    """Median and the 10-90 % spread (shared with the other benchmarks)."""
    from lpes_harness.evaluation.stats import median_spread

    return median_spread(values)


WORKLOADS = ("prefill", "generate")


def format_table(summary: dict) -> str:
    lines = [
        "| method | workload | median s / sample (10-90 %) | paired ratio to vanilla (10-90 %) | paper (H100) |",
        "|---|---|---:|---:|---:|",
    ]
    for name, rows in summary.items():
        paper = PAPER_RATIOS.get(name)
        for work in WORKLOADS:
            row = rows[work]
            t, r = row["seconds"], row["paired_ratio"]
            lines.append(
                f"| {name} | {work} | {t['median']:.3f} ({t['p10']:.3f}-{t['p90']:.3f}) "
                f"| {r['median']:.3f}x ({r['p10']:.3f}-{r['p90']:.3f}) "
                f"| {f'{paper:.2f}x' if paper and work == 'generate' else '-'} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pretrained", default=None, help="model (default: the bundled SmolLM2 GGUF)")
    parser.add_argument("--gguf-file", default=None)
    parser.add_argument("--samples", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=10, help="timed repeats per method and prompt (at least 10)")
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--num-docs", type=int, default=10)
    parser.add_argument("--methods", default=",".join(METHODS),
                        help=f"comma-separated subset of {', '.join(METHODS)} (or the table of methods' keys)")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"),
                        help="the model's dtype (default float32: a GGUF's packed kernels compute in float32)")
    parser.add_argument("--lpes-scales", default=None,
                        help="a position scales file for LPES and PI (default: a stand-in curve; base and both "
                             "scaling always time the stand-in curve)")
    parser.add_argument("--moice-gates", default=None, help="a MoICE gates file (default: untrained routers)")
    parser.add_argument("--poshidden-setting", default=None,
                        help="a poshidden_hf setting file (default: channel 0, factor 0, the middle band of layers)")
    parser.add_argument("--string-offset", type=int, default=512,
                        help="STRING's shifted_offset S in tokens (default 512: below these prompts' length)")
    parser.add_argument("--setting", action="append", default=[], metavar="METHOD:ARGS",
                        help="also time METHOD at these arguments, as a board's row ran it (repeatable), e.g. "
                             "'fitm:spans_per_copy=10,temperature=5e-05,strength=0.5'; METHOD: one of "
                             f"{', '.join(SETTABLE)} or its key in the table of methods")
    parser.add_argument("--threads", type=positive_int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--json", default=None, help="also write the raw timings here")
    args = parser.parse_args(argv)

    chosen = method_names(args.methods)
    unknown = [m for m in chosen if m not in METHODS]
    if unknown or "vanilla" not in chosen:
        parser.error(f"--methods {args.methods!r}: accepted {', '.join(METHODS)}, and vanilla must be one of them")
    if args.repeats < 10:
        parser.error(f"--repeats {args.repeats}: give at least 10, so that the 10-90 % spread means something")
    try:
        settings = {name: {"method": label, "args": text.partition(":")[2].strip()}
                    for text in args.setting for name, label, _ in [parse_setting(text)]}
    except ValueError as err:
        parser.error(str(err))
    if len(settings) != len(args.setting):
        parser.error("two --setting flags name the same method and arguments")
    if args.threads:
        torch.set_num_threads(args.threads)

    from lpes_harness.core import rope
    from lpes_harness.core.models import load_causal_lm

    model, tokenizer = load_causal_lm(args.pretrained, args.gguf_file, dtype=args.dtype, attn_implementation="sdpa")
    prompts = mdqa_prompts(args.samples, args.num_docs)
    inputs = [tokenizer(p, return_tensors="pt")["input_ids"].to(model.device) for p in prompts]
    lengths = [int(x.shape[1]) for x in inputs]
    machine = machine_description(str(model.device))
    print(f"{len(inputs)} prompts of {min(lengths)}-{max(lengths)} tokens, {args.new_tokens} new tokens, "
          f"{args.repeats} repeats, {torch.get_num_threads()} threads, on {machine}", file=sys.stderr)
    methods = make_methods(model, tokenizer, lpes_scales(args.lpes_scales, rope.num_layers(model)), args.moice_gates,
                           args.poshidden_setting, args.string_offset, tuple(args.setting))
    chosen += list(settings)

    from lpes_harness.methods.arguments import MethodError
    from lpes_harness.core.rope_anatomy import LPESError

    refused = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # Warm-up (first-call allocations) on a short input, not timed. A method that refuses this
        # model (MoICE on Gemma-3) is left out of the run with its reason, not timed as something else.
        for name in chosen:
            install, remove, next_logits = methods[name]
            try:
                install()
            except (MethodError, LPESError) as err:
                refused[name] = str(err)
                print(f"{name}: not timed, it refuses this model: {err}", file=sys.stderr)
                continue
            time_generation(model, next_logits, inputs[0][:, :64], 2)
            remove()
        chosen = [name for name in chosen if name not in refused]
        # times[method][workload][sample][repeat]
        times = {m: {w: [[] for _ in inputs] for w in WORKLOADS} for m in chosen}
        for repeat in range(args.repeats):
            order = chosen if repeat % 2 == 0 else chosen[::-1]  # neither always goes first
            for s, input_ids in enumerate(inputs):
                for name in order:
                    install, remove, next_logits = methods[name]
                    install()
                    try:
                        times[name]["prefill"][s].append(time_prefill(model, next_logits, input_ids))
                        times[name]["generate"][s].append(time_generation(model, next_logits, input_ids, args.new_tokens))
                    finally:
                        remove()
                    print(f"repeat {repeat + 1} sample {s + 1} {name}: prefill {times[name]['prefill'][s][-1]:.3f} s, "
                          f"generate {times[name]['generate'][s][-1]:.3f} s", file=sys.stderr)

    summary = {}
    for m in chosen:
        summary[m] = {}
        for w in WORKLOADS:
            per_repeat = [statistics.median(times[m][w][s][r] for s in range(len(inputs))) for r in range(args.repeats)]
            paired = [times[m][w][s][r] / times["vanilla"][w][s][r] for s in range(len(inputs)) for r in range(args.repeats)]
            per_sample = [statistics.median(t) for t in times[m][w]]
            summary[m][w] = {
                "seconds": dict(spread(per_repeat), median=statistics.median(per_sample)),
                "paired_ratio": spread(paired),
                "per_sample_s": per_sample,
                "raw_s": times[m][w],
            }
    print(format_table(summary))
    if args.json:
        payload = {
            "prompt_tokens": lengths,
            "new_tokens": args.new_tokens,
            "repeats": args.repeats,
            "threads": torch.get_num_threads(),
            "device": str(model.device),
            "machine": machine,
            "dtype": args.dtype,
            "model": args.pretrained or "bundled SmolLM2",
            "moice_gates": args.moice_gates,
            "lpes_scales": args.lpes_scales,
            "poshidden_setting": args.poshidden_setting,
            "string_offset": args.string_offset,
            "settings": {name: value for name, value in settings.items() if name not in refused},
            "refused": refused,
            "summary": summary,
        }
        atomic_write_json(args.json, payload, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
