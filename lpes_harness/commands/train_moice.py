"""Train MoICE routers for a model and save them as a gates file.

    python -m lpes_harness.commands.train_moice --out results/moice/smollm2.gates.pt

Only the routers learn (LM loss + 0.3 x balancing loss) on a corpus generated in code
(:func:`~lpes_harness.methods.moice_training.synthetic_corpus`; the training is
:mod:`lpes_harness.methods.moice_training`'s); the model, its routers and the gates files are
:mod:`lpes_harness.methods.moice`'s. On the bundled SmolLM2 and two
CPU cores the defaults take a few minutes. Then:

    lm_eval --model moice_hf --model_args gates=results/moice/smollm2.gates.pt ...

(A module of its own so that ``python -m`` does not register ``moice_hf`` twice.)
"""

from __future__ import annotations

import sys
import time
import warnings

from lpes_harness.commands import flags
from lpes_harness.methods import moice
from lpes_harness.methods.moice_training import AUX_LOSS_COEF, mean_lm_loss, synthetic_corpus, token_stream, train_gates


def main(argv: list[str] | None = None) -> int:
    parser = flags.CommandParser(
        prog="python -m lpes_harness.commands.train_moice",
        description="Train MoICE routers (only the routers) on a small generated corpus and save them.",
    )
    train = parser
    train.add_argument("--out", required=True, help="where to write the gates file (e.g. results/moice/smollm2.gates.pt)")
    flags.add_pretrained(train, gguf_file=True)
    train.add_argument("--bases", default=None, help="relative to theta, ';'-separated (default: the authors' set)")
    train.add_argument("--top-k", type=int, default=None)
    train.add_argument("--steps", type=int, default=40)
    train.add_argument("--seq-len", type=int, default=512)
    train.add_argument("--batch-size", type=int, default=1)
    train.add_argument("--lr", type=float, default=1e-3)
    train.add_argument("--aux-coef", type=float, default=AUX_LOSS_COEF)
    train.add_argument("--documents", type=int, default=200)
    flags.add_seed(train)
    train.add_argument("--eval-chunks", type=int, default=4,
                       help="chunks held out of training; their LM loss is measured before and after (default 4)")
    flags.add_device(train)
    args = parser.parse_args(argv)

    from lpes_harness.core.models import load_causal_lm

    if args.steps < 1 or args.seq_len < 8 or args.eval_chunks < 0:
        parser.error(
            f"--steps {args.steps} / --seq-len {args.seq_len} / --eval-chunks {args.eval_chunks}: "
            "need steps >= 1, seq-len >= 8 and eval-chunks >= 0"
        )
    started = time.time()
    model, tokenizer = load_causal_lm(args.pretrained, args.gguf_file, device=args.device, attn_implementation="sdpa")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "untrained routers": we are about to train them
        moice.install(model, bases=args.bases, top_k=args.top_k, seed=args.seed)
    chunks = token_stream(tokenizer, synthetic_corpus(args.documents, args.seed), args.seq_len)
    if args.eval_chunks >= len(chunks):
        parser.error(
            f"--eval-chunks {args.eval_chunks} leaves no training chunk: the corpus makes {len(chunks)} chunks "
            f"of {args.seq_len} tokens; lower --eval-chunks or --seq-len, or raise --documents"
        )
    held_out = chunks[len(chunks) - args.eval_chunks :] if args.eval_chunks else []
    chunks = chunks[: len(chunks) - len(held_out)]
    print(f"corpus: {len(chunks)} training chunks of {args.seq_len} tokens, {len(held_out)} held out; "
          f"training {args.steps} steps", file=sys.stderr)
    loss_before = mean_lm_loss(model, held_out) if held_out else None
    history = train_gates(
        model, chunks, args.steps, lr=args.lr, aux_coef=args.aux_coef, batch_size=args.batch_size, seed=args.seed,
        log=lambda line: print(line, file=sys.stderr),
    )
    loss_after = mean_lm_loss(model, held_out) if held_out else None
    if held_out:
        print(f"held-out LM loss: {loss_before:.4f} with the initial routers, {loss_after:.4f} after training",
              file=sys.stderr)
    moice.save_gates(
        model,
        args.out,
        training={
            "heldout_lm_loss": {"chunks": len(held_out), "before": loss_before, "after": loss_after},
            "pretrained": args.pretrained or "bundled SmolLM2-135M-Instruct (GGUF)",
            "steps": args.steps,
            "seq_len": args.seq_len,
            "batch_size": args.batch_size,
            "lr": args.lr,
            "aux_coef": args.aux_coef,
            "documents": args.documents,
            "seed": args.seed,
            "seconds": round(time.time() - started, 1),
            "history": history,
        },
    )
    print(f"wrote {args.out} ({time.time() - started:.0f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
