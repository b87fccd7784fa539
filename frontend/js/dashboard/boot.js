// @ts-check
// The page's start against a server: its facts line, the fleet link (only
// to an observer that answers) and the token prompt when reads are protected.

import { ApiError, api, get } from "../common/api.js";
import { $, setText } from "../common/dom.js";
import { int } from "../common/format.js";
import { observeHint } from "../common/observe.js";
import { showError } from "./panels/errline.js";

/**
 * The facts line under the title (the pool's size and settings); the token box when writes need one.
 * @param {import("./wire/protocol.js").PoolConfig | null | undefined} cfg the config frame's, or GET /api/config
 * @param {import("./panels/controls.js").Controls} controls
 */
export function showFacts(cfg, controls) {
  if (!cfg) return;
  setText(
    $("facts"),
    `${int(cfg.num_blocks)} blocks × ${cfg.block_size} tok · ${cfg.hash_fn} · ${cfg.num_groups} group${cfg.num_groups > 1 ? "s" : ""} · caching ${cfg.enable_caching ? "on" : "off"} · ${cfg.tick_hz} Hz`,
  );
  controls.setAuth(Boolean(cfg.auth_required_for_writes));
}

/** The "fleet" link: only to an observer that answers (--fleet-url), never a dead end. */
async function fleetLink() {
  const link = $("fleet-link", HTMLAnchorElement);
  link.hidden = true;
  try {
    const kv = await api("GET", "/api/kv-events", undefined, { quiet: true });
    const url = kv && kv.fleet_url;
    if (!url) return;
    // another origin: an opaque answer proves it is up without reading it
    await fetch(new URL("api/health", url.endsWith("/") ? url : `${url}/`), { mode: "no-cors", cache: "no-store" });
    const hint = observeHint(kv, location.hostname);
    link.href = url;
    link.target = "_blank";
    link.rel = "noopener";
    link.title = `The fleet observer at ${url}${hint ? ` (${hint.text})` : ""}.`;
    link.hidden = false;
  } catch {
    link.hidden = true;
  } finally {
    link.dataset.checked = "1"; // for the tests: the check is over, shown or not
  }
}

/**
 * The page's first REST calls to a server (again after a token is entered).
 * @param {import("./panels/controls.js").Controls} controls
 */
export async function boot(controls) {
  try {
    const cfg = await get("/api/config");
    showFacts(cfg, controls);
    fleetLink();
  } catch (err) {
    if (err instanceof ApiError && err.status === 401) {
      controls.setAuth(true);
      showError("this server protects reads: enter its token at the top right");
    }
  }
}
