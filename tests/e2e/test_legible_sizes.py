"""Nothing cut, nothing sideways, at 1600x1000, 1280x800 and 1000x800, on the
dashboard (the demo running) and the fleet page: no panel title, label,
placeholder or chart axis label is clipped, the fleet page's events/s axis
reads clock times from its first point, and a histogram with no samples says
so over a readable axis.  Screenshots land in test-artifacts/e2e/legible-*.png.

Chart axis labels are canvas text: an init script records every uPlot the
page makes (``window.__plots``) so the test can read where each label was
drawn and how wide it is.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.conftest import ARTIFACTS, Page, Server, running, wait_for
from tests.e2e.test_layout import fleet  # noqa: F401  (the fleet page with data)
from tests.e2e.workload import start_demo

pytestmark = pytest.mark.browser

SIZES = [(1600, 1000), (1280, 800), (1000, 800)]
IDS = [f"{w}x{h}" for w, h in SIZES]

# every uPlot the page makes, and for each draw: how many x values and the x labels
PLOTS_INIT = """
(() => {
  let U = undefined;
  window.__plots = [];
  Object.defineProperty(window, "uPlot", {
    configurable: true,
    get: () => U,
    set: (Base) => {
      U = class extends Base {
        constructor(...args) {
          super(...args);
          this.__draws = [];
          window.__plots.push(this);
          const hk = this.hooks;
          hk.draw = [...(hk.draw || []), (u) => {
            if (u.__draws.length < 400) u.__draws.push({
              n: u.data[0].length, min: u.scales.x.min, max: u.scales.x.max,
              labels: (u.axes[0]._values || []).filter((v) => v),
            });
          }];
        }
      };
    },
  });
})();
"""

CLIPPED_JS = """(rootSel) => {
  const root = document.querySelector(rootSel) || document.body;
  const shown = (e) => e.getClientRects().length > 0
    && getComputedStyle(e).visibility === "visible";
  const ctx = document.createElement('canvas').getContext('2d');
  const cut = [];
  // titles and labels whose text does not fit their box
  const sel = 'h2, h3, .hist-title, th, label, button, .label, summary, .panel-head > span, .btn';
  for (const e of root.querySelectorAll(sel)) {
    if (!shown(e) || e.clientWidth === 0) continue;
    if (e.scrollWidth > e.clientWidth + 1) cut.push(`text: ${e.textContent.trim().slice(0, 40)}`);
  }
  // placeholders (an empty input shows its whole hint)
  for (const e of root.querySelectorAll('input[placeholder]')) {
    if (!shown(e) || e.value) continue;
    const cs = getComputedStyle(e);
    ctx.font = `${cs.fontStyle} ${cs.fontWeight} ${cs.fontSize} ${cs.fontFamily}`;
    const room = e.clientWidth - parseFloat(cs.paddingLeft) - parseFloat(cs.paddingRight);
    const need = ctx.measureText(e.placeholder).width;
    if (need > room + 1) cut.push(`placeholder: ${e.placeholder} (${need.toFixed(0)} > ${room})`);
  }
  // chart axis labels inside their canvas
  for (const u of window.__plots || []) {
    if (!shown(u.root) || !u.root.isConnected) continue;
    const W = u.width;
    const left = u.bbox.left / uPlot.pxRatio;
    u.axes.forEach((ax, k) => {
      if (ax.show === false) return;
      ctx.font = ax.font[0] || ax.font;
      const vals = ax._values || [];
      (ax._splits || []).forEach((v, i) => {
        const t = vals[i];
        if (v === null || v === undefined || !t) return;
        const w = ctx.measureText(String(t)).width;
        const where = u.root.closest('[id]');
        const name = `${where ? where.id : '?'} axis ${k} "${t}"`;
        if (k === 0) {
          const x = left + u.valToPos(v, 'x');
          if (x - w / 2 < -1 || x + w / 2 > W + 1) cut.push(`${name} outside 0..${W}`);
        } else {
          const room = ax._size - (ax.ticks.size || 0) - (ax.gap || 0);
          if (w > room + 1) cut.push(`${name} wider than its axis (${w.toFixed(0)} > ${room})`);
        }
      });
    });
  }
  const s = document.scrollingElement;
  const wide = [...document.querySelectorAll('.panel')]
    .filter((e) => shown(e) && e.scrollWidth > e.clientWidth + 1)
    .map((e) => (e.querySelector('h2') || e).textContent.trim().slice(0, 30));
  return {cut, sideways: s.scrollWidth - s.clientWidth, wide};
}"""


def _dashboard(browser: Any, url: str, name: str, size: tuple[int, int]) -> Page:
    w, h = size
    return Page(browser, url, name, viewport={"width": w, "height": h}, init_script=PLOTS_INIT)


@pytest.fixture(scope="module")
def quiet() -> Iterator[Server]:
    """A server nothing has evicted on (its histograms hold no samples)."""
    with running("quiet", "--num-blocks", "1024", "--log-level", "warning") as srv:
        yield srv


@pytest.mark.parametrize("size", SIZES, ids=IDS)
def test_dashboard_nothing_clipped_nor_sideways(
    browser: Any, server: Server, size: tuple[int, int]
) -> None:
    p = _dashboard(browser, server.url, f"legible-dashboard-{size[0]}", size)
    try:
        start_demo(server, rate=8.0)
        wait_for(
            lambda: p.js("() => window.__bp.model.histograms?.lifetime?.count ?? 0") > 5,
            timeout=60,
            what="eviction samples",
        )
        wait_for(lambda: p.js("() => window.__bp.model.points.length") > 40, what="points")
        p.page.locator("#analysis").scroll_into_view_if_needed()
        p.page.locator(".bottom").scroll_into_view_if_needed()
        p.js("() => window.scrollTo(0, 0)")
        p.frames(3)
        got = p.js(CLIPPED_JS, "body")
        p.shot()
        assert got["sideways"] <= 0, got
        assert got["wide"] == [], got
        assert got["cut"] == [], got["cut"]
        assert p.errors == []
    finally:
        p.close()
        server.post("/api/demo/stop")


HIST_JS = """() => {
  const ctx = document.createElement('canvas').getContext('2d');
  return Object.entries(window.__bp.charts.hists).map(([name, u]) => {
    const box = u.root.closest('.hist');
    const note = box.querySelector('.hist-empty');
    const ax = u.axes[0];
    ctx.font = ax.font[0] || ax.font;
    const spans = [];
    (ax._splits || []).forEach((v, i) => {
      const t = (ax._values || [])[i];
      if (v === null || v === undefined || !t) return;
      const x = u.valToPos(v, 'x');
      const w = ctx.measureText(t).width;
      spans.push([x - w / 2, x + w / 2, t]);
    });
    return {name, note: note && note.getClientRects().length ? note.textContent : null,
            spans: spans.sort((a, b) => a[0] - b[0])};
  });
}"""


@pytest.mark.parametrize("size", SIZES, ids=IDS)
def test_an_empty_histogram_says_so_over_a_readable_axis(
    browser: Any, quiet: Server, size: tuple[int, int]
) -> None:
    p = _dashboard(browser, quiet.url, f"legible-empty-hists-{size[0]}", size)
    try:
        assert p.js("() => window.__bp.model.histograms.lifetime.count") == 0
        p.page.locator(".hists").scroll_into_view_if_needed()
        wait_for(
            lambda: all(len(h["spans"]) >= 3 for h in p.js(HIST_JS)),
            what="the empty histograms' axes",
        )
        for h in p.js(HIST_JS):
            assert h["note"] == "no samples yet", h
            for a, b in itertools.pairwise(h["spans"]):
                assert b[0] >= a[1] + 2, f"{h['name']}: {a[2]!r} and {b[2]!r} touch"
        got = p.js(CLIPPED_JS, ".hists")
        assert got["cut"] == [], got["cut"]
        p.shot()
        assert p.errors == []
    finally:
        p.close()


def test_histograms_with_samples_drop_the_empty_note(browser: Any, server: Server) -> None:
    p = _dashboard(browser, server.url, "legible-hists-filled", SIZES[1])
    try:
        start_demo(server, rate=8.0)
        wait_for(
            lambda: (
                p.js(HIST_JS)[0]["note"] is None
                and p.js("() => window.__bp.model.histograms.lifetime.count") > 0
            ),
            timeout=60,
            what="lifetime samples",
        )
        assert p.js(HIST_JS)[0]["note"] is None
    finally:
        p.close()
        server.post("/api/demo/stop")


RATE_DRAWS_JS = """() => {
  const u = (window.__plots || []).find((p) => p.root.closest('#rate-chart'));
  return u ? u.__draws.filter((d) => d.n > 0) : null;
}"""


@pytest.mark.parametrize("size", SIZES, ids=IDS)
def test_fleet_page_nothing_clipped_and_its_rate_axis_reads_times(
    browser: Any,
    fleet: str,  # noqa: F811
    size: tuple[int, int],
) -> None:
    w, h = size
    ctx = browser.new_context(viewport={"width": w, "height": h})
    try:
        ctx.add_init_script(script=PLOTS_INIT)
        page = ctx.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(fleet + "/")
        page.wait_for_selector("#instances .instance")
        page.wait_for_function("() => document.querySelectorAll('#hashmap tbody tr').length > 0")
        page.wait_for_selector("#tree li")
        # the chart drew with one point, then with more
        wait_for(
            lambda: (d := page.evaluate(RATE_DRAWS_JS)) and d[-1]["n"] >= 3, what="rate points"
        )
        draws = page.evaluate(RATE_DRAWS_JS)
        assert draws[0]["n"] == 1, draws[:3]
        for d in draws:
            # seconds to minutes of x range, labelled as clock times (never a year)
            assert 10 <= d["max"] - d["min"] <= 3600, d
            assert d["labels"], d
            assert all(":" in t for t in d["labels"]), d
        got = page.evaluate(CLIPPED_JS, "body")
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / f"legible-fleet-{w}.png"), full_page=True)
        assert got["sideways"] <= 0, got
        assert got["wide"] == [], got
        assert got["cut"] == [], got["cut"]
        assert errors == []
    finally:
        ctx.close()


# a machine whose system font is wider than this one's (CI's drew "21:46:09"
# 53 px wide, and uPlot's own room right of a plot is 25 px): the charts' font
# family resolves to DejaVu Sans Mono
WIDE_FONT = """
(() => {
  const face = new FontFace("ui-sans-serif", 'local("DejaVu Sans Mono")');
  document.fonts.add(face);
  face.load();
})();
"""

# The live time charts drawn from points the test gives the model (ending on a
# whole minute: a clock label sits on the plot's right edge), all in one turn
# of the page's loop so no tick from the server lands in between; what each
# drew comes back: x span, clock labels, labels cut.  The page's points are
# put back after.
TIME_STATES_JS = (
    """async (states) => {
  const clipped = """
    + CLIPPED_JS
    + """;
  const bp = window.__bp;
  const kept = bp.model.points;
  const ids = ['chart-usage', 'chart-hit', 'chart-rates'];
  const out = [];
  try {
    for (const [name, xs] of states) {
      bp.model.points = xs.map((ts) => ({ts, in_use: 3, cached: 2, empty: 5, hit_rate: 0.5,
        hit_rate_total: 0.5, alloc_per_s: 1, evict_per_s: 0}));
      bp.charts.update();
      for (let i = 0; i < 4; i++) await Promise.resolve();  // uPlot draws in a microtask
      const cut = clipped('body').cut.filter((c) => ids.some((id) => c.startsWith(id + ' axis 0')));
      for (const u of window.__plots) {
        const where = u.root.closest('[id]');
        if (!where || !ids.includes(where.id)) continue;
        out.push({state: name, chart: where.id, span: u.scales.x.max - u.scales.x.min,
                  labels: (u.axes[0]._values || []).filter((t) => t), cut});
      }
    }
  } finally {
    bp.model.points = kept;
    bp.charts.update();
  }
  return out;
}"""
)


@pytest.mark.parametrize("size", SIZES, ids=IDS)
def test_time_charts_read_clock_times_inside_the_chart_with_a_wide_font(
    browser: Any, quiet: Server, size: tuple[int, int]
) -> None:
    p = _dashboard(browser, quiet.url, f"legible-time-axes-{size[0]}", size)
    try:
        p.ctx.add_init_script(script=WIDE_FONT)
        p.page.reload()
        p.page.wait_for_function("() => window.__bp && window.__bp.ready()", timeout=120_000)
        p.page.wait_for_function("() => document.fonts.check('11px ui-sans-serif')")
        width = p.js(
            """() => { const c = document.createElement('canvas').getContext('2d');
              c.font = '11px ui-sans-serif, system-ui, sans-serif';
              return c.measureText('00:00:00').width; }"""
        )
        assert width > 52, f"the wide font did not take (a clock label {width} px)"
        # a window resized: the charts lay out again in the font now loaded
        p.page.set_viewport_size({"width": size[0] - 40, "height": size[1]})
        wait_for(
            lambda: p.js(
                "() => window.__plots.every((u) => !u.root.isConnected"
                " || Math.abs(u.width - Math.max(120, u.root.parentElement.clientWidth)) < 2)"
            ),
            what="the charts resized",
        )
        hi = (int(p.js("() => Date.now() / 1000")) // 60 + 1) * 60
        states = [
            ("one point", [hi]),
            ("50 ms", [hi - 0.05, hi]),
            ("a second of ticks", [hi - 1 + k / 20 for k in range(21)]),
            ("40 s", [hi - 40 + k for k in range(41)]),
        ]
        got = p.js(TIME_STATES_JS, states)
        assert len(got) == 3 * len(states), got
        for d in got:
            data_span = 40 if d["state"] == "40 s" else 30
            assert abs(d["span"] - data_span) < 1e-6, d  # never a thousand days
            assert len(d["labels"]) >= 2, d
            assert len(set(d["labels"])) == len(d["labels"]), d  # no time repeated
            assert all(len(t) == 8 and t.count(":") == 2 for t in d["labels"]), d
            assert d["cut"] == [], d
        assert p.errors == []
    finally:
        p.close()


# narrow category histograms (the analysis panels' are ~200 px wide), one per
# count of buckets: the bounds of the miss panel's age chart, in seconds
NARROW_HISTS_JS = """async () => {
  const { MiniChart } = await import('/static/js/dashboard/render/minichart.js');
  const { durTick } = await import('/static/js/common/format.js');
  const bounds = [0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.5, 1, 2.5, 5, 10, 25, 50, 100, 250];
  const host = document.createElement('div');
  host.id = 'narrow-hists';
  document.body.prepend(host);
  for (const width of [150, 198, 240]) {
    for (let n = 1; n <= bounds.length; n++) {
      const box = document.createElement('div');
      box.id = `hist-${width}-${n}`;
      box.style.width = `${width}px`;
      host.append(box);
      const c = new MiniChart(box, {
        height: 64, x: 'cat', legend: false, yWidth: 30,
        xFmt: (b) => `≤${durTick(b)}`,
        series: [{ label: 'count', rgb: [200, 80, 60], bars: true, fill: 0.75 }],
      });
      const xs = bounds.slice(0, n);
      c.setData(xs, [xs.map((_, i) => 1 + ((i * 7) % 5))]);
    }
  }
  return host.children.length;
}"""


def test_a_narrow_category_histogram_keeps_its_labels_inside_its_canvas(
    browser: Any, quiet: Server
) -> None:
    """The CI's cut '≤200ms': a category axis centres each label on its bucket,
    so with labels one in two or three, the last one kept can sit half a narrow
    bucket from the canvas's right edge and be cut; such a label is left out."""
    p = _dashboard(browser, quiet.url, "legible-narrow-hists", SIZES[0])
    try:
        made = p.js(NARROW_HISTS_JS)
        assert made == 45
        p.frames(3)
        drawn = p.js(
            "() => window.__plots.filter((u) => u.root.closest('#narrow-hists'))"
            ".map((u) => (u.axes[0]._values || []).filter((v) => v).length)"
        )
        assert len(drawn) == 45 and all(k >= 1 for k in drawn), drawn
        got = p.js(CLIPPED_JS, "#narrow-hists")
        assert got["cut"] == [], got["cut"]
        assert p.errors == []
    finally:
        p.close()
