"""Model export (harmony model get): a job's model from its checkpoint parts,
fetched from the workers' data services and written by the app's exporter.

On one machine a job's model equals run_local's bit for bit, so the export
of a finished job, and of a running job's snapshot at an epoch end, is
checked against run_local's model run through the same exporter."""
import math
import os
import time

import numpy as np
import pytest

from harmony.app import InputPart, load_app, parse_app_args, run_local
from harmony.cli.jobs import top_words_lines
from harmony.client import Client, ClientError
from harmony.datagen.lasso import gen_lasso
from harmony.datagen.lda import gen_lda
from harmony.datagen.mlr import gen_mlr
from harmony.export import ExportError, export_arrays
from conftest import NMF_APP, ROOT, ckpt_parts_left, run_cli, wait_state

NMF_SRC = NMF_APP.read_text()
NMF_ARGS = ["--rank", "6", "--blocks", "8"]


def _src(name):
    return (ROOT / "apps" / f"{name}.py").read_text()


def _wait_epochs(c, job, n, timeout=60):
    deadline = time.time() + timeout
    while c.status(job)["epochs_total"] < n:
        assert time.time() < deadline, c.status(job)
        time.sleep(0.02)


def _nmf_reference(args):
    """run_local's model of NMF and its user factors (from its input blocks)."""
    cls = load_app(NMF_SRC, "nmf.py")
    seen = {}

    class Capture(cls):
        def read_input(self, part):
            seen["blocks"] = list(super().read_input(part))
            return seen["blocks"]
    res = run_local(Capture, args)
    app = cls(parse_app_args(cls, args))
    keys = np.arange(len(res.model))
    return res, {**app.export(keys, res.model, {}), **app.export_inputs(seen["blocks"], {})}


def _assert_same(got, want):
    assert set(got) == set(want)
    for k in want:
        assert got[k].dtype == np.asarray(want[k]).dtype, k
        assert np.array_equal(got[k], want[k]), k


def test_finished_nmf_export_is_run_locals_model(client, cluster, ratings):
    args = ["--input", ratings, "--max-epochs", "5", *NMF_ARGS]
    job = client.submit("nmf.py", NMF_SRC, args, machines=1, checkpoint_every=2)
    st = wait_state(client, job, ("finished", "failed"))
    assert st["state"] == "finished", st["error"]
    ck = st["checkpoint"]
    assert ck["final"] and ck["epoch"] == 4 and ck["replicas"] == 1
    # only the final checkpoint is left on the machines (the periodic ones went)
    assert ckpt_parts_left(cluster.state_dir, job, ["e4-p0", "e4-p0"]) == \
        ["e4-p0", "e4-p0"]      # the part and its replica
    model = client.model(job)
    assert model.source.final and model.source.epoch == 4
    got = export_arrays(model)
    _, want = _nmf_reference(args)
    _assert_same(got, want)                  # R, item ids, L, user ids: bit-identical
    assert got["R"].shape == (300, 6) and got["L"].shape == (1500, 6)
    # without input state: the model only (and the final part keeps only uid and L)
    assert set(export_arrays(client.model(job, inputs=False))) == {"R", "item_ids"}


def test_running_job_export_is_a_snapshot_at_an_epoch_end(client, ratings):
    args = ["--input", ratings, "--max-epochs", "100000", *NMF_ARGS]
    job = client.submit("nmf.py", NMF_SRC, args, machines=1, checkpoint_every=0,
                        checkpoint_seconds=0)
    try:
        _wait_epochs(client, job, 2)
        with pytest.raises(ClientError, match="has no checkpoint yet"):
            client.model(job, fresh=False)          # periodic checkpoints are off
        asked = client.status(job)["epochs_total"]
        model = client.model(job, wait_s=60)        # fresh: at its next epoch end
        ep = model.source.epoch
        assert model.source.state == "running" and not model.source.final
        assert ep >= asked - 1
        got = export_arrays(model)
        # the latest checkpoint is now that snapshot
        assert client.model(job, fresh=False).source.epoch == ep
    finally:
        client.cancel(job)
    _, want = _nmf_reference(["--input", ratings, "--max-epochs", str(ep + 1), *NMF_ARGS])
    _assert_same(got, want)
    with pytest.raises(ClientError, match="cancelled: its checkpoints were dropped"):
        client.model(job)


def test_two_machine_snapshot_matches_the_metrics_of_its_epoch(client, ratings):
    args = ["--input", ratings, "--max-epochs", "100000", *NMF_ARGS]
    job = client.submit("nmf.py", NMF_SRC, args, machines=2, checkpoint_every=0,
                        checkpoint_seconds=0)
    try:
        _wait_epochs(client, job, 1)
        model = client.model(job, wait_s=60)
        ep = model.source.epoch
        assert len(model.source.parts) == 2
        got = export_arrays(model)
        _wait_epochs(client, job, ep + 1)
        reported = client.status(job)["epochs"][ep]["metrics"]
    finally:
        client.cancel(job)
    cls = load_app(NMF_SRC, "nmf.py")
    data = np.loadtxt(ratings)
    users, items, r = data[:, 0].astype(np.int64), data[:, 1].astype(np.int64), data[:, 2]
    test = cls.read_input.__globals__["holdout_mask"](users, items, 0.1, 0)
    assert np.array_equal(got["user_ids"], np.unique(users))   # every user, from both machines
    L = got["L"][np.searchsorted(got["user_ids"], users)].astype(np.float64)
    err = np.einsum("ij,ij->i", L, got["R"][items].astype(np.float64)) - r
    for name, sel in (("rmse", ~test), ("test_rmse", test)):
        assert math.isclose(math.sqrt(np.mean(err[sel] ** 2)), reported[name], rel_tol=1e-5)


@pytest.fixture(scope="module")
def app_data(tmp_path_factory):
    d = tmp_path_factory.mktemp("export")
    f = {k: str(d / v) for k, v in (("mlr", "m.svm"), ("lasso", "l.svm"),
                                     ("lda", "docword.txt"), ("vocab", "vocab.txt"))}
    gen_mlr(f["mlr"], samples=1000, features=50, classes=4, nnz=50, noise=0.5, seed=1)
    gen_lasso(f["lasso"], samples=300, features=80, nonzeros=8, noise=0.3, seed=2)
    gen_lda(f["lda"], docs=300, vocab=200, topics=5, doc_len=40, seed=7, vocab_path=f["vocab"])
    return f


def _app_args(name, f):
    return {
        "minimal": ["--max-epochs", "5", "--samples", "800"],
        "mlr": ["--input", f["mlr"], "--max-epochs", "3"],
        "lasso": ["--input", f["lasso"], "--lam", "0.05", "--max-epochs", "10", "--intercept"],
        "lda": ["--input", f["lda"], "--vocab", f["vocab"], "--topics", "5", "--blocks", "8",
                "--max-epochs", "4"],
        # torch's reductions depend on its thread count (on this AMD host, 1 and
        # 2 threads differ in the last bit): the reference runs with 1 thread,
        # so the executor must too, not the machine's cores
        "torch_mlp": ["--max-epochs", "2", "--blocks", "8", "--hidden", "32", "--threads", "1"],
    }[name]


def _reference(name, args):
    """run_local's model through the app's exporter, with the export meta
    of an app that read the input."""
    cls = load_app(_src(name), f"{name}.py")
    res = run_local(cls, args)
    app = cls(parse_app_args(cls, args))
    for _ in app.read_input(InputPart(0, 1, app.opts.blocks)):
        pass
    return app, app.export(np.arange(len(res.model)), res.model, app.export_meta())


@pytest.mark.parametrize("name", ["minimal", "mlr", "lasso", "lda", "torch_mlp"])
def test_every_app_exports_its_model(client, app_data, name, tmp_path):
    args = _app_args(name, app_data)
    job = client.submit(f"{name}.py", _src(name), args, machines=1)
    st = wait_state(client, job, ("finished", "failed"))
    assert st["state"] == "finished", st["error"]
    got = export_arrays(client.model(job))
    app, want = _reference(name, args)
    _assert_same(got, want)
    if name == "minimal":
        assert got["w"].shape == (20,)
    elif name == "mlr":
        assert got["W"].shape == (4, 50) and got["bias"].shape == (4,)
        assert got["classes"].tolist() == [0, 1, 2, 3] and int(got["index_base"]) == 1
    elif name == "lasso":
        assert got["coef"].shape == (80,) and int(got["index_base"]) == 1
        # the text form is the app's own --model-out file
        out = tmp_path / "coef.txt"
        run_local(type(app), args + ["--model-out", str(out)])
        assert app.export_text(got) == out.read_text()
    elif name == "lda":
        assert got["word_topic"].shape == (200, 5)
        assert got["topic_totals"].sum() == st["epochs"][-1]["metrics"]["tokens"]
        vocab = open(app_data["vocab"]).read().split("\n")
        assert got["top_words"].shape == (5, 10)
        assert got["top_words"].tolist() == [[vocab[i] for i in r]
                                             for r in got["top_word_ids"].tolist()]
    elif name == "torch_mlp":
        import torch
        from harmony.torch_helper import ModuleRows
        net = app.net
        assert list(got) == [k for k, _ in net.named_parameters()]
        net.load_state_dict({k: torch.from_numpy(v) for k, v in got.items()})
        assert np.array_equal(ModuleRows(net).flatten().reshape(-1)[:sum(
            v.size for v in got.values())], np.concatenate([v.reshape(-1)
                                                            for v in got.values()]))


def test_cli_model_get_submit_save_model_and_top_words(cluster, app_data, tmp_path):
    ep = cluster.endpoint
    out = tmp_path / "lda.npz"
    args = ["--input", app_data["lda"], "--vocab", app_data["vocab"], "--topics", "5",
            "--blocks", "8", "--max-epochs", "3"]
    r = run_cli("submit", str(ROOT / "apps" / "lda.py"), "--master", ep, "--save-model",
                str(out), *args)
    assert r.returncode == 0, r.stderr
    job = r.stdout.split()[0]
    assert f"wrote {out} (npz): {job} (lda.py) after epoch 3, final checkpoint" in r.stdout
    z = np.load(out)
    assert z["word_topic"].shape == (200, 5) and z["top_words"].shape == (5, 10)
    assert '"job": "%s"' % job in str(z["harmony_info"])
    txt = tmp_path / "top.txt"
    r = run_cli("model", "get", job, "--out", str(txt), "--master", ep)
    assert r.returncode == 0, r.stderr
    lines = txt.read_text().splitlines()
    assert len(lines) == 5 and lines[0].startswith("topic   0: ")
    assert lines[0].split()[2:] == z["top_words"][0].tolist()
    r = run_cli("status", job, "--top-words", "--master", ep)
    assert r.returncode == 0, r.stderr
    assert "checkpoint final, after epoch 3" in r.stdout
    assert "top words after epoch 3 (final checkpoint):" in r.stdout
    assert "  " + lines[0] in r.stdout
    # a directory as --out: a clear error, and no temporary file left in it
    d = tmp_path / "outdir"
    d.mkdir()
    r = run_cli("model", "get", job, "--out", str(d), "--master", ep)
    assert r.returncode == 1 and "is a directory" in r.stderr, r.stderr
    assert not list(tmp_path.glob("outdir*.tmp*")) and not list(d.iterdir())
    r = run_cli("model", "get", "job-9999", "--out", str(tmp_path / "x.npz"), "--master", ep)
    assert r.returncode == 1 and "no job 'job-9999'" in r.stderr
    # a failed job keeps no checkpoint (a docword file is no ratings file)
    with Client(ep) as c:
        bad = c.submit("nmf.py", NMF_SRC, ["--input", app_data["lda"]], machines=1)
        assert wait_state(c, bad, ("finished", "failed"))["state"] == "failed"
    r = run_cli("model", "get", bad, "--out", str(tmp_path / "x.npz"), "--master", ep)
    assert r.returncode == 1 and f"{bad} failed: its checkpoints were dropped" in r.stderr
    assert not (tmp_path / "x.npz").exists()


def test_app_without_export_and_a_failing_export(client, tmp_path):
    src = _src("minimal")
    plain = src.split("    def export(")[0]              # the app without its export
    assert "def export" not in plain
    job = client.submit("plain.py", plain, ["--max-epochs", "3"], machines=1)
    assert wait_state(client, job, ("finished", "failed"))["state"] == "finished"
    with pytest.raises(ClientError, match=r"\(plain.py\) exports no top words"):
        top_words_lines(client, job, trust_app=True)
    got = export_arrays(client.model(job, trust_app=True))
    assert set(got) == {"keys", "rows"} and got["rows"].shape == (20, 1)
    assert np.array_equal(got["keys"], np.arange(20))
    broken = plain + "\n    def export(self, keys, rows, meta):\n        return {'w': rows[9999]}\n"
    job = client.submit("broken.py", broken, ["--max-epochs", "2"], machines=1)
    assert wait_state(client, job, ("finished", "failed"))["state"] == "finished"
    with pytest.raises(ExportError, match=r"app minimal: export failed: IndexError"):
        export_arrays(client.model(job, trust_app=True))
    with pytest.raises(ClientError, match="no job 'job-9999'"):
        client.model("job-9999")


def test_an_export_runs_no_code_the_caller_did_not_vouch_for(client, tmp_path):
    """Whoever submits a job writes its app; exporting runs the app's code in
    the exporter's process. A job whose app is not a bundled one is exported
    only with the caller's own copy (--app, the same source) or --trust-app:
    otherwise refused, and its code never runs here."""
    marker = tmp_path / "ran-in-the-exporter"
    src = (f"import os\nif os.getpid() == {os.getpid()}:\n    open({str(marker)!r}, 'w')\n"
           + _src("minimal"))
    job = client.submit("evil.py", src, ["--max-epochs", "2"], machines=1)
    assert wait_state(client, job, ("finished", "failed"))["state"] == "finished"
    with pytest.raises(ClientError, match=r"not a bundled app.*--app FILE.*--trust-app"):
        client.model(job)
    with pytest.raises(ClientError, match="exports no top words|not a bundled app"):
        top_words_lines(client, job)
    other = tmp_path / "evil.py"
    other.write_text(_src("minimal"))
    with pytest.raises(ClientError, match=r"--app .* is not the app job-\d+ ran"):
        client.model(job, app_file=str(other))
    r = run_cli("model", "get", job, "--out", str(tmp_path / "m.npz"), "--master",
                client.master)
    assert r.returncode == 1 and "--trust-app" in r.stderr, r.stderr
    assert not marker.exists() and not (tmp_path / "m.npz").exists()
    other.write_text(src)                      # the caller's own copy: it vouches
    assert "w" in export_arrays(client.model(job, app_file=str(other)))
    assert marker.exists()
    # a bundled app's source needs no vouching
    job = client.submit("minimal.py", _src("minimal"), ["--max-epochs", "2"], machines=1)
    assert wait_state(client, job, ("finished", "failed"))["state"] == "finished"
    assert "w" in export_arrays(client.model(job))


def test_only_the_most_recent_finished_jobs_keep_their_model(tmp_path):
    """The master's retention and its answers, without a cluster."""
    import zmq

    from harmony.comm import messages as M
    from harmony.export import Source, fetch, vouch
    from harmony.master.jobs import Job, JobState
    from harmony.master.core import MasterCore
    m = MasterCore(keep_models=1)
    try:
        sent = []
        m._send = lambda ident, payload, fail=None: sent.append(
            M.decode([M.encode(payload[0], **payload[1])]))
        for i, ended in enumerate((20.0, 10.0, 30.0)):
            job = Job(id=f"job-{i}", app_name="minimal.py", app_source=_src("minimal"),
                      args=[], machines=1, state=JobState.FINISHED, ended=ended)
            job.checkpoint = {"epoch": 3, "time": ended, "parts": 1, "replicas": 0, "bytes": 1,
                              "holders": ["m0"], "final": True,
                              "model": [{"index": 0, "epoch": 3, "holders": ["m0"]}]}
            m.jobs[job.id] = job
        m._retain_models()
        assert [j for j in ("job-0", "job-1", "job-2") if m.jobs[j].checkpoint] == ["job-2"]
        m._on_model_parts(b"c", M.Message("model_parts", {"job": "job-0"}, []))
        assert sent[-1].type == "error" and sent[-1]["code"] == "no_model"
        assert "only the 1 most recently finished job(s) keep" in sent[-1]["message"]
        m._on_model_parts(b"c", M.Message("model_parts", {"job": "job-2", "fresh": True}, []))
        src = Source.of(sent[-1])
        assert src.final and src.epoch == 3 and not src.pending
        assert src.parts == [{"index": 0, "epoch": 3, "sources": []}]   # m0 is not alive
        ctx = zmq.Context()
        try:
            with pytest.raises(ExportError, match="could not be read from any holder: no "
                                                  "holder alive"):
                fetch(ctx, vouch(src))      # a bundled app: vouched for
        finally:
            ctx.term()
    finally:
        pass
