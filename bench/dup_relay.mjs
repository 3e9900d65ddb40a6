// dup_relay.mjs -- a TCP relay that cuts every connection a few seconds
// after it was opened, as a load balancer with a connection lifetime does
// (Envoy's max_connection_duration, HAProxy's and cloud balancers' timeouts,
// a deploy draining its instances), whatever is in flight on it.
//
//   node dup_relay.mjs TARGET_PORT LIFE_MIN_MS LIFE_MAX_MS [SEED]
//
// Listens on [::1] at TARGET_PORT, the target's own port number, and prints
// `listening PORT` when ready: a client that reaches http://[::1]:PORT/
// then sends a Host header that names a loopback host with the target's
// port, as a balancer passes on the Host its clients used, and idem mcp
// --listen on the loopback takes it (it refuses other Hosts, against DNS
// rebinding). Each connection accepted is relayed to 127.0.0.1:TARGET_PORT
// both ways; its life is drawn uniformly from [LIFE_MIN_MS, LIFE_MAX_MS] (a
// seeded generator: the same draws on every run) and counted from when the
// client connected. At its end both sides are destroyed at once: the
// client's request or stream, and the server's, end mid-flight, the
// client's with a closed connection and no answer. A connection either
// side closes before that ends as usual.
//
// On SIGTERM prints one JSON line {connections, cut, closed} and exits
// (cut: ended by the relay; closed: by either side first). Which calls a
// cut hit is for the clients to say: the relay does not read HTTP.
import net from "node:net";

const [target, lifeMin, lifeMax, seed = "53"] = process.argv.slice(2);
if (!target || !lifeMin || !lifeMax) {
  console.error("usage: node dup_relay.mjs TARGET_PORT LIFE_MIN_MS LIFE_MAX_MS [SEED]");
  process.exit(2);
}
// mulberry32
let s = Number(seed) >>> 0;
const rand = () => {
  s = (s + 0x6d2b79f5) >>> 0;
  let t = s;
  t = Math.imul(t ^ (t >>> 15), t | 1);
  t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
};
const lo = Number(lifeMin);
const hi = Number(lifeMax);
const stats = { connections: 0, cut: 0, closed: 0 };

const server = net.createServer({ noDelay: true }, (client) => {
  stats.connections++;
  const upstream = net.connect({ port: Number(target), host: "127.0.0.1",
    noDelay: true });
  let over = false;
  const end = (cut) => {
    if (over) return;
    over = true;
    clearTimeout(timer);
    stats[cut ? "cut" : "closed"]++;
    client.destroy();
    upstream.destroy();
  };
  const life = lo + rand() * (hi - lo);
  const timer = setTimeout(() => end(true), life);
  client.pipe(upstream);
  upstream.pipe(client);
  for (const sock of [client, upstream]) {
    sock.on("error", () => end(false));
    sock.on("close", () => end(false));
  }
});
server.on("error", (e) => {
  // Printed where the bench waits for the ready line.
  console.log(`dup_relay: cannot listen on [::1]:${target}: ${e.message}`);
  process.exit(1);
});
server.listen(Number(target), "::1", () => {
  console.log(`listening ${server.address().port}`);
});
process.on("SIGTERM", () => {
  console.log(JSON.stringify(stats));
  process.exit(0);
});
