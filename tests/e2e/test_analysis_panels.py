"""The analysis panels in headless Chromium against a real server.

Why prompts missed, eviction regret, what-if, token usage and the
per-block request bars (time travel: test_time_travel.py), checked against
the REST views they summarise.
The module's server (conftest: 4,096 blocks, demo workload, the analysis in
its worker process) is shared by the tests in order; each opens a fresh tab.
Screenshots land in test-artifacts/e2e/.
"""

from __future__ import annotations

import math
import random
import time
from typing import Any

import pytest

from blockpool.miss_reasons import REASONS
from tests.e2e.conftest import Page, Server, wait_for
from tests.e2e.page_checks import region_shot
from tests.e2e.workload import admit, evict_everything, finish, start_demo
from tests.e2e.workload import quiesce_idle as quiesce

pytestmark = pytest.mark.browser


PAGE_MISSES_JS = """() => Object.fromEntries(Array.from(
  document.querySelectorAll('#miss-body td[data-reason]'),
  td => [td.dataset.reason, td.dataset.value === undefined ? null : Number(td.dataset.value)]))"""

MINI_CHARTS = [
    "chart-tokens",
    "chart-misses",
    "chart-miss-ago",
    "chart-miss-pos",
    "chart-regret",
    "chart-regret-gap",
    "chart-mrc",
]

# The tokens chart's uPlot data against the token series' window (once the
# panel has drawn the series' latest version): x, reserved, held, tail waste.
TOKEN_CHART_JS = """() => {
  const panel = window.__bp.panels.tokens;
  const t = window.__bp.analysis.tokens;
  if (panel.version !== t.version) return null;
  const pts = t.window(Number(document.getElementById('chart-window').value) || 120);
  const d = panel.chart.u.data;
  return {
    x: Array.from(d[0]), ys: [1, 2, 3].map((k) => Array.from(d[k])),
    want: {x: pts.map((p) => p.ts), ys: [pts.map((p) => p.reserved), pts.map((p) => p.held),
           pts.map((p) => p.waste)]},
  };
}"""

# The misses chart's top stacked series against the sum of the miss rates.
MISS_CHART_JS = """() => {
  const panel = window.__bp.panels.misses;
  const s = window.__bp.analysis.series;
  if (panel.version !== s.version || !panel.pts || !panel.pts.length) return null;
  const d = panel.chart.u.data;
  const key = document.getElementById('miss-unit').value === 'tokens' ? 'missTokens' : 'misses';
  return {
    x: Array.from(d[0]), top: Array.from(d[d.length - 1]),
    want: {x: panel.pts.map((p) => p.ts),
           top: panel.pts.map((p) => { const v = Object.values(p[key]).filter(Number.isFinite);
                                        return v.length ? v.reduce((a, b) => a + b, 0) : null; })},
  };
}"""

# The misses table's head and the misses chart's cursor (uPlot's) and hover.
MISS_HOVER_JS = """() => { const m = window.__bp.panels.misses; const i = m.chart.u.cursor.idx;
  const ok = i !== null && i !== undefined && i >= 0 && m.pts && i < m.pts.length;
  return {head: document.getElementById('miss-rate-head').textContent, i, idx: m.hoverIdx,
          at: ok ? new Date(m.pts[i].ts * 1000).toTimeString().slice(0, 8) : null}; }"""

# A bar histogram's uPlot data: its bucket bounds and the bars' counts.
HIST_CHART_JS = """(path) => { const c = path.split('.').reduce((o, k) => o[k], window.__bp.panels);
  return {bounds: c.x, counts: Array.from(c.u.data[1])}; }"""

# The what-if chart's uPlot: data, x scale, and the pixel 6 px above the
# "real" mark's centre (on its ring) in the canvas.
MRC_CHART_JS = """() => { const c = window.__bp.panels.whatif.chart; const u = c.u;
  const m = c.marks[0]; const pr = u.pxRatio || uPlot.pxRatio || 1;
  const x = Math.round(u.valToPos(m.x, 'x', true));
  const y = Math.round(u.valToPos(m.y, 'y', true));
  const ring = Array.from(u.ctx.getImageData(x, y - Math.round(6 * pr), 1, 1).data.slice(0, 3));
  return {data: u.data.map((d) => Array.from(d)), distr: u.scales.x.distr, log: u.scales.x.log,
          ymin: u.scales.y.min, ymax: u.scales.y.max, ring}; }"""


def trimmed(hg: dict[str, Any]) -> dict[str, Any]:
    """A REST histogram without its empty buckets at both ends (one kept),
    as the panels plot it."""
    counts = hg["counts"]
    a, b = 0, len(counts) - 1
    while a < b and counts[a] == 0:
        a += 1
    while b > a and counts[b] == 0:
        b -= 1
    a, b = max(0, a - 1), min(len(counts) - 1, b + 1)
    return {"bounds": hg["buckets"][a : b + 1], "counts": counts[a : b + 1]}


def show_analysis_row(p: Page) -> None:
    """Scroll the analysis row on screen: its panels ask REST only when visible."""
    p.page.locator("#analysis").scroll_into_view_if_needed()


# ----------------------------------------------------------------- tests


def test_panels_render_live_without_console_errors(dashboard: Page, server: Server) -> None:
    p = dashboard
    start_demo(server)
    # two analysis reports (about a second apart) make the first rates
    wait_for(
        lambda: p.js("() => window.__bp.analysis.series.points.length") >= 2,
        timeout=20,
        what="two analysis reports on the stream",
    )
    show_analysis_row(p)
    wait_for(
        lambda: (
            p.js("() => document.querySelectorAll('#whatif-body tr').length") > 0
            and p.js("() => !document.getElementById('tl-slider').disabled")
        ),
        what="the what-if table and the recording's timeline",
    )
    info = p.js(
        """() => ({
          health: document.getElementById('h-analysis').textContent,
          level: document.querySelector('[data-h="analysis"]').dataset.level,
          title: document.querySelector('[data-h="analysis"]').title,
          tokens: window.__bp.analysis.tokens.points.length,
          held: Number(document.getElementById('tokens-note').dataset.held),
          tokenDraws: window.__bp.panels.tokens.chart.draws,
          missDraws: window.__bp.panels.misses.chart.draws,
          uplots: document.querySelectorAll('.uplot').length,
          mcharts: Array.from(document.querySelectorAll('.mchart'), (el) => ({
            id: el.id,
            uplot: el.querySelectorAll(':scope > .uplot').length,
            canvases: el.querySelectorAll('canvas').length,
            uplotCanvases: el.querySelectorAll('.uplot canvas').length,
          })),
          fleet: document.getElementById('fleet-link').getAttribute('href'),
          fleetHidden: document.getElementById('fleet-link').hidden,
          mode: document.getElementById('tl-mode').textContent,
          at: document.getElementById('tl-at').textContent,
        })"""
    )
    assert info["health"].startswith("lag "), info  # the worker's lag, always visible
    assert info["level"] in ("ok", "warn"), info
    assert "recorded operations" in info["title"]
    assert info["tokens"] > 5 and info["held"] >= 0
    assert info["tokenDraws"] > 0 and info["missDraws"] > 0  # uPlot's draw hook
    # every analysis chart (and the tokens chart) is a uPlot: no canvas of its own
    ids = [c["id"] for c in info["mcharts"]]
    assert sorted(ids) == sorted(MINI_CHARTS), info["mcharts"]
    for c in info["mcharts"]:
        assert c["uplot"] == 1 and c["canvases"] == c["uplotCanvases"] == 1, c
    assert info["uplots"] == 6 + len(MINI_CHARTS)  # and the six of the charts row
    # what they draw is the panels' series: the token usage, the stacked miss rates
    tokens = wait_for(lambda: p.js(TOKEN_CHART_JS), what="the tokens chart to hold the series")
    assert len(tokens["x"]) >= 5 and tokens["x"] == tokens["want"]["x"], tokens
    assert tokens["ys"] == tokens["want"]["ys"], tokens
    misses = wait_for(lambda: p.js(MISS_CHART_JS), what="the misses chart to hold the series")
    assert misses["x"] == misses["want"]["x"] and len(misses["x"]) >= 1, misses
    for got, want in zip(misses["top"], misses["want"]["top"], strict=True):
        assert (got is None and want is None) or math.isclose(got, want, abs_tol=1e-9), misses
    # this server publishes no KV events: no observer can watch it, no fleet link
    assert info["fleet"] == "/static/fleet.html" and info["fleetHidden"] is True
    assert info["mode"] == "live" and info["at"].startswith("live · "), info["at"]
    assert " · op " in info["at"]
    assert server.http.get("/static/fleet.html").status_code == 200
    # the block map draws once per animation frame at most (counted over 20
    # frames, however long a busy machine takes to show them)
    p.js("() => window.__bp.resetPerf()")
    wait_for(lambda: p.js("() => __bp.perf.raf") >= 20, what="20 animation frames")
    perf = p.js(
        "() => ({raf: __bp.perf.raf, draws: __bp.map.perf.draws, long: __bp.perf.longFrames})"
    )
    assert perf["draws"] <= perf["raf"], perf
    p.shot("-overview")
    region_shot(p, "#analysis", "analysis-row")
    region_shot(p, ".charts", "charts-row")
    assert p.errors == [], p.errors
    assert p.network == [], p.network


def test_miss_reasons_and_regret_equal_rest_after_the_workload_settles(
    dashboard: Page, server: Server
) -> None:
    p = dashboard
    start_demo(server)
    time.sleep(2)
    quiesce(server)
    # a prompt stored, its hashes evicted, the prompt again: evicted misses + regrets
    rng = random.Random(11)
    prompt = rng.choices(range(32000), k=16 * 8 + 3)
    admit(server, prompt, "an-regret-1")
    finish(server, "an-regret-1")
    evict_everything(server)
    admit(server, prompt, "an-regret-2")
    finish(server, "an-regret-2")

    def agree() -> Any:
        rest = server.get("/api/misses")
        want = {r: rest["reasons"][r]["blocks"] for r in REASONS}
        got = p.js(PAGE_MISSES_JS)
        return want if got == want else None

    show_analysis_row(p)
    want = wait_for(agree, timeout=20, what="the page's miss counts to equal GET /api/misses")
    assert want["evicted"] >= 8 and want["cold"] > 0, want
    rest = server.get("/api/misses")
    assert (
        p.js("() => Number(document.getElementById('miss-foot').dataset.missed)")
        == (rest["missed"]["blocks"])
    )
    # tokens per reason too (the unit switch)
    p.page.select_option("#miss-unit", "tokens")
    tokens = p.js(
        """() => Object.fromEntries(Array.from(document.querySelectorAll('#miss-body tr'),
             tr => [tr.dataset.reason, Number(tr.cells[3].textContent.replace(/,/g, ''))]))"""
    )
    assert tokens == {r: rest["reasons"][r]["tokens"] for r in REASONS}
    # hovering the chart (uPlot's cursor) puts that moment's rates in the table
    box = p.page.locator("#chart-misses .u-over").bounding_box()
    assert box and box["width"] > 100
    p.page.mouse.move(box["x"] + box["width"] * 0.6, box["y"] + box["height"] / 2)

    def hovered() -> Any:
        h = p.js(MISS_HOVER_JS)
        return h if h["head"].startswith("@") else None

    hover = wait_for(hovered, what="the hovered moment in the table's head")
    assert hover["idx"] == hover["i"] and hover["head"] == f"@{hover['at']}", hover
    p.page.mouse.move(1, 1)
    wait_for(
        lambda: p.js("() => document.getElementById('miss-rate-head').textContent") == "tok/s",
        what="the table's head back to the latest rates",
    )
    # regret: the total, and the regretted prefix with its owner and victim
    regret = server.get("/api/regret")
    assert regret["regrets_total"] >= 8
    wait_for(
        lambda: (
            p.js("() => document.getElementById('regret-total')?.textContent")
            == f"{server.get('/api/regret')['regrets_total']:,}"
        ),
        what="the regret total",
    )
    first = " ".join(str(t) for t in prompt[:4])
    row = wait_for(
        lambda: p.js(
            """(first) => { const tr = Array.from(document.querySelectorAll('#regret-body tr'))
                 .find(t => t.cells[0].textContent.startsWith(first));
               return tr ? Array.from(tr.cells, c => c.textContent) : null; }""",
            first,
        ),
        what="the regretted prefix in the table",
    )
    top = next(t for t in regret["top_prefixes"] if t["first_tokens"][:4] == prompt[:4])
    assert row[1] == f"{top['regrets']:,}"
    assert row[3] == f"{top['owner_request'] or '—'} → {top['last_request'] or '—'}"
    # the evicted misses' age histogram has them
    wait_for(
        lambda: (
            "none yet" not in p.js("() => document.getElementById('miss-ago-title').textContent")
        ),
        what="the evicted misses' histogram",
    )
    # the histograms are uPlot bars of the REST buckets
    for path, get in [
        ("misses.ago.chart", lambda: server.get("/api/misses")["evicted_misses"]["ago_seconds"]),
        ("regret.gap.chart", lambda: server.get("/api/regret")["gap_seconds"]),
    ]:
        got = wait_for(
            lambda path=path, get=get: (
                (g := p.js(HIST_CHART_JS, path)) == trimmed(get()) and g["counts"] and g
            ),
            timeout=20,
            what=f"the {path} bars to equal REST",
        )
        assert sum(got["counts"]) == get()["count"] > 0, got
    region_shot(p, ".miss-panel", "misses")
    region_shot(p, ".regret-panel", "regret")
    assert p.errors == [], p.errors
    assert p.network == [], p.network


def test_what_if_curve_shows_the_shadow_policies_and_capacities(
    dashboard: Page, server: Server
) -> None:
    p = dashboard
    quiesce(server)  # the shadows' figures hold still
    rows_js = """() => Array.from(document.querySelectorAll('#whatif-body tr'), tr => ({
        policy: tr.dataset.policy, factor: Number(tr.dataset.factor),
        capacity: Number(tr.dataset.capacity), hit: tr.cells[3].textContent}))"""

    def agree() -> Any:
        rest = server.get("/api/shadows")
        want = sorted(
            (pol, pt["factor"], pt["capacity"], f"{pt['hit_rate'] * 100:.1f}%")
            for pol, pts in rest["curve"].items()
            for pt in pts
        )
        got = sorted((r["policy"], r["factor"], r["capacity"], r["hit"]) for r in p.js(rows_js))
        return rest if got == want else None

    show_analysis_row(p)
    rest = wait_for(agree, timeout=20, what="the what-if table to equal GET /api/shadows")
    policies = set(rest["curve"])
    assert {"vllm016", "uncached_first", "s3fifo"} <= policies
    chart = p.js(
        """() => { const c = window.__bp.panels.whatif.chart;
                   return {labels: c.o.series.map(s => s.label), x: c.x, marks: c.marks}; }"""
    )
    assert sorted(chart["labels"]) == sorted(policies)
    assert chart["x"] == sorted({pt["factor"] for pts in rest["curve"].values() for pt in pts})
    real = rest["real"].get("span", rest["real"])["hit_rate"]
    assert chart["marks"] and chart["marks"][0]["x"] == 1
    assert math.isclose(chart["marks"][0]["y"], real)
    # uPlot draws it: the factors on a log2 x scale, each policy's hit rates,
    # the "real" point's ring (near white) over the curve
    u = p.js(MRC_CHART_JS)
    assert u["distr"] == 3 and u["log"] == 2, u
    assert u["data"][0] == chart["x"]
    for label, ys in zip(chart["labels"], u["data"][1:], strict=True):
        pts = {pt["factor"]: pt["hit_rate"] for pt in rest["curve"][label]}
        assert ys == [pts.get(f) for f in chart["x"]], label
    assert u["ymin"] <= real <= u["ymax"], u
    assert all(c >= 150 for c in u["ring"]), u["ring"]
    # in words: each other capacity of vLLM's order, each other policy at 1x
    lines = p.js(
        """() => Array.from(document.querySelectorAll('#whatif-text li'),
             li => [li.dataset.kind, li.dataset.policy, Number(li.dataset.factor),
                    li.textContent])"""
    )
    factors = sorted(pt["factor"] for pt in rest["curve"]["vllm016"] if pt["factor"] != 1)
    assert sorted(f for k, _, f, _ in lines if k == "capacity") == factors
    assert sorted(pol for k, pol, _, _ in lines if k == "policy") == sorted(policies - {"vllm016"})
    two = next(t for k, _, f, t in lines if k == "capacity" and f == 2)
    hr2 = next(pt["hit_rate"] for pt in rest["curve"]["vllm016"] if pt["factor"] == 2)
    assert two.startswith("2\N{MULTIPLICATION SIGN} the blocks") and f"{hr2 * 100:.1f}%" in two
    region_shot(p, ".whatif-panel", "whatif")
    assert p.errors == [], p.errors


def test_request_bars_equal_the_rest_detail(dashboard: Page, server: Server) -> None:
    p = dashboard
    quiesce(server)
    rng = random.Random(21)
    shared = rng.choices(range(32000), k=16 * 5 + 9)
    admit(server, shared + rng.choices(range(32000), k=30), "an-bars-a")
    # shares 5 blocks + 9 tokens of the 6th: hits, a block-size floor, cold, a partial tail
    admit(server, shared[: 16 * 5 + 9] + rng.choices(range(32000), k=40), "an-bars-b")

    def detail() -> Any:
        d = server.get("/api/requests/an-bars-b")
        prompt = math.ceil(d["num_prompt_tokens"] / 16)
        done = all(b["hit"] or b["reason"] for b in d["blocks"][:prompt])
        return d if done else None

    rest = wait_for(detail, what="the worker's reasons for the request")
    # from the running requests list, as an operator would
    link = p.page.locator("#req-body a", has_text="an-bars-b")
    link.wait_for(timeout=10_000)
    link.click()
    p.page.wait_for_selector('#rq-bars[data-rid="an-bars-b"]')
    bars = p.js(
        """() => Array.from(document.querySelectorAll('#rq-bars .rq-bar'),
             b => [Number(b.dataset.index), b.dataset.kind, b.dataset.reason || null])"""
    )
    prompt = math.ceil(rest["num_prompt_tokens"] / 16)
    want = []
    for b in rest["blocks"]:
        i = b["index"]
        kind = "decode" if i >= prompt else "hit" if b["hit"] else "miss"
        want.append([i, kind, b["reason"]])
    assert bars == want
    kinds = {k if k != "miss" else r for _, k, r in bars}
    assert {"hit", "block_size_floor", "cold"} <= kinds, kinds
    # hovering a bar says why
    floor = next(i for i, k, r in bars if r == "block_size_floor" and i < prompt - 1)
    p.page.locator(f'#rq-bars .rq-bar[data-index="{floor}"]').hover()
    shared_tokens = rest["blocks"][floor]["miss"]["shared_tokens"]
    wait_for(
        lambda: (
            f"shares {shared_tokens} tokens"
            in p.js("() => document.getElementById('rq-hover').textContent")
        ),
        what="the hover line",
    )
    p.shot("-bars")
    region_shot(p, ".detail-panel", "detail")
    # a finished request: GET /api/misses/requests/{id}
    finish(server, "an-bars-a")
    finish(server, "an-bars-b")
    p.js("() => window.__bp.detail.showRequest('an-bars-b')")
    p.page.wait_for_function(
        """() => { const s = document.getElementById('rq-bars');
                   return s && s.dataset.rid === 'an-bars-b' && s.closest('.rq-strip')
                     .textContent.includes('(finished)'); }"""
    )
    done = server.get("/api/misses/requests/an-bars-b")
    fin = p.js(
        "() => Array.from(document.querySelectorAll('#rq-bars .rq-bar'),"
        " b => b.dataset.reason || b.dataset.kind)"
    )
    assert fin == [b["reason"] or ("hit" if b["hit"] else "pending") for b in done["blocks"]]
    assert p.errors == [], p.errors
    assert all("404" in n for n in p.network), p.network  # GET /api/requests/{id} of a finished one
