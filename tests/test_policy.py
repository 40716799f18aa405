"""The placement policies as pure functions (cluster view in, decision out)."""
from harmony.policies.simple import isolated, least_loaded
from harmony.policies.view import ClusterView, JobView, WorkerView


def machines(*loads, groups=None):
    groups = groups or [()] * len(loads)
    return tuple(WorkerView(f"m{i}", 1, 1 << 30, n, g)
                 for i, (n, g) in enumerate(zip(loads, groups)))


def waiting(*specs):
    return tuple(JobView(f"job-{i}", dop, float(i), group) for i, (dop, group) in
                 enumerate(specs))


def test_colocate_shares_the_least_loaded_machines_fifo():
    dec = least_loaded(ClusterView(machines(1, 0, 2), waiting((2, ""), (1, ""))))
    assert dec.start == {"job-0": ["m1", "m0"], "job-1": ["m1"]}


def test_colocate_caps_the_jobs_per_machine():
    jobs = waiting((2, ""), (2, ""), (2, ""), (2, ""))
    dec = least_loaded(ClusterView(machines(0, 0), jobs, max_jobs=2))
    assert list(dec.start) == ["job-0", "job-1"]                  # two share, two wait
    assert least_loaded(ClusterView(machines(2, 2), jobs, max_jobs=2)).start == {}
    # one machine full: a DoP-2 job waits and does not let a later one overtake
    dec = least_loaded(ClusterView(machines(2, 1), waiting((2, ""), (1, "")), max_jobs=2))
    assert dec.start == {}
    assert least_loaded(ClusterView(machines(5, 5), jobs)).start      # 0: no limit


def test_colocate_caps_groups_too():
    ms = machines(2, 0, groups=[("g",), ()])
    dec = least_loaded(ClusterView(ms, waiting((1, "g"), (1, "h")), max_jobs=2))
    assert dec.start == {}                       # g's machine is full: g waits, FIFO
    dec = least_loaded(ClusterView(ms, waiting((1, "h"), (1, "g")), max_jobs=3))
    assert dec.start == {"job-0": ["m1"], "job-1": ["m0"]}


def test_isolated_gives_each_job_free_machines():
    dec = isolated(ClusterView(machines(0, 1, 0), waiting((1, ""), (1, ""), (1, ""))))
    assert dec.start == {"job-0": ["m0"], "job-1": ["m2"]}


def test_match_is_the_muri_style_policy_and_muri_its_alias():
    from harmony.policies import registry as P
    from harmony.sim.run import setup
    assert P.POLICIES["match"] is P.POLICIES["muri"]
    assert setup("match") == ("match", "harmony")      # its pairs need the subtask queues


def test_a_views_profile_is_its_own_jobs():
    """A job's view carries its profile as the model's Profile, named by the
    job: another job's profile in it is refused (the policies key profiles
    by the Profile's id)."""
    import pytest

    from harmony.sched.model import Profile
    mine = JobView("a", 1, 0.0, state="profiled", profile=Profile("a", 1.0, 0.5, 2))
    assert (mine.profile.t_cpu, mine.profile.dop) == (1.0, 2)
    with pytest.raises(ValueError, match="profile is b's"):
        JobView("a", 1, 0.0, state="profiled", profile=Profile("b", 1.0, 0.5, 2))
