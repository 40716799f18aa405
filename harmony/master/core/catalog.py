"""The staged-data catalog (``harmony data``): where each data set's chunks
are placed, their records, listing and removal, the data sets a launch
reads, and re-replication when a holder is lost."""
from __future__ import annotations

from harmony.comm import messages as M
from harmony.master.core.protocol import _err, _msg
from harmony.master.core.state import CoreState, log
from harmony.master.jobs import Job
from harmony.store import datanames as staging

#: a put planned this long ago and not committed is taken as dead: its
#: chunks may be removed (data rm of a name the catalog does not hold)
PUT_S = 600.0


class Catalog(CoreState):
    def _datasets_for(self, job: Job) -> dict | None:
        """The catalog entries of the data sets a job reads (harmony://NAME),
        with the data services of the live machines holding each chunk."""
        out = {}
        for name in staging.refs(job.args):
            rec = self.datasets.get(name)
            if rec is None:
                continue     # removed since: the executor fails naming it
            out[name] = {"name": name, "filename": rec["filename"], "chunks": [
                {"i": c["i"], "sha": c["sha"], "sources": [
                    [h, self.workers[h].data_endpoint] for h in c["holders"]
                    if h in self.workers and self.workers[h].alive]}
                for c in rec["chunks"]]}
        return out or None

    # -- staged input ------------------------------------------------------------------------
    def _on_data_plan(self, ident: bytes, msg: M.Message) -> None:
        try:
            name = staging.check_name(msg["name"])
        except staging.StagingError as exc:
            return self._send(ident, _err("bad_request", str(exc)))
        if name in self.datasets:
            return self._send(ident, _err("exists", f"data set {name!r} exists; 'harmony "
                                                       f"data rm {name}' first"))
        live = sorted((w for w in self.workers.values() if w.alive and w.data_endpoint),
                      key=lambda w: w.name)
        if not live:
            return self._send(ident, _err("no_workers", "no live worker to hold the data"))
        n = msg["chunks"]
        if not 0 <= n <= M.MAX_DATA_CHUNKS:     # its catalog record must reach the master
            return self._send(ident, _err("bad_request", f"a data set has at most "
                                                            f"{M.MAX_DATA_CHUNKS} chunks"))
        holders = []
        for i in range(n):
            hs = [live[i % len(live)]] + ([live[(i + 1) % len(live)]] if len(live) > 1 else [])
            holders.append([[w.name, w.data_endpoint] for w in hs])
        self.puts[name] = self.now
        if len(self.puts) > 1024:          # bounded: the oldest plans are forgotten
            for old in sorted(self.puts, key=self.puts.get)[:len(self.puts) - 1024]:
                del self.puts[old]
        self._send(ident, _msg("data_placement", holders=holders))

    def _on_data_commit(self, ident: bytes, msg: M.Message) -> None:
        try:
            name = staging.check_name(msg["name"])
            chunks = [{"i": int(c["i"]), "sha": bytes(c["sha"]), "size": int(c["size"]),
                       "first_line": int(c["first_line"]),
                       "holders": [str(h) for h in c["holders"]]} for c in msg["chunks"]]
        except (staging.StagingError, KeyError, TypeError, ValueError) as exc:
            return self._send(ident, _err("bad_request", f"bad data set record: {exc}"))
        if name in self.datasets:      # as data_plan: never a silent replacement
            return self._send(ident, _err("exists", f"data set {name!r} exists; 'harmony "
                                                       f"data rm {name}' first"))
        unknown = sorted({h for c in chunks for h in c["holders"]} - set(self.workers))
        why = (f"unknown holder(s) {unknown[:5]}" if unknown else
               "chunks are not numbered 0..n-1" if [c["i"] for c in chunks] !=
               list(range(len(chunks))) else
               "a chunk without a holder, a SHA-256 or a size" if any(
                   not c["holders"] or len(c["sha"]) != 32 or c["size"] < 0 for c in chunks)
               else "")
        if why:
            return self._send(ident, _err("bad_request", f"bad data set record: {why}"))
        rec = {"name": name, "filename": msg["filename"].replace("\\", "/").rsplit("/", 1)[-1],
               "size": msg["size"], "chunks": chunks, "created": self.now}
        self.datasets[name] = rec
        self.puts.pop(name, None)
        self._persist("save_dataset", rec)
        log.info("data set %s staged: %d chunk(s), %d bytes", name, len(chunks), msg["size"])
        self._send(ident, _msg("ok", info={"name": name, "chunks": len(chunks)}))

    def _on_data_list(self, ident: bytes, msg: M.Message) -> None:
        out = []
        for rec in sorted(self.datasets.values(), key=lambda r: r["name"]):
            holders = sorted({h for c in rec["chunks"] for h in c["holders"]})
            alive = {h for h in holders if h in self.workers and self.workers[h].alive}
            lost = sum(1 for c in rec["chunks"] if not alive & set(c["holders"]))
            copies = min((len(alive & set(c["holders"])) for c in rec["chunks"]), default=0)
            out.append({"name": rec["name"], "filename": rec["filename"], "size": rec["size"],
                        "chunks": len(rec["chunks"]), "holders": holders,
                        "unavailable_chunks": lost, "min_copies": copies,
                        "created": rec["created"]})
        self._send(ident, _msg("datasets", datasets=out))

    def _rereplicate(self, lost: str) -> None:
        """A worker holding staged chunks was lost: copy each of its chunks
        from a live holder to another live worker, so two copies remain."""
        live = sorted(w.name for w in self.workers.values() if w.alive and w.data_endpoint)
        for rec in self.datasets.values():
            plan: dict[tuple[str, str], list[int]] = {}
            for c in rec["chunks"]:
                if lost not in c["holders"]:
                    continue
                have = [h for h in c["holders"] if h in live]
                spare = [n for n in live if n not in c["holders"]]
                if not have or not spare:
                    continue
                to = spare[c["i"] % len(spare)]
                plan.setdefault((have[0], to), []).append(c["i"])
            for (src, to), chunks in plan.items():
                self._send(self.workers[src].ident, _msg(
                    "data_copy", name=rec["name"], chunks=chunks, to=to,
                    endpoint=self.workers[to].data_endpoint))
                log.info("data set %s: copying %d chunk(s) %s -> %s (%s lost)", rec["name"],
                         len(chunks), src, to, lost)

    def _on_data_copied(self, ident: bytes, msg: M.Message) -> None:
        if ident not in self.by_ident:
            return
        rec = self.datasets.get(msg["name"])
        if rec is None:
            return
        if not msg["ok"]:
            log.warning("data set %s: re-replication to %s failed: %s", msg["name"], msg["to"],
                        msg.get("error"))
            return
        want = {int(i) for i in msg["chunks"]}
        for c in rec["chunks"]:
            if c["i"] in want and msg["to"] not in c["holders"]:
                c["holders"] = [h for h in c["holders"] if h in self.workers
                                and self.workers[h].alive] + [msg["to"]]
        self._persist("save_dataset", rec)

    def _on_data_rm(self, ident: bytes, msg: M.Message) -> None:
        if msg["name"] not in self.datasets:
            # a put that never committed (its client or this master died) left
            # its chunks on the workers: they drop whatever they hold of it,
            # unless a put of that name is in flight now
            try:
                name = staging.check_name(msg["name"])
            except staging.StagingError as exc:
                return self._send(ident, _err("bad_request", str(exc)))
            planned = self.puts.get(name)
            if planned is not None and self.now - planned < PUT_S:
                return self._send(ident, _err("in_use", (
                    f"data set {name!r} is being put (planned {self.now - planned:.0f} s "
                    f"ago): wait for it to end, then remove it")))
            self.puts.pop(name, None)
            gc = _msg("data_gc", name=name)
            for w in self.workers.values():
                if w.alive:
                    self._send(w.ident, gc)
            return self._send(ident, _msg("ok", info={"name": name, "recorded": False}))
        readers = sorted(j.id for j in self.jobs.values() if not j.state.terminal
                         and msg["name"] in staging.refs(j.args))
        if readers:
            # a paused or requeued job reads its input again when it resumes
            return self._send(ident, _err("in_use", (
                f"data set {msg['name']!r} is read by job(s) {', '.join(readers[:10])}"
                f"{' and more' if len(readers) > 10 else ''}: cancel them or wait until "
                f"they end, then remove it")))
        rec = self.datasets.pop(msg["name"])
        self._persist("drop_dataset", rec["name"])
        gc = _msg("data_gc", name=rec["name"])
        for w in self.workers.values():
            if w.alive:
                self._send(w.ident, gc)
        self._send(ident, _msg("ok", info={"name": rec["name"]}))
