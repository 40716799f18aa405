"""LDA app: UCI bag-of-words parsing, the data generator, the sampler, model
quality against scikit-learn and the planted topics, and runs on a real
local cluster (1 machine = the single-process reference; 2 machines reach
the 1-machine objective)."""
import gzip
import importlib.util
import json
import logging

import numpy as np
import pytest
from scipy.optimize import linear_sum_assignment

from harmony.app import AppError, InputError, InputPart, Step, load_app, parse_app_args, run_local
from harmony.datagen.lda import gen_lda, planted_topics, word_names
from harmony.formats.uci_bow import DocwordReader, read_docword, read_vocab
from conftest import ROOT, run_cli, wait_state

LDA_APP = ROOT / "apps" / "lda.py"
K, ALPHA, BETA = 6, 0.1, 0.05
GEN = dict(docs=1200, vocab=300, topics=K, doc_len=50, alpha=ALPHA, beta=BETA, seed=7)


def _module():
    spec = importlib.util.spec_from_file_location("lda_app_module", LDA_APP)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


lda = _module()
LDA = load_app(LDA_APP.read_text(), "lda.py")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("lda")
    path, vocab = str(d / "docword.gen.txt"), str(d / "vocab.gen.txt")
    shape = gen_lda(path, vocab_path=vocab, **GEN)
    return {"path": path, "vocab": vocab, "shape": shape}


def _args(corpus, *extra):
    return ["--input", corpus["path"], "--topics", str(K), "--alpha", str(ALPHA),
            "--beta", str(BETA), "--blocks", "8", "--seed", "3", *extra]


@pytest.fixture(scope="module")
def reference(corpus):
    """The single-process reference run shared by the quality tests."""
    return run_local(LDA, _args(corpus, "--max-epochs", "25"))


# -- parser -------------------------------------------------------------------

@pytest.mark.parametrize("text, line, reason", [
    ("2\nx\n3\n", 2, "bad header: expected the vocabulary size W"),
    ("2\n3\n", 3, "bad header: file ends where the number of entries NNZ should be"),
    ("0\n3\n1\n1 1 1\n", 1, "need D >= 1"),
    ("2\n3\n2\n1 1 2\n1 3\n", 5, "expected 3 fields 'docID wordID count', got 2"),
    ("2\n3\n2\n1 1 2\n1 3 1 7\n", 5, "got 4"),
    ("2\n3\n2\n1 1 2\n1 3 1.5\n", 5, "non-negative integers"),
    ("2\n3\n2\n1 1 2\n1 -3 1\n", 5, "non-negative integers"),
    ("2\n3\n2\n1 1 x\n1 3 1\n", 4, "non-negative integers"),
    ("2\n3\n2\n1 1 2\n3 3 1\n", 5, "docID outside 1..D=2"),
    ("2\n3\n2\n1 1 2\n1 0 1\n", 5, "wordID outside 1..W=3"),
    ("2\n3\n2\n1 1 2\n1 2 0\n", 5, "count outside"),
    ("2\n3\n1\n1 1 2\n1 2 1\n", 5, "more entries than the header's NNZ=1"),
    ("2\n3\n3\n1 1 2\n1 2 1\n", 3, "header says NNZ=3 entries but the file has 2"),
])
def test_parser_errors_name_file_and_line(tmp_path, text, line, reason):
    p = tmp_path / "docword.bad.txt"
    p.write_text(text)
    with pytest.raises(InputError) as ei:
        read_docword(str(p))
    assert str(ei.value).startswith(f"{p}:{line}: "), str(ei.value)
    assert reason in str(ei.value)
    assert ei.value.path == str(p) and ei.value.line == line


def test_parser_streams_chunks_gzip_blank_lines_and_crlf(tmp_path):
    rng = np.random.default_rng(0)
    n = 5000
    doc = np.sort(rng.integers(1, 800, n))
    word = rng.integers(1, 3000, n)
    cnt = rng.integers(1, 40, n)
    lines = [f"{d} {w} {c}" for d, w, c in zip(doc, word, cnt)]
    lines[10] += "\r"
    lines.insert(20, "")
    text = f"800\n3000\n{n}\n" + "\n".join(lines)          # no final newline
    plain, gz = tmp_path / "a.txt", tmp_path / "a.bin"      # gzip found by magic bytes
    plain.write_text(text)
    gz.write_bytes(gzip.compress(text.encode()))
    with DocwordReader(str(plain), chunk_bytes=1024) as r:
        chunks = list(r)
    assert len(chunks) > 20 and r.header.nnz == n
    got = np.concatenate([np.stack([c.doc, c.word, c.count]) for c in chunks], axis=1)
    assert (got == np.stack([doc - 1, word - 1, cnt])).all()
    lines_no = np.concatenate([c.line for c in chunks])
    assert lines_no[0] == 4 and lines_no[19] == 23 and lines_no[20] == 25  # blank line 24
    h, d2, w2, c2 = read_docword(str(gz))
    assert h.nnz == n and (d2 == doc - 1).all() and (w2 == word - 1).all() and (c2 == cnt).all()


def test_vocab_must_match_the_header(tmp_path):
    v = tmp_path / "vocab.txt"
    v.write_text("apple\nbanana\n")
    assert read_vocab(str(v), 2) == ["apple", "banana"]
    with pytest.raises(InputError, match=r"vocab.txt:3: vocabulary has 2 words, .* W=3"):
        read_vocab(str(v), 3)


# -- generator ---------------------------------------------------------------

def test_generator_output_round_trips_through_the_parser(corpus, tmp_path):
    shape = corpus["shape"]
    h, doc, word, cnt = read_docword(corpus["path"])
    assert (h.docs, h.words, h.nnz) == (GEN["docs"], GEN["vocab"], shape["nnz"])
    assert len(doc) == shape["nnz"] and int(cnt.sum()) == shape["tokens"]
    assert np.array_equal(np.unique(doc), np.arange(GEN["docs"]))   # every doc has a token
    assert len(np.unique(doc * h.words + word)) == len(doc)          # one entry per pair
    phi = planted_topics(GEN["vocab"], K, BETA, GEN["seed"])
    assert read_vocab(corpus["vocab"], h.words) == word_names(phi)
    # the CLI: gzip output, truth file; same content as the uncompressed file
    out, truth = tmp_path / "docword.gen.txt.gz", tmp_path / "truth.npy"
    r = run_cli("data", "gen", "lda", "--out", str(out), "--truth-out", str(truth),
                *[f"--{k.replace('_', '-')}={v}" for k, v in GEN.items()])
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["nnz"] == shape["nnz"]
    assert gzip.decompress(out.read_bytes()) == open(corpus["path"], "rb").read()
    assert np.allclose(np.load(truth), phi)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".lda-body")]


# -- sampler -------------------------------------------------------------------

def test_batch_sampler_draws_from_the_exact_conditional():
    """Many copies of one token in one batch are sampled from the same
    counts: their topics must follow the collapsed conditional, with the
    token's own assignment taken out of the counts."""
    k, n, w_total = 7, 200_000, 50
    rng = np.random.default_rng(1)
    ndk = rng.integers(0, 6, k).astype(np.float32)
    nwk = rng.integers(0, 9, k).astype(np.float32)
    nk = nwk + rng.integers(20, 60, k)
    old = 3
    ndk[old] += 1
    nwk[old] += 1
    nk[old] += 1
    inv = (1 / (nk + w_total * BETA)).astype(np.float32)
    ndka = (ndk + np.float32(ALPHA))[None, :].copy()
    bw = ((nwk + np.float32(BETA)) * inv)[None, :].copy()
    z = np.full(n, old, np.int16)
    td = np.zeros(n, np.int32)
    tw = np.zeros(n, np.int32)
    ws = lda.Workspace(k, n)
    lda.gibbs_sweep(td, tw, z, ndka.copy(), bw.copy(), inv, np.array([0, n]), rng, ws, True)
    x = np.arange(k) == old
    p = (ndk - x + ALPHA) * (nwk - x + BETA) / (nk - x + w_total * BETA)
    p /= p.sum()
    freq = np.bincount(z, minlength=k) / n
    assert np.abs(freq - p).max() < 4 * np.sqrt(p.max() / n), (freq, p)


def test_sampling_is_deterministic_per_seed(corpus):
    a = run_local(LDA, _args(corpus, "--max-epochs", "2", "--iters-per-epoch", "3"))
    b = run_local(LDA, _args(corpus, "--max-epochs", "2", "--iters-per-epoch", "3"))
    c = run_local(LDA, _args(corpus, "--max-epochs", "2", "--iters-per-epoch", "3",
                             "--seed", "4"))
    assert np.array_equal(a.model, b.model) and a.history == b.history
    assert not np.array_equal(a.model, c.model)


def test_counts_beyond_exact_float32_fail_clearly(corpus):
    app = LDA(parse_app_args(LDA, _args(corpus)))
    blocks = sorted(app.read_input(InputPart(0, 1, 8)), key=lambda b: b.id)
    keys = app.keys(blocks)
    assert list(keys[-app.R:]) == list(range(GEN["vocab"], GEN["vocab"] + app.R))
    rows = np.zeros((len(keys), K), np.float32)
    rows[-1, 0] = 2.0 ** 24
    with pytest.raises(AppError, match=r"reached 2\^24"):
        app.compute(blocks, keys, rows, Step(0, 0, 1))


# -- model quality ------------------------------------------------------------

def test_perplexity_close_to_sklearn_and_planted_topics_recovered(corpus, reference):
    from scipy.sparse import csr_matrix
    from sklearn.decomposition import LatentDirichletAllocation

    hist = reference.history
    assert hist[-1]["objective"] < hist[0]["objective"] - 1.0      # it learned
    assert hist[-1]["perplexity"] < 0.7 * hist[0]["perplexity"]
    h, doc, word, cnt = read_docword(corpus["path"])
    held = lda.heldout_docs(doc, 0.1, 3)       # the app's split (--holdout 0.1, --seed 3)
    assert 0.05 < held.mean() < 0.15
    train_docs = np.unique(doc[~held])
    X = csr_matrix((cnt[~held], (doc[~held], word[~held])), shape=(h.docs, h.words))[train_docs]
    sk = LatentDirichletAllocation(n_components=K, doc_topic_prior=ALPHA, topic_word_prior=BETA,
                                   learning_method="batch", max_iter=40, random_state=0).fit(X)
    phi_sk = sk.components_ / sk.components_.sum(axis=1, keepdims=True)
    phi_app = lda.phi_from_counts(reference.model, BETA, GEN["vocab"])
    ppl = {name: lda.heldout_perplexity(phi, doc[held], word[held], cnt[held], ALPHA, seed=11)
           for name, phi in (("app", phi_app), ("sklearn", phi_sk))}
    print("held-out perplexity (document completion):", ppl)
    assert ppl["app"] <= 1.10 * ppl["sklearn"], ppl

    truth = planted_topics(GEN["vocab"], K, BETA, GEN["seed"])
    unit = lambda m: m / np.linalg.norm(m, axis=1, keepdims=True)  # noqa: E731
    cos = unit(truth) @ unit(phi_app).T
    r, c = linear_sum_assignment(-cos)
    print("planted topic recovery (cosine):", cos[r, c].round(3))
    assert cos[r, c].mean() > 0.8 and cos[r, c].min() > 0.5


def test_top_words_are_logged_with_the_vocabulary(corpus, caplog):
    with caplog.at_level(logging.INFO, logger="harmony.app.lda"):
        run_local(LDA, _args(corpus, "--max-epochs", "2", "--vocab", corpus["vocab"],
                             "--top-words", "5"))
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("topic")]
    assert len(lines) == K
    assert all(len(ln.split(":")[1].split()) == 5 for ln in lines)
    assert all("_t" in ln.split(":")[1] for ln in lines)   # words from the vocab file


# -- on a real local cluster ----------------------------------------------------

def test_one_machine_matches_single_process_reference(client, corpus):
    args = _args(corpus, "--max-epochs", "4", "--iters-per-epoch", "3")
    ref = run_local(LDA, args)
    job = client.submit("lda.py", LDA_APP.read_text(), args, machines=1)
    st = wait_state(client, job, ("finished", "failed"))
    assert st["state"] == "finished", st["error"]
    got = [e["metrics"] for e in st["epochs"]]
    assert len(got) == len(ref.history) == 4
    for g, r in zip(got, ref.history):
        for key in ("objective", "perplexity", "tokens"):
            assert g[key] == pytest.approx(r[key], rel=1e-9), key


def test_two_machines_reach_the_one_machine_objective(client, corpus, reference):
    job = client.submit("lda.py", LDA_APP.read_text(), _args(corpus, "--max-epochs", "25"),
                        machines=2)
    st = wait_state(client, job, ("finished", "failed"))
    assert st["state"] == "finished", st["error"]
    assert sorted(st["workers"]) == ["m0", "m1"]
    two, one = st["epochs"][-1]["metrics"], reference.history[-1]
    print("2 machines:", two, "1 machine:", one)
    assert two["tokens"] == one["tokens"]
    assert two["objective"] == pytest.approx(one["objective"], rel=0.02)
    assert two["perplexity"] == pytest.approx(one["perplexity"], rel=0.05)


def test_bad_input_fails_the_job_with_file_and_line(client, tmp_path):
    bad = tmp_path / "docword.bad.txt"
    bad.write_text("3\n4\n3\n1 1 2\n2 9 1\n3 1 1\n")
    job = client.submit("lda.py", LDA_APP.read_text(), ["--input", str(bad)], machines=2)
    st = wait_state(client, job, ("finished", "failed"))
    assert st["state"] == "failed" and f"{bad}:5: wordID outside 1..W=4" in st["error"]
