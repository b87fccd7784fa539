// @ts-check
// How an observer can watch this pool server: from its KV-event publisher's
// status (GET /api/kv-events), the endpoint to subscribe to and the command
// that does it.  The dashboard shows its "fleet" link only when there is one;
// the fleet page, opened on a pool server, says the same.

/**
 * {endpoint, command, connects} for a publishing server, null when it
 * publishes nothing.  `host`: the host the browser reached the server on (a
 * wildcard bind address is not one to connect to).
 * @param {{enabled?: boolean, binds?: boolean, endpoint?: string, bound_endpoint?: string, bound_replay_endpoint?: string} | null | undefined} kv
 * @param {string} host
 */
export function observeHint(kv, host) {
  if (!kv || !kv.enabled) return null;
  const local = (/** @type {string | undefined} */ ep) => (ep ? ep.replace(/\/\/(\*|0\.0\.0\.0|\[::\]|::)(?=:)/, `//${host}`) : ep);
  const endpoint = local(kv.bound_endpoint || kv.endpoint);
  if (kv.binds === false) {
    // the publisher connects: the observer has to be the one listening there
    return { endpoint, connects: true, command: null, text: `this server connects to ${endpoint} to publish its KV events: an observer has to listen there` };
  }
  const replay = local(kv.bound_replay_endpoint);
  const command = `blockpool observe ${endpoint}${replay ? ` --replay ${replay}` : ""}`;
  return { endpoint, connects: false, command, text: `this server publishes its KV events at ${endpoint}: watch it (with other instances) with \`${command}\`, then open that observer's page` };
}
