"""The production benchmark's pure parts: what a stock baseline engine is started with, the
order engine sets run in, the idle check's reading of vLLM's metrics, and the report's
arithmetic (lost turns, TPOT, spread, the strongest baseline per figure)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from boomerang.connector import config as connector
from boomerang.connector.config import EngineSettings, KVTransferSettings

from bench.harness import engine_watch, stock
from bench.production import report
from bench.production.modes import (
    AA,
    BASELINES,
    DEFAULT_MODE,
    MODES,
    PEERS,
    QUIET_BASELINES,
    REGIMES,
    longest_prompt,
    order,
)


def boomerang_args() -> list[str]:
    engine = EngineSettings(model="/m", served_model_name="tiny", host="127.0.0.1", port=8100)
    return connector.engine_args("decode", engine, KVTransferSettings(bidirectional=False))


def test_a_stock_engine_gets_the_same_arguments_without_boomerangs_code() -> None:
    ours = boomerang_args()
    assert "--middleware" in ours and "--worker-extension-cls" in ours
    theirs = stock.stock_args(ours)
    assert "--middleware" not in theirs and "--worker-extension-cls" not in theirs
    assert not any("boomerang" in a for a in theirs)
    kv = json.loads(theirs[theirs.index("--kv-transfer-config") + 1])
    ours_kv = json.loads(ours[ours.index("--kv-transfer-config") + 1])
    assert kv == {
        "kv_connector": "NixlConnector",
        "kv_role": ours_kv["kv_role"],
        "kv_buffer_device": kv["kv_buffer_device"],
        "kv_connector_extra_config": {"backends": ["UCX"]},
    }
    # Everything else is kept, in order: model, ports, prefix caching, events, template flags.
    dropped = {"--middleware", "--worker-extension-cls", "--kv-transfer-config"}
    kept = [a for a in ours if a.startswith("--") and a not in dropped]
    assert [a for a in theirs if a.startswith("--") and a != "--kv-transfer-config"] == kept


def test_a_stock_engine_has_no_plugin_and_no_boomerang_variable() -> None:
    env = stock.stock_env({"BOOMERANG_ROLE": "decode", "BOOMERANG_KV_CPUS": "1", "A": "b"})
    assert env == {"A": "b", "VLLM_PLUGINS": ""}


def test_engine_sets_never_interleave_and_modes_alternate() -> None:
    modes = ["vllm-proxy", "affinity", "static", "adaptive"]
    sets = order(modes, 4)
    assert [MODES[s[0]].engines for s in sets] == ["stock", "boomerang", "stock"]
    with_quiet = order([*modes, "affinity@quiet", "decode-first-512@quiet"], 2)
    kinds = [MODES[s[0]].engines for s in with_quiet]
    assert kinds == ["stock", "quiet", "boomerang", "stock"]  # quiet beside Boomerang's
    for s in sets:
        assert len({MODES[m].engines for m in s}) == 1  # one kind of engine per set
    assert sets[1] == ["static", "adaptive", "adaptive", "static"] * 2
    assert sets[0] == ["vllm-proxy", "affinity", "affinity", "vllm-proxy"]
    runs = [m for s in sets for m in s]
    assert all(runs.count(m) == 4 for m in modes)
    # Equal engines only: the quiet rounds bracket Boomerang's, every mode in every round.
    equal = order([*PEERS, DEFAULT_MODE, AA], 3)
    assert [MODES[s[0]].engines for s in equal] == ["quiet", "boomerang", "quiet"]
    assert [len(s) for s in equal] == [2 * len(PEERS), 3 * 2, len(PEERS)]
    assert all(sum(s.count(m) for s in equal) == 3 for m in [*PEERS, DEFAULT_MODE, AA])


def test_the_default_mode_is_the_api_default_untuned() -> None:
    assert DEFAULT_MODE == "adaptive"
    assert MODES["adaptive"].router == {"tuning": {"mode": "adaptive"}}  # nothing else tuned
    assert set(BASELINES) >= {"vllm-proxy", "plain", "affinity", "decode-first-128"}
    assert all(MODES[b].engines == "stock" for b in BASELINES)
    assert set(QUIET_BASELINES) >= {"affinity@quiet", "decode-first-128@quiet",
                                    "decode-first-512@quiet", *PEERS}  # fmt: skip
    for name in QUIET_BASELINES:  # the stock policy, unchanged, on the other engines
        if name.removesuffix("@quiet") in MODES:
            assert MODES[name].router == MODES[name.removesuffix("@quiet")].router
        assert not MODES[name].bidirectional
    assert MODES[AA] == MODES[DEFAULT_MODE]  # the A/A twin is the default mode itself


def test_the_peer_policies_are_valid_router_configs_that_can_fire() -> None:
    """Each equal-engine baseline is a configuration the router accepts, and the decode-first
    ones serve a 500-3,000-token tool result on the decoder alone at some threshold."""
    from boomerang.router.config import RouterConfig

    urls = {"prefill": {"urls": ["http://p"]}, "decode": {"urls": ["http://d"]}}
    thresholds = []
    for name in PEERS:
        cfg = RouterConfig.model_validate({**urls, **(MODES[name].router or {})})
        assert not cfg.bidirectional
        thresholds.append(cfg.decode_first_tokens or 0)
    assert max(thresholds) > REGIMES["tool-results"].workload.follow_up[1]
    dynamo = RouterConfig.model_validate({**urls, **(MODES["dynamo-load@quiet"].router or {})})
    assert (dynamo.decode_first_tokens, dynamo.decode_first_ratio) == (2048, 0.7)
    assert dynamo.decode_first_p_busy_tokens is not None


def test_every_workload_fits_the_model_length() -> None:
    for name, regime in REGIMES.items():
        assert longest_prompt(regime.workload) + 100 <= regime.max_model_len, name


def test_idle_reads_running_waiting_and_kv_use_from_vllm_metrics() -> None:
    page = (
        '# HELP x\nvllm:num_requests_running{engine="0",model_name="m"} 0.0\n'
        'vllm:num_requests_waiting{engine="0",model_name="m"} 2.0\n'
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25\n'
        "vllm:num_requests_running_total 9\n"
    )
    assert engine_watch.busy(page) == {
        "vllm:num_requests_running": 0.0,
        "vllm:num_requests_waiting": 2.0,
        "vllm:kv_cache_usage_perc": 0.25,
    }


def record(turn: int, ttft: float, tpot: float = 20.0, out: int = 40, start: float = 0.0) -> Any:
    return {
        "ttft_ms": ttft, "tpot_ms": tpot, "latency_ms": ttft + tpot * out,
        "start_time_ms": start, "input_num_turns": turn, "output_num_tokens": out,
    }  # fmt: skip


def test_lost_turns_are_counted_and_tpot_skips_one_token_answers() -> None:
    records = [record(1, 1000), record(3, 100), record(5, 200, tpot=0.0, out=1)]
    s = report.summarize(records, stall_bound_s=30, expected=5)
    assert (s["turns"], s["expected"], s["lost"]) == (3, 5, 2)
    assert s["tpot_s"]["p50"] == pytest.approx(0.02)  # the one-token answer has no TPOT
    assert s["first_ttft_s"]["p50"] == 1.0
    assert s["followup_ttft_s"]["p50"] == pytest.approx(0.15)


def run(follow_p50: float, wall: float, lost: int = 0) -> dict[str, Any]:
    return {
        "summary": {
            "followup_ttft_s": {"p50": follow_p50, "p90": follow_p50, "p99": follow_p50},
            "first_ttft_s": {"p50": 1.0, "p90": 1.0, "p99": 1.0},
            "tpot_s": {"p50": 0.02, "p90": 0.02, "p99": 0.02},
            "wall_s": wall,
            "lost": lost,
            "stalled": 0,
        }
    }


def test_figures_pool_as_median_with_min_and_max() -> None:
    pooled = report.pooled([run(0.3, 50), run(0.1, 40), run(0.2, 90)])
    assert pooled["figures"]["follow-up TTFT p50"] == {"min": 0.1, "median": 0.2, "max": 0.3}
    assert pooled["figures"]["wall"] == {"min": 40, "median": 50, "max": 90}


def test_each_figure_is_compared_with_its_strongest_baseline() -> None:
    modes = {
        "a": report.pooled([run(0.5, 40)]),  # the better wall
        "b": report.pooled([run(0.2, 80)]),  # the better follow-up
        "mine": report.pooled([run(0.1, 60, lost=1)]),
    }
    r = report.ratios(modes, "mine", ["a", "b"])
    assert r["follow-up TTFT p50"]["baseline"] == "b"
    assert r["follow-up TTFT p50"]["ratio"] == pytest.approx(0.5)
    assert r["wall"]["baseline"] == "a" and r["wall"]["ratio"] == pytest.approx(1.5)
    assert report.met("wall", r["wall"]) is False
    assert report.met("follow-up TTFT p50", r["follow-up TTFT p50"]) is True
    assert report.met("lost turns", r["lost turns"]) is False  # one lost turn fails
    line = report.headline({"spare": modes}, "mine", ["a", "b"])
    assert "**1.50x vs a**" in line and "0.50x vs b" in line
    assert "**1 in 1 runs (worst run 1; fewest of a baseline 0)**" in line


def test_lost_turns_are_a_total_over_the_runs_never_a_median() -> None:
    """One run in five losing a conversation is a loss: the median (0) would hide it."""
    mine = report.pooled([run(0.1, 60), run(0.1, 60, lost=4), *[run(0.1, 60)] * 3])
    assert mine["figures"]["lost turns"]["median"] == 0
    assert (mine["lost_total"], mine["lost_max"]) == (4, 4)
    modes = {"a": report.pooled([run(0.2, 60, lost=1), run(0.2, 60)]), "mine": mine}
    r = report.ratios(modes, "mine", ["a"])["lost turns"]
    assert (r["mine"], r["base"], r["runs"]) == (4, 1, 5) and report.met("lost turns", r) is False
    assert "4 in 5 runs (worst run 4; fewest of a baseline 1)" in report.headline(
        {"spare": modes}, "mine", ["a"]
    )
    assert "| 4 total (worst run 4) |" in report.table("spare", modes)


def test_the_same_engine_headline_compares_with_the_quiet_baselines_only() -> None:
    pooled = {
        "spare": {
            "affinity": report.pooled([run(0.1, 40)]),  # stock: not in this comparison
            "affinity@quiet": report.pooled([run(0.4, 80)]),
            "adaptive": report.pooled([run(0.2, 60)]),
        }
    }
    res = {"pooled": pooled, "default_mode": "adaptive", "quiet_baselines": ["affinity@quiet"]}
    line = report.same_engine_headline(res)
    assert line is not None and "0.50x vs affinity@quiet" in line and "vs affinity |" not in line
    assert report.same_engine_headline({**res, "quiet_baselines": []}) is None  # none ran
    assert report.same_engine_headline({**res, "quiet_baselines": ["x@quiet"]}) is None
    pooled["stock only"] = {
        "affinity": pooled["spare"]["affinity"],
        "adaptive": pooled["spare"]["adaptive"],
    }
    line = report.same_engine_headline(res)
    assert line is not None and "stock only" not in line  # no quiet baseline there: no row


def test_each_quiet_policy_alone_gets_its_own_row() -> None:
    pooled = {
        "spare": {
            "affinity@quiet": report.pooled([run(0.4, 50)]),  # worse follow-ups, better wall
            "decode-first-512@quiet": report.pooled([run(0.1, 80)]),  # better follow-ups
            "adaptive": report.pooled([run(0.2, 60)]),
        }
    }
    quiet = ["affinity@quiet", "decode-first-512@quiet"]
    res = {"pooled": pooled, "default_mode": "adaptive", "quiet_baselines": quiet}
    rows = (report.per_policy(res) or "").splitlines()[2:]
    assert [r.split(" | ")[1] for r in rows] == quiet
    assert "| 0.50x |" in rows[0] and "**1.20x**" in rows[0]  # wins follow-ups, loses wall
    assert "**2.00x**" in rows[1] and "| 0.75x |" in rows[1]  # loses follow-ups, wins wall
    assert report.per_policy({**res, "quiet_baselines": ["x@quiet"]}) is None  # none ran


def test_publishing_replaces_only_what_lies_between_the_markers() -> None:
    text = "top\n<!-- a -->\nold\nrows\n<!-- b -->\nbottom\n"
    assert report.splice(text, "<!-- a -->", "<!-- b -->", "new") == (
        "top\n<!-- a -->\nnew\n<!-- b -->\nbottom\n"
    )
    with pytest.raises(ValueError, match="not found"):
        report.splice("no markers", "<!-- a -->", "<!-- b -->", "new")


def test_a_turn_answered_but_not_recorded_is_not_lost() -> None:
    from bench.harness import multiturn_client

    log = (
        "[INFO] - Client 6 is done (num_successes=9, num_failures=0)\n"
        "[INFO] - Client 2 is done (num_successes=10, num_failures=1)\n"
    )
    assert multiturn_client.answered(log) == 19
    assert multiturn_client.answered("no client finished") is None
    records = [record(1, 100.0)] * 18
    s = report.summarize(records, stall_bound_s=30, expected=20, answered=19)
    assert (s["turns"], s["answered"], s["lost"]) == (18, 19, 1)


def test_excluded_runs_are_kept_but_not_pooled() -> None:
    runs = [
        {**run(0.1 * (i + 1), 40), "serial": i, "regime": "spare", "mode": "m"} for i in range(3)
    ]
    res: dict[str, Any] = {"runs": runs, "pooled": {"spare": {"m": report.pooled(runs)}}}
    report.exclude(res, {2}, "a build shared the cores")
    assert [r["serial"] for r in res["runs"]] == [0, 1]
    assert res["excluded_runs"][0]["excluded_because"] == "a build shared the cores"
    assert res["pooled"]["spare"]["m"]["figures"]["follow-up TTFT p50"]["max"] == 0.2


def test_a_sitting_records_the_commit_its_router_ran_from(tmp_path: Any) -> None:
    """Sittings of different routers must never be read as one: the commit, dirty when the
    tree has uncommitted changes, and nothing outside a git checkout."""
    import subprocess

    from bench.production.run import source_revision

    assert source_revision(tmp_path) is None
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    (tmp_path / "f").write_text("a")
    subprocess.run([*git, "add", "f"], check=True)
    subprocess.run([*git, "commit", "-qm", "c"], check=True)
    head = subprocess.run(
        [*git, "rev-parse", "--short=7", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert source_revision(tmp_path) == head
    (tmp_path / "f").write_text("b")
    assert source_revision(tmp_path) == f"{head}-dirty"
    res = {"machine": "m", "client": "c", "rounds": 5, "default_mode": "adaptive",
           "baselines": [], "pooled": {}, "revision": f"{head}-dirty"}  # fmt: skip
    assert f"source at {head}-dirty" in report.sitting_block(res)


def sitting(regime: str, serials: range, **top: Any) -> dict[str, Any]:
    runs = [
        {**run(0.1 * (s % 10 + 1), 40), "serial": s, "regime": regime, "mode": m}
        for s in serials
        for m in ("affinity", "adaptive")
    ]
    return {
        "date": "2026-12-05", "revision": "aaaaaaa", "rounds": 5,
        "command": f'make bench-production ARGS="--regimes {regime} --out /x/{regime}"',
        "workloads": {regime: {"w": regime}}, "engine_sets": [{"regime": regime}],
        "runs": runs, "pooled": report.pooled_by_regime(runs), **top,
    }  # fmt: skip


def test_a_merged_sitting_keeps_its_date_commit_and_serials_apart() -> None:
    """A later sitting's runs join the published ones without being read as the same set:
    renamed by the label, serials past every published one (excluded runs too), each run
    naming its sitting's date and commit, the figures pooled again."""
    from bench.production import merge as production_merge

    base = sitting("2p1d", range(3))
    base["excluded_runs"] = [{**base["runs"][0], "serial": 117}]
    part = sitting("2p1d", range(2), date="2026-12-06", revision="bbbbbbb", rounds=3)
    part["excluded_runs"] = [{**part["runs"][0], "serial": 7, "excluded_because": "a build"}]
    before = json.dumps(base)
    out = production_merge.merge(base, part, "2p1d, router bbbbbbb")
    assert json.dumps(base) == before  # the published results are not changed in place
    added = [r for r in out["runs"] if r["regime"] == "2p1d, router bbbbbbb"]
    assert sorted(r["serial"] for r in added) == [200, 200, 201, 201]
    assert {(r["date"], r["revision"]) for r in added} == {("2026-12-06", "bbbbbbb")}
    assert sorted(r["seed_serial"] for r in added) == [0, 0, 1, 1]
    assert [(r["serial"], r["regime"]) for r in out["excluded_runs"]] == [
        (117, "2p1d"),
        (207, "2p1d, router bbbbbbb"),
    ]
    assert list(out["pooled"]) == ["2p1d", "2p1d, router bbbbbbb"]
    assert out["pooled"]["2p1d, router bbbbbbb"]["adaptive"]["runs"] == 2
    assert out["workloads"]["2p1d, router bbbbbbb"] == {"w": "2p1d"}
    assert out["engine_sets"][-1] == {"regime": "2p1d, router bbbbbbb"}
    assert out["command"].endswith('; then 2p1d, router bbbbbbb: ARGS="--regimes 2p1d"')
    assert (out["date"], out["rounds"]) == (
        "2026-12-05 and 2026-12-06",
        "5; 2p1d, router bbbbbbb: 3",
    )
    assert "revision" not in out  # two commits: each run names its own
    again = production_merge.merge(out, sitting("spare", range(1), rounds=5), None)
    assert again["rounds"] == out["rounds"]  # the same rounds as the first sitting's


def test_a_merge_that_would_mix_sittings_is_refused() -> None:
    from bench.production import merge as production_merge

    base = sitting("2p1d", range(2))
    with pytest.raises(ValueError, match="already published: 2p1d"):
        production_merge.merge(base, sitting("2p1d", range(2)), None)
    two = sitting("spare", range(1))
    two["runs"] += sitting("pressure", range(1))["runs"]
    two["pooled"] = report.pooled_by_regime(two["runs"])
    with pytest.raises(ValueError, match="this part ran spare, pressure"):
        production_merge.merge(base, two, "one label")
    merged = production_merge.merge(base, two, None)  # unlabelled: regimes as they ran
    assert list(merged["pooled"]) == ["2p1d", "spare", "pressure"]
    two["peers"], two["twin"] = ["affinity@quiet"], "adaptive-aa"
    each = production_merge.merge(base, two, "{regime}, equal engines")  # a label for each
    assert list(each["pooled"]) == ["2p1d", "spare, equal engines", "pressure, equal engines"]
    assert (each["peers"], each["twin"]) == (["affinity@quiet"], "adaptive-aa")
    assert production_merge.parse_part("a, b=c/d=e") == ("a, b", production_merge.Path("c/d=e"))
    assert production_merge.parse_part("p.json") == (None, production_merge.Path("p.json"))
    with pytest.raises(ValueError, match="no results file"):
        production_merge.parse_part("label=")


def test_merged_results_naming_this_machine_are_refused(tmp_path: Any) -> None:
    from bench.production import merge as production_merge

    part = sitting("spare", range(1))
    part["engine_sets"] = [{"regime": "spare", "log": f"{tmp_path}/engines/p.log"}]
    (tmp_path / "part.json").write_text(json.dumps(part))
    base = sitting("2p1d", range(1))
    with pytest.raises(ValueError, match="name paths of this machine"):
        production_merge.merged(base, [f"{tmp_path}/part.json"])
    part["engine_sets"] = [{"regime": "spare"}]
    (tmp_path / "production.json").write_text(json.dumps(part))
    out = production_merge.merged(base, [f"spare, later={tmp_path}"])  # a folder holding one
    assert list(out["pooled"]) == ["2p1d", "spare, later"]
    assert "/x/" not in out["command"]
