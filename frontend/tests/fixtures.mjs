// Fixture frames for the JS tests, made by the real Python encoder.
//
// BP_FIXTURES=DIR points at frames already written by make_fixtures.py (the
// pytest wrapper tests/e2e/test_js_unit.py does that); otherwise they are
// written now into a temporary folder with the repository's Python
// (BP_PYTHON, else .venv/bin/python, else python3).

import { execFileSync } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const HERE = dirname(fileURLToPath(import.meta.url));
const REPO = resolve(HERE, "..", "..");
let cached = null;

export function fixturesDir() {
  if (cached) return cached;
  const given = process.env.BP_FIXTURES;
  if (given) {
    if (!existsSync(join(given, "READY"))) throw new Error(`BP_FIXTURES=${given} has no READY marker`);
    cached = given;
    return cached;
  }
  const venv = join(REPO, ".venv", "bin", "python");
  const python = process.env.BP_PYTHON || (existsSync(venv) ? venv : "python3");
  const dir = mkdtempSync(join(tmpdir(), "bp-fixtures-"));
  execFileSync(python, [join(HERE, "make_fixtures.py"), dir], { cwd: REPO, stdio: "inherit" });
  cached = dir;
  return cached;
}

/** [{file, kind, seq, note, ids, expect, bytes}] of one scenario. */
export function loadScenario(name) {
  const dir = join(fixturesDir(), name);
  const manifest = JSON.parse(readFileSync(join(dir, "manifest.json"), "utf8"));
  for (const f of manifest.frames) f.bytes = readFileSync(join(dir, f.file));
  return manifest;
}

/** A Node Buffer as a fresh, exactly sized ArrayBuffer (what a WebSocket gives). */
export function toArrayBuffer(buf) {
  const ab = new ArrayBuffer(buf.length);
  new Uint8Array(ab).set(buf);
  return ab;
}

/** A JSON file a scenario wrote beside its frames (e.g. analysis/rest.json). */
export function loadJson(name, file) {
  return JSON.parse(readFileSync(join(fixturesDir(), name, file), "utf8"));
}
