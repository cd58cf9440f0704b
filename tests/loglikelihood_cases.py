"""loglikelihood requests that exercise an answer-logits path against HFLM's own: different
lengths (a batch is right-padded), two answers of one prompt, a one-token answer, and an empty
context (lm-eval conditions on the prefix token)."""

from lm_eval.api.instance import Instance

REQUESTS = [
    ("The quick brown", " fox jumps"),
    ("Lost in the middle of a long text, the key 7 holds", " 42"),
    ("Lost in the middle of a long text, the key 7 holds", " 4"),
    ("abc", "def!"),
    ("A much longer prompt than the others, so that padding shows: the value of key 9 is", " 9"),
    ("", "hello"),
]


def instances(pairs):
    return [Instance("loglikelihood", {}, pair, index) for index, pair in enumerate(pairs)]


def output_layer_positions(lm) -> tuple[int, int]:
    """``(positions through the output layer, answer tokens)`` when ``lm`` scores :data:`REQUESTS`.

    The answer tokens as lm-eval counts them: ``_encode_pair`` moves a context's trailing space
    into the answer; an empty context is conditioned on the prefix token, the answer whole."""
    rows = []
    handle = lm.model.get_output_embeddings().register_forward_hook(
        lambda module, args, output: rows.append(args[0].shape[:-1].numel()))
    try:
        lm.loglikelihood(instances(REQUESTS), disable_tqdm=True)
    finally:
        handle.remove()
    answer_tokens = sum(len(lm._encode_pair(c, a)[1]) if c else len(lm.tok_encode(a)) for c, a in REQUESTS)
    return sum(rows), answer_tokens
