"""The dashboard's test hooks, loaded only by the browser tests and the bench.

The page sets no globals of its own: ``frontend/js/dashboard/testhooks.js``
imports the running page's parts (``main.js`` exports them) and puts them on
``window.__bp``.  ``install(ctx_or_page)`` adds an init script that loads it
on every dashboard page the context opens (reloads included).
"""

from __future__ import annotations

from typing import Any

TEST_HOOKS = "/static/js/dashboard/testhooks.js"

INIT_SCRIPT = f"""
(() => {{
  if (window.top !== window) return;
  document.addEventListener("DOMContentLoaded", () => {{
    if (!document.querySelector('script[src$="/js/dashboard/main.js"]')) return;
    const s = document.createElement("script");
    s.type = "module";
    s.src = "{TEST_HOOKS}";
    document.head.append(s);
  }});
}})();
"""


def install(target: Any) -> None:
    """Load the test hooks in every dashboard page of a Playwright context or page."""
    target.add_init_script(script=INIT_SCRIPT)
