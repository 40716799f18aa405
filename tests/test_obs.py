"""The master's dashboard and /metrics (harmony.obs) on a real local cluster
with two jobs: Prometheus text parsed by the client library's parser, the
snapshot API, the token, and the page rendered by headless Chromium."""
import fcntl
import json
import os
import re
import select
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from apps_for_tests import TOY_APP
from conftest import NMF_APP, ROOT, wait_state
from harmony.client import Client
from harmony.cluster import LocalCluster


@pytest.fixture(scope="module")
def obs_cluster(tmp_path_factory, ratings):
    cl = LocalCluster(2, str(tmp_path_factory.mktemp("obs-cluster")), port=0,
                      mode="harmony")
    cl.start()
    try:
        with Client(cl.endpoint) as c:
            dash = c.dashboard()
            # the long job on both machines: the short one shares a machine
            # with it (subtasks wait in the queues there)
            long = c.submit("toy.py", TOY_APP, ["--max-epochs", "100000", "--sleep", "0.02"],
                            2, name="long")
            # placed before the short one comes: submitted together, the two
            # would be a batch, profiled on one machine each
            wait_state(c, long, ("profiling", "running"))
            short = c.submit("nmf.py", NMF_APP.read_text(),
                             ["--input", ratings, "--max-epochs", "4"], 1)
            wait_state(c, short, ("finished",))
            deadline = time.time() + 60
            while len(c.status(long)["epochs"]) < 3:
                assert time.time() < deadline
                time.sleep(0.2)
        # a snapshot published after that, holding every machine's heartbeat
        # statistics (a heartbeat carries them every few seconds: the jobs
        # above may finish before the first one does)
        deadline = time.time() + 60
        while True:
            snap = json.loads(_get(dash["url"] + "api/snapshot", dash["token"])[1])
            if len(snap["machines"]) == 2 and all(m["timeline"] for m in snap["machines"]):
                break
            assert time.time() < deadline, "no heartbeat statistics in 60 s"
            time.sleep(0.3)
        time.sleep(1.5)
        yield cl, dash, long, short
    finally:
        cl.stop()


def _get(url, token=None, header=False):
    req = urllib.request.Request(url + (f"?token={token}" if token and not header else ""))
    if token and header:
        req.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.status, r.read().decode()


def _snapshot_when(dash, cond, timeout_s: float = 60.0) -> dict:
    """The first snapshot for which ``cond(snapshot)`` holds, fetched every
    0.2 s for at most ``timeout_s``. The task stream fills only while
    someone fetches snapshots: the fetch is seen at the dashboard's next
    publish (1 s), the next heartbeat's ack asks the daemons for their
    subtasks (1 s), the one after carries those that ended (1 s), and the
    next publish shows them: up to ~4 s after the first fetch."""
    deadline = time.time() + timeout_s
    while True:
        snap = json.loads(_get(dash["url"] + "api/snapshot", dash["token"])[1])
        if cond(snap):
            return snap
        assert time.time() < deadline, {m["name"]: len(m["tasks"]) for m in snap["machines"]}
        time.sleep(0.2)


def test_dashboard_url_and_token(obs_cluster):
    cl, dash, _, _ = obs_cluster
    assert cl.dashboard_url and dash["url"] == cl.dashboard_url
    assert dash["url"].startswith("http://127.0.0.1:") and dash["token"].count(".") >= 3
    for path in ("", "api/snapshot", "metrics"):
        with pytest.raises(urllib.error.HTTPError) as e:
            _get(dash["url"] + path)
        assert e.value.code == 401
        with pytest.raises(urllib.error.HTTPError):
            _get(dash["url"] + path, "0" * 40)
        # an expired or altered token, or one minted under the cluster key a
        # worker holds (as tokens were before), is refused
        exp, role, rest = dash["token"].split(".", 2)
        for bad in (f"{int(exp) - 40 * 86400}.{role}.{rest}",
                    dash["token"][:-1] + ("0" if dash["token"][-1] != "0" else "1")):
            with pytest.raises(urllib.error.HTTPError):
                _get(dash["url"] + path, bad)
    assert _get(dash["url"] + "healthz")[0] == 200
    # the token goes only to client and reader keys
    from harmony.comm import security
    from harmony.client import ClientError
    with Client(cl.endpoint, keys=security.Keys.load(cl.keys, "reader", "reader")) as c:
        tok = c.dashboard()["token"]
        assert tok and tok != dash["token"] and _get(dash["url"] + "metrics", tok)[0] == 200
    with Client(cl.endpoint, keys=security.Keys.load(cl.keys, "worker", "m0")) as c:
        with pytest.raises(ClientError, match="not allowed"):
            c.dashboard()
        with pytest.raises(ClientError, match="not allowed"):
            c.log_sources("job-0001")


def test_metrics_scrape(obs_cluster):
    cl, dash, long, short = obs_cluster
    # the job counts are those the master lists (the fixture's short job
    # finished and its long one running, plus any job a test of this module
    # ran before this one); the metrics come from a snapshot published every
    # few seconds, so they may lag the list by one publish: scrape again
    # until they agree (bounded)
    deadline = time.time() + 20
    while True:
        with Client(cl.endpoint) as c:
            states = [j["state"] for j in c.jobs(all=True)]
        status, text = _get(dash["url"] + "metrics", dash["token"], header=True)
        assert status == 200
        fams = {f.name: f for f in text_string_to_metric_families(text)}
        val = lambda fam, **lb: [s.value for s in fams[fam].samples  # noqa: E731
                                 if all(s.labels.get(k) == v for k, v in lb.items())]
        finished = states.count("finished")
        running = states.count("running") + states.count("profiling")
        got = (val("harmony_jobs", state="finished"),
               val("harmony_jobs", state="running") + val("harmony_jobs", state="profiling"))
        if got[0] == [float(finished)] and got[1] and sum(got[1]) == running:
            break
        assert time.time() < deadline, (states, got)
        time.sleep(0.5)
    assert finished >= 1 and running >= 1
    assert fams["harmony_job_epochs"].type == "counter"
    assert val("harmony_job_epochs", job_id=short) == [4.0]
    assert val("harmony_job_epochs", job_id=long)[0] >= 3
    with Client(cl.endpoint) as c:
        st = c.status(short)
    assert val("harmony_job_objective", job_id=short) == [st["epochs"][-1]["metrics"]["objective"]]
    assert val("harmony_job_data_bytes", job_id=short)[0] > 0
    assert val("harmony_job_phase_seconds", job_id=short, phase="comp")[0] > 0
    assert val("harmony_machine_up", machine="m0") == [1.0]
    assert val("harmony_machine_up", machine="m1") == [1.0]
    assert len(val("harmony_machine_utilization_ratio", resource="cpu")) == 2
    assert val("harmony_scheduler_decisions")[0] >= 1
    assert val("harmony_store_alpha_ratio", job_id=short)            # from the executors' reports
    assert val("harmony_job_checkpoints", job_id=short)[0] >= 1    # its final checkpoint
    # PS bytes by direction, summed over the job's machines (harmony mode:
    # a PULL and a PUSH per iteration, of the same rows)
    pulled = val("harmony_job_bytes_pulled", job_id=short)
    pushed = val("harmony_job_bytes_pushed", job_id=short)
    assert pulled and pushed and pulled[0] > 0 and pushed[0] > 0
    # per machine and resource, the subtask queues' waits, runs and counts
    # (harmony mode: every PULL, COMP and PUSH goes through the queues); the
    # two jobs' COMPs on a shared machine wait for each other
    for r in ("cpu", "net"):
        done = val("harmony_subtasks", resource=r)
        assert len(done) == 2 and max(done) >= 4, (r, done)
        assert max(val("harmony_subtasks_granted", resource=r)) >= max(done)
        assert max(val("harmony_queue_run_seconds", resource=r)) > 0
        assert len(val("harmony_queue_wait_seconds", resource=r)) == 2
    assert max(val("harmony_queue_wait_seconds", resource="cpu")
               + val("harmony_queue_wait_seconds", resource="net")) > 0
    for name in ("harmony_job_migrations", "harmony_store_reload_bytes",
                 "harmony_group_predicted_iteration_seconds"):
        assert name in fams
    # the state dir's disk, per machine (the store-full alert)
    for m in ("m0", "m1"):
        free = val("harmony_machine_disk_free_bytes", machine=m)
        total = val("harmony_machine_disk_total_bytes", machine=m)
        assert free and total and 0 < free[0] <= total[0]
    # every metric the shipped alert rules use is one the master exports
    rules = yaml.safe_load((ROOT / "deploy" / "prometheus" / "alerts.yml").read_text())
    exprs = [r["expr"] for g in rules["groups"] for r in g["rules"]]
    assert len(exprs) == 3
    used = {n for e in exprs for n in re.findall(r"\bharmony_[a-z_]+", e)}
    assert used and used <= set(fams), used - set(fams)
    prom = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    assert prom["rule_files"] == ["alerts.yml"]
    assert prom["scrape_configs"][0]["metrics_path"] == "/metrics"


def test_snapshot_api(obs_cluster):
    _, dash, long, short = obs_cluster
    snap = json.loads(_get(dash["url"] + "api/snapshot", dash["token"])[1])
    jobs = {j["id"]: j for j in snap["jobs"]}
    assert jobs[short]["state"] == "finished" and jobs[short]["epoch"] == 4
    assert len(jobs[short]["curve"]) == 4 and jobs[short]["max_epochs"] == 4
    assert jobs[long]["name"] == "long" and jobs[long]["eta"] is not None
    assert {m["name"] for m in snap["machines"]} == {"m0", "m1"}
    assert all(m["timeline"] for m in snap["machines"])
    assert snap["decisions"] and snap["decisions_total"] >= 1


def test_the_task_stream_shows_each_machines_subtasks_while_watched(obs_cluster):
    """#37 item 7: while someone fetches snapshots, the daemons' heartbeats
    carry the subtasks that ended and each machine's entry holds those of
    the last minute ([start, end, job, kind], seconds before now)."""
    _, dash, long, _ = obs_cluster
    snap = _snapshot_when(dash, lambda snap: all(any(t[2] == long for t in m["tasks"])
                                                 for m in snap["machines"]))
    tasks = {m["name"]: m["tasks"] for m in snap["machines"]}
    for name, ts in tasks.items():
        assert all(-60.5 <= a <= b <= 0.5 and kind in ("cpu", "net") for a, b, _, kind in ts)
        mine = [t for t in ts if t[2] == long]
        assert {t[3] for t in mine} == {"cpu", "net"}, (name, mine[:5])


def _answer(req: urllib.request.Request, timeout: float) -> tuple[int, object]:
    """An HTTP request's status and its JSON body (or text, for an error
    that is not JSON)."""
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        body = exc.read()
        return exc.code, (json.loads(body) if body.startswith(b"{") else body.decode())


def _post(url, token=None, header=True):
    req = urllib.request.Request(url + (f"&token={token}" if token else ""), data=b"",
                                 method="POST")
    if header:
        req.add_header("X-Harmony-Dashboard", "1")
    return _answer(req, 10)


def test_the_dashboards_buttons_pause_resume_and_cancel_for_a_client_key(obs_cluster):
    """#37 item 7: POST /api/control does what the CLI does, for the token's
    key; a reader's token, a request without the dashboard's header (another
    site's form) and a bad action are refused, and the job is untouched."""
    from harmony.comm import security
    cl, dash, _, _ = obs_cluster
    with Client(cl.endpoint) as c:
        job = c.submit("toy.py", TOY_APP, ["--max-epochs", "100000", "--sleep", "0.02"], 1)
        wait_state(c, job, ("running",))
        with Client(cl.endpoint, keys=security.Keys.load(cl.keys, "reader", "reader")) as r:
            reader = r.dashboard()["token"]
        base = dash["url"] + f"api/control?job={job}&action="
        assert _post(base + "pause", reader)[0] == 403
        assert _post(base + "pause", dash["token"], header=False)[0] == 403
        assert _post(base + "explode", dash["token"])[0] == 400
        assert _post(base + "pause")[0] == 401
        assert c.status(job)["state"] == "running"
        code, body = _post(base + "pause", dash["token"])
        assert code == 200 and body == {"ok": True, "job": job, "state": "pausing"}, body
        wait_state(c, job, ("paused",))
        code, body = _post(base + "resume", dash["token"])
        assert code == 200 and body["ok"], body
        wait_state(c, job, ("running", "profiling"))
        code, body = _post(base + "cancel", dash["token"])
        assert code == 200 and body["state"] == "cancelled", body
        code, body = _post(base + "cancel", dash["token"])
        assert code == 409 and "already cancelled" in body["error"], body


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


class _Chromium:
    """One headless Chromium that renders several pages, driven over its
    DevTools pipe (its fds 3 and 4). :meth:`dom` is what ``chromium
    --headless --virtual-time-budget=B --dump-dom URL`` prints, by the same
    steps: virtual time paused, the page navigated, then run ahead while no
    fetch is pending until B ms of it have passed, and the DOM read; without
    a browser start per page."""

    def __init__(self, args: list[str], stderr) -> None:
        cmd_r, self._cmd = os.pipe()
        self._out, out_w = os.pipe()
        a, b = (fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (cmd_r, out_w))
        for fd in (cmd_r, out_w):
            os.close(fd)
        # the browser reads commands on its fd 3 and writes answers on its fd 4
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "import os, sys; a, b = map(int, sys.argv[1:3]); "
             "os.dup2(a, 3); os.dup2(b, 4); os.close(a); os.close(b); "
             "os.execv(sys.argv[3], sys.argv[3:])", str(a), str(b), *args,
             "--remote-debugging-pipe", "about:blank"],
            pass_fds=(a, b), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=stderr)
        os.close(a)
        os.close(b)
        self._buf, self._id = b"", 0

    def _call(self, method: str, params: dict | None = None, session: str | None = None,
              timeout_s: float = 120.0, until: str | None = None) -> dict:
        """Send a command; its result, or (``until``) the params of the
        first event of that name from ``session`` after it."""
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params or {}}
        if session is not None:
            msg["sessionId"] = session
        os.write(self._cmd, json.dumps(msg).encode() + b"\0")
        deadline, result = time.monotonic() + timeout_s, None
        while True:
            while b"\0" not in self._buf:
                left = deadline - time.monotonic()
                assert left > 0 and select.select([self._out], [], [], left)[0], \
                    f"no answer to {method} in {timeout_s:.0f} s"
                chunk = os.read(self._out, 1 << 20)
                assert chunk, f"the browser exited (rc {self.proc.wait(10)})"
                self._buf += chunk
            raw, self._buf = self._buf.split(b"\0", 1)
            m = json.loads(raw)
            if m.get("id") == self._id:
                assert "error" not in m, (method, m["error"])
                result = m["result"]
            elif until is not None and m.get("method") == until \
                    and m.get("sessionId") == session:
                return m["params"]
            if result is not None and until is None:
                return result

    def dom(self, url: str, budget_ms: int = 8000) -> str:
        target = self._call("Target.createTarget", {"url": "about:blank"})["targetId"]
        s = self._call("Target.attachToTarget", {"targetId": target, "flatten": True})
        s = s["sessionId"]
        self._call("Emulation.setVirtualTimePolicy", {"policy": "pause"}, s)
        self._call("Page.navigate", {"url": url}, s)
        self._call("Emulation.setVirtualTimePolicy",
                   {"policy": "pauseIfNetworkFetchesPending", "budget": budget_ms}, s,
                   until="Emulation.virtualTimeBudgetExpired")
        out = self._call("Runtime.evaluate", {"expression": "document.documentElement.outerHTML"},
                         s)["result"]["value"]
        self._call("Target.closeTarget", {"targetId": target})
        return out

    def close(self) -> None:
        try:
            self._call("Browser.close", timeout_s=10)
        except AssertionError:
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._cmd)
        os.close(self._out)


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium on this machine (Debian: apt-get "
                                              "install chromium; .ci/run installs it as root)")
def test_dashboard_renders_in_chromium(obs_cluster, tmp_path):
    cl, dash, long, short = obs_cluster
    # the task stream asserted below holds the subtasks that ended since
    # someone first fetched a snapshot (alone, this test is the first to):
    # render once the snapshot holds one of m0's
    _snapshot_when(dash, lambda snap: any(
        t[2] == long and t[3] == "cpu" for m in snap["machines"] if m["name"] == "m0"
        for t in m["tasks"]))
    url = f"{dash['url']}?token={dash['token']}"
    args = [CHROMIUM, "--headless", "--disable-gpu", "--no-first-run",
            f"--user-data-dir={tmp_path / 'profile'}"]
    if os.geteuid() == 0:
        args.append("--no-sandbox")
    # one browser renders every page below (each as --dump-dom would)
    with open(tmp_path / "chromium.log", "w+") as err:
        browser = _Chromium(args, err)
        try:
            dom = browser.dom(url)
            err.seek(0)
            assert "data-updated=" in dom, (err.read()[-2000:], dom[:2000])
            pages = {j: browser.dom(f"{url}#job={j}") for j in (short, long)}
            # a job whose log holds HTML
            evil = TOY_APP.replace("    def read_input(self, part):\n",
                                   "    def read_input(self, part):\n"
                                   "        print('<img src=x onerror=alert(1)><b>bold</b>"
                                   "&amp;', flush=True)\n")
            assert evil != TOY_APP
            with Client(cl.endpoint) as c:
                job = c.submit("toy.py", evil, ["--max-epochs", "100000", "--sleep", "0.02"], 1)
                try:
                    wait_state(c, job, ("running",))
                    pages[job] = browser.dom(f"{url}#job={job}")
                finally:
                    c.cancel(job)
        finally:
            browser.close()
    # the job table: one row per job, with its state
    assert re.search(rf'<tr data-job="{short}" data-state="finished">', dom)
    assert re.search(rf'<tr data-job="{long}" data-state="(running|profiling)">', dom)
    # charts with points: each job's objective curve, each machine's utilization
    obj = dom[dom.index('id="objective"'):]
    counts = {m.group(1): int(m.group(2)) for m in re.finditer(
        r'data-name="(job-\d+) [^"]*" data-points="(\d+)"', obj)}
    assert counts.get(short) == 4 and counts.get(long, 0) >= 3
    assert dom.count('class="point"') >= 7
    assert re.search(r'data-machine="m0".*?data-name="CPU" data-points="[1-9]', dom, re.S)
    # memory: per machine (the executors' share of its memory) and the cluster's
    assert re.search(r'data-machine="m0".*?data-name="memory" data-points="[1-9]', dom, re.S)
    assert re.search(r'GiB used by jobs', dom)
    assert re.search(r'<h3>m0 \(\d+ cores, [\d.]+ GiB, disk [\d.]+ of [\d.]+ GiB free', dom)
    assert "<li>" in dom[dom.index('id="decisions"'):] or "<li " in dom
    # the task stream: the long job's COMP and COMM on m0
    assert re.search(rf'data-machine="m0".*?class="task"[^>]*data-job="{long}" '
                     rf'data-kind="cpu"', dom, re.S), dom[dom.index('data-machine="m0"'):][:3000]
    # a job's page (#37 item 7): its story, why, checkpoint, start-ups and
    # iterations per epoch, drawn from the same snapshot
    page = pages[short][pages[short].index('id="jobpage"'):]
    page = page[:page.index("</section>")]
    assert re.search(rf'data-job="{short}" data-state="finished"', page), page[:2000]
    assert 'data-event-state="finished"' in page and 'data-event-state="waiting"' in page
    assert re.search(r'data-fact="checkpoint">after epoch 4 at .*?\(final\)', page), page
    assert re.search(r'data-fact="start-up">machine 0: [\d.]+s \([\d.]+s CPU\)', page), page
    assert re.search(r'data-name="measured" data-points="4"', page), page
    assert f"harmony logs {short}" in page
    assert "<button" not in page             # a finished job has no controls
    # its logs, streamed into the page (#37 item 7): the machine that ran it
    logs = pages[short][pages[short].index('id="joblogs"'):]
    logs = logs[:logs.index("</section>")]
    assert f'data-job="{short}"' in logs and "hidden" not in logs[:200], logs[:500]
    assert re.search(r'<pre class="logtext" data-machine="m\d">==&gt; ' + short +
                     r'\.0\.\d+ &lt;==\n.*epoch 3:.*checkpoint after epoch 3', logs, re.S), \
        logs[:3000]
    page = pages[long][pages[long].index('id="jobpage"'):]
    assert re.search(r'<button type="button" data-action="pause">pause</button>', page), page
    assert 'data-action="cancel"' in page
    # a log that holds HTML shows as text: nothing in it becomes an element
    logs = pages[job][pages[job].index('id="joblogs"'):]
    logs = logs[:logs.index("</section>")]
    assert "&lt;img src=x onerror=alert(1)&gt;&lt;b&gt;bold&lt;/b&gt;&amp;amp;" in logs, \
        logs[:3000]
    assert "<img" not in logs and "<b>" not in logs
    if os.environ.get("HARMONY_SCREENSHOT"):     # docs/dashboard.png
        subprocess.run(args + ["--virtual-time-budget=8000", "--hide-scrollbars",
                               "--window-size=1400,1250",
                               f"--screenshot={os.environ['HARMONY_SCREENSHOT']}", url],
                       capture_output=True, timeout=120)


# -- logs from anywhere (harmony logs) ------------------------------------------------
def test_logs_of_a_finished_job_are_kept_and_fetched(obs_cluster):
    from conftest import run_cli
    cl, _, long, short = obs_cluster
    r = run_cli("logs", short, "--master", cl.endpoint)
    assert r.returncode == 0, r.stderr
    assert re.search(r"==> m\d: " + short + r"\.0\.\d+ <==", r.stdout)
    assert "epoch 3:" in r.stdout and "checkpoint after epoch 3" in r.stdout
    # a read-only key may read logs too
    r2 = run_cli("logs", short, "--master", cl.endpoint, env={"HARMONY_KEY_NAME": "reader"})
    assert r2.returncode == 0 and r2.stdout == r.stdout
    r = run_cli("logs", short, "--master", cl.endpoint, "--list")
    assert r.returncode == 0 and f"{short}.0." in r.stdout
    r = run_cli("logs", long, "--master", cl.endpoint)      # a running job's, live
    assert r.returncode == 0 and "(live)" in r.stdout and "epoch 1:" in r.stdout


def test_logs_follow_until_the_job_ends(tmp_path):
    """On a machine of its own: beside the module's long job the scheduler
    may pause it after profiling (a poor pair), and a paused job does not
    end. On this VM in session 25 it was paused after epoch 3, at session
    24's commit too, and --follow waited out its 120 s."""
    from conftest import run_cli
    cl = LocalCluster(1, str(tmp_path / "cl"), port=0, dashboard=False)
    cl.start()
    try:
        with Client(cl.endpoint) as c:
            job = c.submit("toy.py", TOY_APP, ["--max-epochs", "6", "--sleep", "0.1"], 1)
        r = run_cli("logs", job, "--follow", "--master", cl.endpoint, timeout=120)
    finally:
        cl.stop()
    assert r.returncode == 0, r.stderr
    assert "epoch 5:" in r.stdout       # the last epoch: it followed to the end


def test_logs_refuse_worker_keys(obs_cluster):
    import zmq
    from harmony.comm import security
    from harmony.obs import logs as L
    cl, _, _, short = obs_cluster
    with Client(cl.endpoint) as c:
        places = c.log_sources(short)
    worker = security.Keys.load(cl.keys, "worker", "m0")
    ctx = zmq.Context()
    try:
        with pytest.raises(PermissionError, match="not allowed"):
            L.fetch(ctx, places[0][1], short, keys=worker)
        # and a reader key still gets only logs from a data service, no checkpoints
        from harmony.comm import messages as M
        from harmony.comm.zmqutil import make_socket
        reader = security.Keys.load(cl.keys, "reader", "reader")
        s = make_socket(ctx, zmq.DEALER, keys=reader)
        s.connect(places[0][1])
        s.send(M.encode("ckpt_manifest", job=short, epoch=3, index=0))
        assert s.poll(10000)
        r = M.decode(s.recv_multipart())
        s.close(linger=0)
        assert r.type == "error" and r["code"] == "forbidden"
    finally:
        ctx.term()


# -- the job page's logs, streamed (#37 item 7) ----------------------------------------
def _logs_api(dash, job, at=None, token=None):
    """GET /api/logs: (status, JSON body)."""
    q = "api/logs?" + urllib.parse.urlencode({"job": job, **({"offsets": json.dumps(at)}
                                                              if at is not None else {})})
    req = urllib.request.Request(dash["url"] + q)
    if token is not False:
        req.add_header("Authorization", f"Bearer {token or dash['token']}")
    return _answer(req, 15)


def test_the_job_pages_logs_stream_from_every_machine(obs_cluster):
    """GET /api/logs: a running job's logs from both its machines, each
    machine's about last 64 KiB from a line's start at first, then only
    what follows the offsets the page sends; a finished job's kept logs; a
    reader's token may read them, no token may not; a bad or unknown job
    and bad offsets are refused with a reason."""
    from harmony.comm import security
    from harmony.obs.dashboard import LOG_CHUNK
    cl, dash, long, short = obs_cluster
    assert _logs_api(dash, long, token=False)[0] == 401
    assert _logs_api(dash, long, token="0" * 40)[0] == 401
    code, body = _logs_api(dash, long)
    assert code == 200 and body["ok"] and body["job"] == long, body
    got = {m["machine"]: m for m in body["machines"]}
    assert set(got) == {"m0", "m1"} and body["left_out"] == 0, body
    for m in got.values():
        assert m["name"].startswith(f"{long}.") and m["live"], m
        assert "epoch " in m["text"] and len(m["text"].encode()) <= LOG_CHUNK
        assert m["next"] == m["offset"] + len(m["text"].encode()) <= m["size"] + LOG_CHUNK
        if m["offset"] > 0:                  # the log's end, from a line's start
            assert re.match(r"\d{4}-\d\d-\d\d ", m["text"]), m["text"][:200]
    # from the offsets the page has: only what follows, and it goes on
    at = {n: [m["name"], m["next"]] for n, m in got.items()}
    deadline = time.time() + 30
    grew = set()
    while grew != {"m0", "m1"}:
        assert time.time() < deadline, (at, grew)
        time.sleep(0.5)
        code, body = _logs_api(dash, long, at)
        assert code == 200, body
        for m in body["machines"]:
            assert m["offset"] == at[m["machine"]][1] and m["name"] == at[m["machine"]][0], m
            assert m["next"] == m["offset"] + len(m["text"].encode())
            if m["text"]:
                assert re.search(r"epoch \d+:", m["text"])
                grew.add(m["machine"])
            at[m["machine"]] = [m["name"], m["next"]]
    # a finished job's logs: kept, read to their end
    code, body = _logs_api(dash, short)
    assert code == 200 and body["machines"], body
    for m in body["machines"]:
        assert not m["live"] and m["next"] == m["size"] and "epoch 3:" in m["text"], m
    assert {m["machine"] for m in body["machines"]} | set(body["quiet"]) == {"m0", "m1"}
    m = body["machines"][0]
    # the page's log there gave way to a newer attempt's: from 0 again
    code, body = _logs_api(dash, short, {m["machine"]: [f"{short}.0.0", 10]})
    r = next(x for x in body["machines"] if x["machine"] == m["machine"])
    assert r["restart"] and r["next"] == 0 and r["text"] == "" and r["name"] == m["name"], r
    # a reader may read them
    with Client(cl.endpoint, keys=security.Keys.load(cl.keys, "reader", "reader")) as c:
        reader = c.dashboard()["token"]
    code, body = _logs_api(dash, short, token=reader)
    assert code == 200 and body["machines"][0]["text"] == m["text"], body
    # refusals with a reason
    code, body = _logs_api(dash, "job-9999")
    assert code == 404 and "no job 'job-9999'" in body["error"], body
    for bad in ("../etc", "", "x" * 200):
        code, body = _logs_api(dash, bad)
        assert code == 400 and "job=" in body["error"], (bad, body)
    for at in ({"m0": ["x", -1]}, {"../m0": [None, 0]}, {"m0": "x"}, [1]):
        code, body = _logs_api(dash, long, at)
        assert code == 400 and "offsets=" in body["error"], (at, body)


def test_log_fetches_do_not_wait_for_a_dead_machine(obs_cluster):
    """The dashboard asks the data services all at once, within one
    deadline: a machine that does not answer is reported after it, the
    others' logs come back, each at most max_bytes."""
    import socket
    import zmq
    from harmony.comm import security
    from harmony.obs import logs as L
    cl, _, long, _ = obs_cluster
    with Client(cl.endpoint) as c:
        places = c.log_sources(long)
    with socket.socket() as s:           # a port where nothing listens
        s.bind(("127.0.0.1", 0))
        dead = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    ctx = zmq.Context()
    try:
        t0 = time.monotonic()
        got = L.fetch_many(ctx, [(m, ep, 0) for m, ep in places] + [("gone", dead, 0)], long,
                           keys=security.Keys.load(cl.keys, "reader", "dashboard"),
                           timeout_s=1.5, max_bytes=1000)
        took = time.monotonic() - t0
    finally:
        ctx.term()
    assert got["gone"] == {"error": "no answer within 1.5 s"}
    for m, _ in places:
        assert got[m]["offset"] == 0 and 0 < len(got[m]["text"].encode()) <= 1000, got[m]
    assert took < 1.5 + 3, took          # one deadline for all: not one per machine


def test_a_master_without_the_dashboards_reader_key_says_so(tmp_path):
    """The data services serve logs to client and reader keys only: a
    master whose key set lacks the reader key 'dashboard' (its secret) has
    its log page say so, and where to read them instead."""
    from harmony.comm import security
    from harmony.obs import dashboard as D
    keys = security.init_keys(str(tmp_path / "keys"), readers=["reader"])
    lk, why = D._log_keys(keys)
    assert lk is None and "'dashboard'" in why and "harmony logs" in why
    security.init_keys(keys, readers=["dashboard"])
    lk, why = D._log_keys(keys)
    assert lk is not None and (lk.role, lk.name) == ("reader", "dashboard") and why == ""
    obs = D.ObsServer("127.0.0.1", 0, keys=security.Keys.load(keys, "master"))
    try:
        obs.log_why = "no key"
        assert obs.logs("job-0001", {}, "client", "admin") == (503, {"ok": False,
                                                                     "error": "no key"})
    finally:
        obs.httpd.server_close()


def test_log_reads_keep_utf8_whole_and_offsets_exact(tmp_path):
    """A read cut inside a UTF-8 character ends before it (the next read
    starts there; unless that leaves nothing: a read of 1-3 bytes); bytes
    that are not UTF-8 read as one "?" each, so a reader's next offset
    (offset + its text's UTF-8 length) is exact; a negative offset reads
    about the end, from a line's start."""
    from harmony.obs import logs as L
    d = tmp_path / "jobs" / "job-0001.0.1"
    d.mkdir(parents=True)
    data = "line one\nété ✓ 😀\n".encode() + b"bad \xff\xfe bytes\n" + "last ✓\n".encode()
    (d / "executor.log").write_bytes(data)
    sd = str(tmp_path)
    for step in range(1, 12):
        off, text = 0, ""
        while off < len(data):
            r = L.read(sd, "m0", "job-0001", off, max_bytes=step)
            assert r["offset"] == off and r["text"], (step, off)
            off += len(r["text"].encode())
            text += r["text"]
        assert off == len(data)
        if step >= 4:       # room for any character (below: a lone lead byte reads "?")
            assert text == data.decode("utf-8", "replace").replace("\ufffd", "?"), step
    r = L.read(sd, "m0", "job-0001", -12)
    assert r["text"] == "last ✓\n" and r["offset"] == len(data) - len("last ✓\n".encode())
    assert L.read(sd, "m0", "job-0001", -10**6)["offset"] == 0


def test_kept_logs_have_size_and_age_limits(tmp_path):
    from harmony.obs import logs as L
    sd = str(tmp_path)
    for i in range(5):
        d = tmp_path / "jobs" / f"job-000{i}.0.1"
        d.mkdir(parents=True)
        (d / "executor.log").write_text("x" * 1000)
        os.utime(d / "executor.log", (1000 + i, 1000 + i))
        L.retire(sd, str(d), keep_bytes=10**9, keep_seconds=1e12)
        assert not d.exists()
    kept = sorted(os.listdir(tmp_path / "logs"))
    assert kept == [f"job-000{i}.0.1.log" for i in range(5)]
    assert L.find(sd, "job-0003")[0]["name"] == "job-0003.0.1"
    assert L.prune(sd, keep_bytes=2500, keep_seconds=1e12) == 3      # the oldest go first
    assert sorted(os.listdir(tmp_path / "logs")) == ["job-0003.0.1.log", "job-0004.0.1.log"]
    assert L.prune(sd, keep_bytes=10**9, keep_seconds=60) == 2        # too old
    assert L.find(sd, "../etc") == [] and L.find(sd, "job-0004") == []


def test_report_pngs_of_the_run(obs_cluster, tmp_path):
    pytest.importorskip("matplotlib", reason="harmony report needs matplotlib ([report] extra)")
    from conftest import run_cli
    cl, _, long, short = obs_cluster
    out = tmp_path / "rep"
    r = run_cli("report", "--state-dir", cl.state_dir, "--out", str(out), timeout=180)
    assert r.returncode == 0, r.stderr
    for name in ("utilization.png", "iteration.png", "jct.png", "objective.png"):
        data = (out / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000, name
    summary = json.loads((out / "summary.json").read_text())
    jobs = {j["id"]: j for j in summary["jobs"]}
    assert jobs[short]["epochs"] == 4 and jobs[short]["state"] == "finished"
    assert set(summary["machines"]) == {"m0", "m1"}
    # no master: what the metrics logs hold, said
    r = run_cli("report", "--metrics", os.path.join(cl.state_dir, "master", "metrics"),
                "--master", "tcp://127.0.0.1:1", "--out", str(tmp_path / "r2"),
                env={"HARMONY_CLIENT_TIMEOUT": "1"}, timeout=180)
    assert r.returncode == 0 and "no job table" in r.stderr
    assert (tmp_path / "r2" / "utilization.png").exists()
    assert not (tmp_path / "r2" / "objective.png").exists()


def test_snapshots_kept_between_builds_equal_a_fresh_one_and_encode_the_same():
    """Each machine's timeline is kept from one snapshot to the next (only
    new heartbeats are converted) and encoded in pieces: after heartbeats,
    a window past TIMELINE, a machine that registers again, one that leaves
    and one that joins, a snapshot equals one built from nothing, its
    machines' job lists equal a scan of every job, and its JSON is
    ``json.dumps``' (as data)."""
    import collections
    import types
    from unittest import mock
    from harmony.master.jobs import Job, JobState
    from harmony.obs import snapshot as S

    def worker(name: str, n: int, t0: float = 0.0):
        return types.SimpleNamespace(name=name, host="h", cpus=2, memory=1, alive=True,
                                     last_seen=0, stats=collections.deque(
                                         [_sample(t0 + i) for i in range(n)], maxlen=3600))

    def _sample(t: float) -> dict:
        return {"t": t, "dt": 1.0, "cpu": 0.5, "net": t % 3, "q_cpu": 0.2, "mem": 7.0,
                "qg_cpu": int(t), "qw_cpu": 0.5, "qd_cpu": 3, "qr_cpu": 1.5, "qg_net": 9,
                "qw_net": 0.25, "qd_net": 8, "qr_net": 2.0}

    def beat(w, k: int = 1) -> None:
        for _ in range(k):
            w.stats.append(_sample(w.stats[-1]["t"] + 1 if w.stats else 0.0))

    ws = {f"m{i}": worker(f"m{i}", i) for i in range(4)}
    jobs = {}
    for k, (state, on) in enumerate([(JobState.RUNNING, ["m0", "m1"]),
                                     (JobState.PROFILING, ["m1"]),
                                     (JobState.PAUSED, []), (JobState.RUNNING, ["m3", "m1"])]):
        j = Job(id=f"job-{k:04d}", app_name="a.py", app_source="", args=[], machines=2,
                submitted=0.0, entered=0.0)
        j.transition(state if state != JobState.PAUSED else JobState.RUNNING, now=0.0)
        if state == JobState.PAUSED:
            j.transition(state, now=0.0)
        j.workers = on
        jobs[j.id] = j
    m = types.SimpleNamespace(jobs=jobs, workers=ws, runs={}, mode="harmony", endpoint="e",
                              state_dir="")
    enc = S.SnapshotEncoder()

    def same() -> None:
        with mock.patch.object(S.time, "time", return_value=1000.0):
            kept = S.build_snapshot(m)
            fresh = S.build_snapshot(types.SimpleNamespace(**vars(m)))   # another master
        assert kept == fresh
        for mach in kept["machines"]:
            assert mach["jobs"] == [j.id for j in sorted(jobs.values(), key=lambda j: j.id)
                                    if j.state.active and mach["name"] in j.workers]
            assert len(mach["timeline"]) == min(S.TIMELINE, len(ws[mach["name"]].stats))
        assert json.loads(enc.encode(kept)) == json.loads(json.dumps(kept))

    same()
    for w in ws.values():
        beat(w)
    same()
    same()                                  # nothing new
    beat(ws["m2"], S.TIMELINE + 7)          # past the window
    beat(ws["m0"], 3)
    same()
    beat(ws["m2"], 2)                       # the full window moves on
    same()
    ws["m1"] = worker("m1", 2, t0=50.0)     # registered again: a new record
    del ws["m3"]
    ws["m9"] = worker("m9", 5)
    same()
    jobs["job-0000"].transition(JobState.FINISHED, now=1.0)
    beat(ws["m9"])
    same()


def test_snapshot_of_a_master_object_without_io(tmp_path):
    """build_snapshot reads only the master's attributes (and its decisions log)."""
    import collections
    import types
    from harmony.master.jobs import Job, JobState
    from harmony.obs import metrics as OM
    from harmony.obs.snapshot import build_snapshot, max_epochs
    assert max_epochs(["--max-epochs", "12"]) == 12 and max_epochs(["--max-epochs=3"]) == 3
    assert max_epochs([]) == 10
    j = Job(id="job-0001", app_name="nmf.py", app_source="", args=["--max-epochs=7"],
            machines=1)
    j.transition(JobState.RUNNING, "go")
    j.workers = ["m0"]
    for e in range(3):
        j.epochs.append({"epoch": e, "metrics": {"objective": 10.0 / (e + 1)},
                         "timings": {"bytes": 5.0, "bytes_pull": 4.0, "bytes_push": 2.0,
                                     "comp": 0.1}, "time": time.time()})
    (tmp_path / "metrics").mkdir()
    (tmp_path / "metrics" / "decisions.jsonl").write_text(
        json.dumps({"t": 1.0, "note": "arrival of job-0001: stays", "start": {},
                    "predicted": {"g1": 0.5}}) + "\n")
    w = types.SimpleNamespace(name="m0", host="h", cpus=2, memory=1, alive=True, last_seen=0,
                              stats=collections.deque([{"t": 1.0, "cpu": 0.5, "q_cpu": 0.2,
                                                        "qg_cpu": 4, "qw_cpu": 0.5,
                                                        "qd_cpu": 3, "qr_cpu": 1.5,
                                                        "qg_net": 9, "qw_net": 0.25,
                                                        "qd_net": 8, "qr_net": 2.0}]))
    m = types.SimpleNamespace(jobs={j.id: j}, workers={"m0": w}, runs={}, mode="harmony",
                              endpoint="tcp://x:1", state_dir=str(tmp_path))
    snap = build_snapshot(m)
    json.dumps(snap, allow_nan=False)
    job = snap["jobs"][0]
    assert (job["max_epochs"], job["epoch"], job["data_bytes"]) == (7, 3, 15.0)
    assert (job["bytes_pulled"], job["bytes_pushed"]) == (12.0, 6.0)
    assert snap["machines"][0]["queues"] == {
        "cpu": {"granted": 4, "wait": 0.5, "done": 3, "run": 1.5},
        "net": {"granted": 9, "wait": 0.25, "done": 8, "run": 2.0}}
    assert job["objective"] == 10.0 / 3 and job["eta"] is not None
    assert snap["machines"][0]["jobs"] == ["job-0001"]
    assert snap["decisions"][0]["note"] == "arrival of job-0001: stays"
    c = OM.SnapshotCollector()
    c.observe(snap)
    fams = {f.name: f for f in text_string_to_metric_families(
        OM.exposition(OM.make_registry(c)).decode())}
    assert fams["harmony_scheduler_decisions"].samples[0].value == 1
    assert fams["harmony_queue_busy_ratio"].samples[0].value == 0.2
    val = lambda fam, **lb: [(x.name, x.value) for x in fams[fam].samples  # noqa: E731
                             if all(x.labels.get(k) == v for k, v in lb.items())]
    assert val("harmony_job_bytes_pulled", job_id="job-0001") == [
        ("harmony_job_bytes_pulled_total", 12.0)]
    assert val("harmony_job_bytes_pushed", job_id="job-0001") == [
        ("harmony_job_bytes_pushed_total", 6.0)]
    for fam, r, v in (("harmony_queue_wait_seconds", "cpu", 0.5),
                      ("harmony_queue_run_seconds", "net", 2.0),
                      ("harmony_subtasks_granted", "net", 9), ("harmony_subtasks", "cpu", 3)):
        assert fams[fam].type == "counter"
        assert val(fam, machine="m0", resource=r) == [(fam + "_total", v)]


def test_a_running_jobs_byte_sums_add_only_its_new_epochs():
    """The snapshot is built every second: a running job's byte sums carry
    on from the last build (only new epochs are read), and start over when
    its epochs are not those counted (a resume drops the epochs after its
    checkpoint)."""
    from harmony.master.jobs import Job, JobState
    from harmony.obs.snapshot import _job_cached

    read = []

    class Timings(dict):        # an epoch's timings that note when its bytes are read
        def get(self, k, d=None):
            if k == "bytes":
                read.append(self["e"])
            return super().get(k, d)

    def epoch(e, b):
        return {"epoch": e, "metrics": {}, "time": 1.0,
                "timings": Timings(e=e, bytes=b, bytes_pull=2 * b, bytes_push=3 * b)}
    j = Job(id="job-0001", app_name="nmf.py", app_source="", args=[], machines=1)
    j.transition(JobState.RUNNING, "go")
    j.epochs += [epoch(e, 1.0) for e in range(3)]
    cache: dict = {}
    assert _job_cached(cache, j, 2.0)["bytes_pushed"] == 9.0
    read.clear()
    j.epochs += [epoch(e, 10.0) for e in (3, 4)]
    got = _job_cached(cache, j, 3.0)
    assert (got["data_bytes"], got["bytes_pulled"]) == (23.0, 46.0)
    assert sorted(set(read)) == [3, 4]          # the new epochs only (not 0-2 again)
    del j.epochs[3:]                            # resumed from epoch 2's checkpoint
    j.epochs += [epoch(3, 100.0), epoch(4, 100.0)]
    assert _job_cached(cache, j, 4.0)["data_bytes"] == 203.0
    j.transition(JobState.FINISHED, "done")
    assert _job_cached(cache, j, 5.0)["data_bytes"] == 203.0


NODE = shutil.which("node") or shutil.which("nodejs")


@pytest.mark.skipif(NODE is None, reason="no node on this machine (Debian: apt-get install nodejs)")
def test_dashboard_numbers_keep_the_zeros_of_integers():
    """app.js's num(): 200 epochs is "200", not "2" (it stripped every
    trailing zero, so every axis past 100 epochs was wrong); fractions lose
    only their trailing zeros."""
    from importlib import resources
    src = (resources.files("harmony.obs") / "static" / "app.js").read_text()
    fn = re.search(r"function num\(v, digits\) \{.*?\n  \}", src, re.S).group(0)
    cases = [200, 150, 120000, 100, 10, 0, 0.5, 2.5, 1.25, 3.1, 1e-7, 1.5e21, -40, 123456789]
    code = fn + ("\nconsole.log(JSON.stringify(" + json.dumps(cases) + ".map(v => num(v))"
                 ".concat([num(200, 3), num(150, 3), num(0.25, 3)])));")
    out = subprocess.run([NODE, "-e", code], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == ["200", "150", "120000", "100", "10", "0", "0.5", "2.5",
                                      "1.25", "3.1", "1e-7", "1.5e+21", "-40", "1.23457e+8",
                                      "200", "150", "0.25"]


def test_eta_counts_down_only_while_the_job_runs():
    """A job paused (or waiting, profiled) after 2 of 6 epochs of 10 s each
    keeps its 40 s of work left, however long it waits; running, the ETA
    counts down from its last epoch. The same in the snapshot (dashboard,
    /metrics) and in `harmony submit --wait`'s progress."""
    from harmony.master.jobs import Job, JobState
    from harmony.obs.progress import eta
    from harmony.obs.snapshot import _job
    now = time.time()
    j = Job(id="job-0001", app_name="nmf.py", app_source="", args=["--max-epochs=6"],
            machines=1)
    j.transition(JobState.RUNNING, "go", now=now - 100.0)
    j.epochs = [{"epoch": e, "metrics": {}, "timings": {}, "time": now - 100.0 + 10.0 * (e + 1)}
                for e in range(2)]
    assert _job(j, now)["eta"] == pytest.approx(0.0)          # 80 s since: ran out
    assert _job(j, now - 75.0)["eta"] == pytest.approx(35.0)  # 5 s after its last epoch
    j.transition(JobState.PAUSED, "waits", now=now - 70.0)
    assert _job(j, now)["eta"] == pytest.approx(40.0)
    st = {"state": "paused", "started": j.started, "epochs": j.epochs}
    assert eta(st, 6) == pytest.approx(40.0)
    assert eta(dict(st, state="running"), 6) == pytest.approx(0.0)


def test_report_splits_a_jct_by_the_time_in_each_state():
    """harmony report's JCT chart: a job paused for 30 s in the middle of
    its run counts those 30 s as waiting, not running (the chart took
    everything from its start to its end as running)."""
    from harmony.obs.report import jct_split
    job = {"submitted": 0.0, "started": 5.0, "ended": 75.0,
           "state_time": {"waiting": 5.0, "running": 40.0, "paused": 30.0}}
    assert jct_split(job) == (35.0, 40.0)
    old = {"submitted": 0.0, "started": 5.0, "ended": 75.0}     # a record without it
    assert jct_split(old) == (5.0, 70.0)


def test_a_dashboard_on_every_address_warns_and_names_this_machine(tmp_path, caplog):
    """--dashboard-host 0.0.0.0: a warning that it serves plain HTTP, and a
    URL others can use (it printed 127.0.0.1)."""
    import logging
    import socket
    from harmony.obs.dashboard import ObsServer
    with caplog.at_level(logging.WARNING, logger="harmony.obs"):
        obs = ObsServer("0.0.0.0", 0, None, str(tmp_path))
    try:
        assert "127.0.0.1" not in obs.url
        assert (socket.getfqdn() or socket.gethostname()) in obs.url
        assert any("plain HTTP" in r.getMessage() for r in caplog.records)
        assert json.loads((tmp_path / "dashboard.json").read_text())["url"] == obs.url
    finally:
        obs.httpd.server_close()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="harmony.obs"):
        obs = ObsServer("127.0.0.1", 0, None, None)
    obs.httpd.server_close()
    assert obs.url.startswith("http://127.0.0.1:") and not caplog.records


def test_dashboard_tokens_expire_and_only_the_master_can_make_them(tmp_path):
    """A token names its key and expiry and is made under the master's own
    dashboard secret (kept in its state dir, mode 0600, so tokens survive a
    restart): the cluster key a worker holds cannot make one; an expired
    one, or one of a key the key set no longer holds, is refused."""
    import os
    import stat
    import types
    from harmony.obs.dashboard import TOKEN_TTL, ObsServer, secret_of, token_for
    keys = types.SimpleNamespace(known={b"k1": ("client", "alice"), b"k2": ("reader", "bob"),
                                        b"k3": ("worker", "m0")})
    obs = ObsServer("127.0.0.1", 0, keys, str(tmp_path))
    obs.httpd.server_close()
    assert stat.S_IMODE(os.stat(tmp_path / "dashboard.secret").st_mode) == 0o600
    assert secret_of(str(tmp_path)) == obs.secret             # the same after a restart
    info = obs.info("client", "alice")
    assert obs.allowed(info["token"]) and info["expires"] > time.time() + TOKEN_TTL - 60
    assert not obs.allowed(info["token"], now=info["expires"] + 1)
    assert not obs.allowed(token_for(b"\0" * 32, "client", "alice", info["expires"]))
    assert not obs.allowed(token_for(obs.secret, "worker", "m0", info["expires"]))
    assert not obs.allowed(token_for(obs.secret, "client", "mallory", info["expires"]))
    keys.known.pop(b"k1")                                       # the key is removed
    assert not obs.allowed(info["token"])
    assert obs.allowed(obs.info("reader", "bob")["token"])
    for junk in ("", "x", "1.2", "a.b.c.d", "9" * 600):
        assert not obs.allowed(junk)
