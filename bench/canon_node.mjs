// bench/canon_node.mjs -- node's side of bench/canon.sh.
//
// Usage: node bench/canon_node.mjs time FILE N [SECONDS]
//        node bench/canon_node.mjs canon FILE
//
// time: reads FILE once, runs JSON.stringify(JSON.parse(text)) once
// untimed, then up to N times timed (process.hrtime), stopping early once
// SECONDS (default 2) have gone into the timed passes, and prints the
// median seconds of one pass and the seconds of all the timed passes. Start-up and the read are not timed.
// canon: prints FILE's RFC 8785 form, no trailing newline: JSON.parse,
// then JSON.stringify for every string and number (ECMAScript's number
// serialization is RFC 8785's) with object members sorted by the UTF-16
// code units of their names (Array.prototype.sort's default order).
import { readFileSync, writeSync } from "node:fs";

const [mode, file, n, secs] = process.argv.slice(2);
const text = readFileSync(file, "utf8");

function canon(v) {
  if (Array.isArray(v)) return "[" + v.map(canon).join(",") + "]";
  if (v !== null && typeof v === "object") {
    const keys = Object.keys(v).sort();
    return "{" + keys.map((k) => JSON.stringify(k) + ":" + canon(v[k])).join(",") + "}";
  }
  return JSON.stringify(v);
}

if (mode === "canon") {
  const out = Buffer.from(canon(JSON.parse(text)), "utf8");
  for (let off = 0; off < out.length; )
    off += writeSync(1, out, off, out.length - off);
} else if (mode === "time") {
  const iters = Math.max(1, parseInt(n || "3", 10));
  let len = JSON.stringify(JSON.parse(text)).length;
  const budget = parseFloat(secs || "2");
  const times = [];
  let spent = 0;
  while (times.length < iters && (times.length === 0 || spent < budget)) {
    const t0 = process.hrtime.bigint();
    const s = JSON.stringify(JSON.parse(text));
    const t1 = process.hrtime.bigint();
    len += s.length;
    times.push(Number(t1 - t0) / 1e9);
    spent += times[times.length - 1];
  }
  times.sort((a, b) => a - b);
  const m = times.length >> 1;
  const med = times.length % 2 ? times[m] : (times[m - 1] + times[m]) / 2;
  if (len < 0) console.error(len); // keeps the results alive
  console.log(med.toFixed(6), spent.toFixed(6));
} else {
  console.error("usage: node bench/canon_node.mjs time FILE N [SECONDS] | canon FILE");
  process.exit(2);
}
