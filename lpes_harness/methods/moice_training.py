"""Training MoICE routers: the balancing loss, a corpus generated in code, the training loop.

Only the routers learn (LM loss + ``AUX_LOSS_COEF`` x :func:`balance_loss`) on
:func:`synthetic_corpus` (facts stated early, asked about at the end; no external data); the
model, its routers and the gates files are :mod:`lpes_harness.methods.moice`'s. The command is
``python -m lpes_harness.commands.train_moice``.
"""

from __future__ import annotations

import random

import torch
from torch import nn

from lpes_harness.methods.arguments import MethodError
from lpes_harness.methods.moice import get_state, routers

AUX_LOSS_COEF = 0.3  # the balancing loss's weight beside the LM loss, as the reference trains


def balance_loss(router_logits: list[torch.Tensor], valid: torch.Tensor | None = None) -> torch.Tensor:
    """E * sum_e f_e * P_e over all layers, heads and real tokens.

    ``f_e``: share of (token, head) pairs whose top base is e; ``P_e``: mean router
    probability of e. Minimal (1) when both are uniform.
    """
    logits = torch.stack(router_logits)  # (L, B, H, T, E)
    n_experts = logits.shape[-1]
    probs = torch.softmax(logits.float(), dim=-1)
    top1 = torch.nn.functional.one_hot(probs.argmax(-1), n_experts).float()
    if valid is None:
        valid = torch.ones(logits.shape[1], logits.shape[3], device=logits.device)
    weight = valid.float()[None, :, None, :, None]  # (1, B, 1, T, 1)
    total = (weight.expand_as(probs[..., :1])).sum()
    f = (top1 * weight).sum(dim=(0, 1, 2, 3)) / total
    p = (probs * weight).sum(dim=(0, 1, 2, 3)) / total
    return n_experts * (f * p).sum()


SUBJECTS = ["red box", "blue crate", "old chest", "glass jar", "iron safe", "paper bag", "wooden case", "silver tin",
            "green basket", "black trunk", "small drawer", "tall cabinet"]
PLACES = ["Lisbon", "Oslo", "Quito", "Nairobi", "Hanoi", "Lima", "Perth", "Tunis", "Riga", "Dakar", "Sapporo", "Bergen"]
OBJECTS = ["copper coins", "letters", "maps", "seeds", "keys", "stamps", "buttons", "shells", "marbles", "candles"]
FILLER = [
    "The morning was quiet and the streets were still wet from the night rain.",
    "A clerk wrote every delivery into a ledger with careful handwriting.",
    "Nobody remembered who had first suggested keeping such detailed records.",
    "The inventory was checked twice a year by two different people.",
    "Some of the shelves had been repainted, others still showed their original colour.",
    "Visitors often asked about the building, which was older than the town hall.",
    "The owner preferred short notes to long reports.",
    "Every label was written in capital letters so that it could be read from afar.",
]


def synthetic_corpus(num_documents: int = 200, seed: int = 0) -> list[str]:
    """Documents that reward reading far back: facts stated early, asked about at the end.

    Each document lists facts ("In Oslo, the red box holds 42 maps.") among filler
    sentences, then asks about some of them, in random order, so the answer's source sits
    anywhere in the context. Written for this project; no external data.
    """
    rng = random.Random(seed)
    documents = []
    for _ in range(num_documents):
        facts = []
        for _ in range(rng.randint(8, 16)):
            place, subject, obj = rng.choice(PLACES), rng.choice(SUBJECTS), rng.choice(OBJECTS)
            facts.append((place, subject, obj, rng.randint(2, 999)))
        sentences = []
        for place, subject, obj, count in facts:
            sentences.extend(rng.sample(FILLER, rng.randint(1, 3)))
            sentences.append(f"In {place}, the {subject} holds {count} {obj}.")
        questions = []
        for place, subject, obj, count in rng.sample(facts, min(4, len(facts))):
            questions.append(f"Question: How many {obj} does the {subject} in {place} hold? Answer: {count}.")
        documents.append(" ".join(sentences) + "\n" + "\n".join(questions))
    return documents


def token_stream(tokenizer, documents: list[str], seq_len: int) -> list[torch.Tensor]:
    """Concatenate the documents (separated by EOS) and cut them into ``seq_len`` chunks."""
    ids: list[int] = []
    eos = tokenizer.eos_token_id
    for document in documents:
        ids.extend(tokenizer(document, add_special_tokens=False)["input_ids"])
        if eos is not None:
            ids.append(eos)
    return [torch.tensor(ids[i : i + seq_len]) for i in range(0, len(ids) - seq_len + 1, seq_len)]


def train_gates(
    model: nn.Module,
    chunks: list[torch.Tensor],
    steps: int,
    lr: float = 1e-3,
    aux_coef: float = AUX_LOSS_COEF,
    batch_size: int = 1,
    seed: int = 0,
    log=print,
) -> list[dict]:
    """Train only the routers: LM loss + ``aux_coef`` x balancing loss. Returns the loss history."""
    state = get_state(model)
    if not chunks:
        raise MethodError("no training chunks: the corpus is shorter than one sequence; lower --seq-len")
    for param in model.parameters():
        param.requires_grad_(False)
    params = [p for r in routers(model) for p in r.parameters()]
    for param in params:
        param.requires_grad_(True)
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    rng = random.Random(seed)
    device = next(model.parameters()).device
    history = []
    model.train(False)  # no dropout: only the routers learn
    for step in range(steps):
        batch = torch.stack([rng.choice(chunks) for _ in range(batch_size)]).to(device)
        state.router_logits = []
        try:
            out = model(input_ids=batch, labels=batch, use_cache=False)
            aux = balance_loss(state.router_logits)
        finally:
            state.router_logits = None
        loss = out.loss + aux_coef * aux
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        lm_loss, aux_loss = out.loss.detach().item(), aux.detach().item()
        history.append({"step": step + 1, "lm_loss": lm_loss, "balance_loss": aux_loss})
        log(f"step {step + 1}/{steps}  lm_loss {lm_loss:.4f}  balance_loss {aux_loss:.4f}")
    for param in params:
        param.requires_grad_(False)
    return history


@torch.no_grad()
def mean_lm_loss(model: nn.Module, chunks: list[torch.Tensor]) -> float:
    """Mean next-token loss over ``chunks`` (held out from training: did the routers learn?)."""
    if not chunks:
        raise MethodError("no held-out chunks to measure the loss on")
    device = next(model.parameters()).device
    losses = [model(input_ids=c[None].to(device), labels=c[None].to(device), use_cache=False).loss.item() for c in chunks]
    return sum(losses) / len(losses)
