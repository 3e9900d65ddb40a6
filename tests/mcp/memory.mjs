// idem mcp in front of @modelcontextprotocol/server-memory: a replay returns
// the original result, not what the server would answer the second time.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { SERVERS, TMP, call, check, connect, eq, finish, replayed, text,
  unmarked } from "./lib.mjs";

const memfile = join(TMP, "memory.jsonl");
const mem = { server: SERVERS.memory, env: { MEMORY_FILE_PATH: memfile },
  proxy: ["--store", join(TMP, "idem.db"), "--tenant", "agent-7"] };
const { client } = await connect(mem);
const alice = { entities: [{ name: "Alice", entityType: "person",
  observations: ["likes tea"] }] };

const r1 = await call(client, "create_entities", alice, { key: "mem-1" });
check("first: Alice created", /Alice/.test(text(r1.result)), JSON.stringify(r1));
const r2 = await call(client, "create_entities", alice, { key: "mem-1" });
check("retry: replayed", replayed(r2.result), JSON.stringify(r2));
eq("retry: the original result", r1.result, unmarked(r2.result));
// What the server itself answers the second time: nothing new created.
const r3 = await call(client, "create_entities", alice);
check("unkeyed: the server's second answer differs",
  !/Alice/.test(text(r3.result)) && !replayed(r3.result), text(r3.result));

// add_observations with the key in params.idempotencyKey.
const obs = { observations: [{ entityName: "Alice", contents: ["reads"] }] };
const o1 = await call(client, "add_observations", obs,
  { key: "mem-2", where: "params" });
const o2 = await call(client, "add_observations", obs,
  { key: "mem-2", where: "params" });
check("observation: replayed", !replayed(o1.result) && replayed(o2.result));
eq("observation: the original result", o1.result, unmarked(o2.result));

const graph = await call(client, "read_graph", {});
const g = JSON.parse(text(graph.result));
eq("graph: one entity", ["Alice"], g.entities.map((e) => e.name));
eq("graph: each observation once", ["likes tea", "reads"],
  g.entities[0].observations);
const saved = readFileSync(memfile, "utf8").trim().split("\n");
eq("memory file: one entity line", 1,
  saved.filter((l) => JSON.parse(l).type === "entity").length);

// Tenants keep keys apart: the same key under another tenant acts.
await client.close();
const other = await connect({ ...mem, proxy: ["--store", join(TMP, "idem.db"),
  "--tenant", "agent-8"] });
const bob = { entities: [{ name: "Bob", entityType: "person", observations: [] }] };
const t1 = await call(other.client, "create_entities", bob, { key: "mem-1" });
check("other tenant: same key acts", /Bob/.test(text(t1.result)) &&
  !replayed(t1.result), JSON.stringify(t1));
await other.client.close();
finish();
