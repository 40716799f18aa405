"""LDA data: documents from the LDA generative process with planted topics,
written in the UCI bag-of-words format (``docword`` + optional ``vocab``).

Generative process (Blei et al. 2003), ``K`` planted topics over ``V`` words::

    phi_k   ~ Dirichlet(beta)            k = 1..K   (the planted topics)
    theta_d ~ Dirichlet(alpha)           d = 1..D
    N_d     ~ max(1, Poisson(doc_len))
    z_di    ~ Categorical(theta_d),  w_di ~ Categorical(phi_{z_di})

Documents are made and written in chunks, so any size fits in memory. The
header needs the entry count before the body, so the body is streamed to a
temporary file next to ``--out`` and then copied behind the header
(compressed on the way when ``--out`` ends in ``.gz``).
"""
from __future__ import annotations

import argparse
import os
import shutil
import tempfile

import numpy as np

from harmony.datagen import open_out
from harmony.formats.uci_bow import format_entries, write_header

KIND = "lda"
HELP = "LDA generative process with planted topics: UCI bag-of-words docword (+ vocab)"


def planted_topics(vocab: int, topics: int, beta: float, seed: int) -> np.ndarray:
    """The planted topic-word distributions (topics x vocab), a function of
    (vocab, topics, beta, seed) only; the same ones :func:`gen_lda` uses."""
    rng = np.random.default_rng([seed, 0x1DA, 0])
    phi = rng.dirichlet(np.full(vocab, beta), size=topics)
    # Dirichlet draws with tiny beta can underflow to all-zero rows; keep them proper
    phi += 1e-12
    phi /= phi.sum(axis=1, keepdims=True)
    return phi


def word_names(phi: np.ndarray) -> list[str]:
    """Vocabulary words that name each word's dominant planted topic
    (``w00042_t3``), so that top-word lists can be checked by eye."""
    top = phi.argmax(axis=0)
    width = len(str(phi.shape[1] - 1))
    return [f"w{v:0{width}d}_t{int(k)}" for v, k in enumerate(top)]


def gen_lda(path: str, docs: int = 1000, vocab: int = 1000, topics: int = 10,
            doc_len: float = 100.0, alpha: float = 0.1, beta: float = 0.05, seed: int = 0,
            vocab_path: str | None = None, truth_path: str | None = None,
            chunk_docs: int = 5000) -> dict:
    """Write ``docs`` documents to ``path`` (UCI docword; .gz ok).

    Optional: ``vocab_path`` (one word per line), ``truth_path`` (``.npy``
    with the planted topics, topics x vocab, float64). Returns the shape
    written. Deterministic in ``seed``.
    """
    if docs < 1 or vocab < 1 or topics < 1 or doc_len <= 0 or alpha <= 0 or beta <= 0:
        raise ValueError("need docs, vocab, topics >= 1 and doc_len, alpha, beta > 0")
    phi = planted_topics(vocab, topics, beta, seed)
    cphi = np.cumsum(phi, axis=1)
    cphi[:, -1] = 1.0
    nnz = tokens = 0
    out_dir = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".lda-body-", dir=out_dir)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as body:
            for start in range(0, docs, chunk_docs):
                c = min(chunk_docs, docs - start)
                rng = np.random.default_rng([seed, 0x1DA, 1, start])
                theta = rng.dirichlet(np.full(topics, alpha), size=c)
                lens = np.maximum(1, rng.poisson(doc_len, size=c))
                per_topic = rng.multinomial(lens, theta)          # c x topics
                dk, wk = [], []
                for k in range(topics):
                    n = per_topic[:, k]
                    tot = int(n.sum())
                    if tot == 0:
                        continue
                    dk.append(np.repeat(np.arange(c), n))
                    wk.append(np.minimum(np.searchsorted(cphi[k], rng.random(tot), "right"),
                                         vocab - 1))
                d = np.concatenate(dk)
                w = np.concatenate(wk)
                pair, cnt = np.unique(d.astype(np.int64) * vocab + w, return_counts=True)
                body.write(format_entries(pair // vocab + start + 1, pair % vocab + 1, cnt))
                nnz += len(pair)
                tokens += int(lens.sum())
        with open_out(path) as out, open(tmp, "r", encoding="utf-8") as body:
            write_header(out, docs, vocab, nnz)
            shutil.copyfileobj(body, out, 1 << 20)
    finally:
        os.unlink(tmp)
    if vocab_path:
        with open_out(vocab_path) as fh:
            fh.write("\n".join(word_names(phi)) + "\n")
    if truth_path:
        with open(truth_path, "wb") as fh:
            np.save(fh, phi)
    return {"docs": docs, "vocab": vocab, "topics": topics, "nnz": nnz, "tokens": tokens,
            "alpha": alpha, "beta": beta}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--docs", type=int, default=1000, help="documents D")
    p.add_argument("--vocab", type=int, default=1000, help="vocabulary size W")
    p.add_argument("--topics", type=int, default=10, help="planted topics K")
    p.add_argument("--doc-len", type=float, default=100.0, help="mean document length (Poisson)")
    p.add_argument("--alpha", type=float, default=0.1, help="Dirichlet prior of doc-topic mixtures")
    p.add_argument("--beta", type=float, default=0.05, help="Dirichlet prior of the planted topics")
    p.add_argument("--vocab-out", default=None,
                   help="also write the vocabulary here (one word per line; "
                        "word names carry their dominant planted topic)")
    p.add_argument("--truth-out", default=None,
                   help="also write the planted topics here (.npy, topics x vocab)")


def generate(a: argparse.Namespace) -> dict:
    return gen_lda(a.out, docs=a.docs, vocab=a.vocab, topics=a.topics, doc_len=a.doc_len,
                   alpha=a.alpha, beta=a.beta, seed=a.seed, vocab_path=a.vocab_out,
                   truth_path=a.truth_out)
