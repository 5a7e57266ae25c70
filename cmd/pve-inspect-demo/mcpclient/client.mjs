// A real MCP client nobody here wrote: the official TypeScript SDK drives
// pve-inspectd's MCP server over stdio (PVEI_STDIO, a JSON argv) and over
// streamable HTTP (PVEI_URL with PVEI_TOKEN; PVEI_READ_TOKEN must not be
// able to create). It prints one JSON line per transport and exits non-zero
// on any failure. Run by playground_test.go.
import { randomBytes } from "node:crypto";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const long = { timeout: 10 * 60 * 1000 };

function structured(name, res) {
  if (res.isError) {
    throw new Error(`${name}: tool error: ${res.content.map((c) => c.text).join("")}`);
  }
  return res.structuredContent;
}

async function session(transport) {
  const client = new Client({ name: "pve-inspect-playground-test", version: "1.0.0" });
  await client.connect(transport);
  return client;
}

async function roundTrip(client) {
  const out = {};
  out.tools = (await client.listTools()).tools.map((t) => t.name).sort();
  const call = async (name, args, opts = long) => structured(name, await client.callTool({ name, arguments: args }, undefined, opts));

  const sb = await call("sandbox_create", { lifetime_hours: 1, labels: { client: "ts-sdk" } });
  out.id = sb.id;
  try {
    // [mcp] env_file landed root-only, and no tool result shows it
    const env = await call("sandbox_exec", { id: sb.id, command: "stat -c '%a %U' /etc/pve-inspect/env; cat /etc/pve-inspect/env | wc -l" });
    const shown = [JSON.stringify(sb), JSON.stringify(await call("sandbox_list", {})), JSON.stringify(await call("sandbox_get", { id: sb.id }))];
    out.env = { stat: env.stdout, shown: shown.some((s) => s.includes(process.env.PVEI_SECRET)) };

    out.uname = (await call("sandbox_exec", { id: sb.id, argv: ["uname", "-a"] })).stdout;

    // the egress record: a page, as the SDK checks it against the tool's output schema
    const eg = await call("sandbox_egress_log", { id: sb.id, limit: 10 });
    out.egress = { sandbox: eg.sandbox === sb.id, records: Array.isArray(eg.records), next: typeof eg.next === "number" };

    const data = randomBytes(1 << 20);
    const w = await call("sandbox_write_file", { id: sb.id, path: "/root/mib.bin", content: data.toString("base64"), encoding: "base64" });
    const r = await call("sandbox_read_file", { id: sb.id, path: "/root/mib.bin", encoding: "base64" });
    out.file = { written: w.size, read: r.size, equal: Buffer.from(r.content, "base64").equals(data) };

    const rep = await call("sandbox_check", { id: sb.id });
    out.check = { pass: rep.pass, rows: rep.rows.length,
      failed: rep.rows.filter((r) => !r.pass).map((r) => `${r.target} ${r.probe}: want ${r.expected}, saw ${r.observed} ${r.detail || ""}`) };

    // progress notifications while a command runs
    let progress = 0;
    const p = await call("sandbox_exec", { id: sb.id, command: "for i in 1 2 3; do echo line $i; sleep 1; done" },
      { ...long, onprogress: () => { progress++; } });
    out.progress = { notifications: progress, stdout: p.stdout };

    // cancellation kills the command in the guest
    const ac = new AbortController();
    const pending = client.callTool({ name: "sandbox_exec", arguments: { id: sb.id, command: "sleep 300; echo never" } }, undefined,
      { ...long, signal: ac.signal, onprogress: () => {} });
    await new Promise((res) => setTimeout(res, 3000));
    ac.abort();
    out.cancel = { aborted: await pending.then(() => false, () => true) };
    const count = "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done | grep -c 'sleep 30[0]' || true";
    for (let i = 0; i < 40; i++) {
      out.cancel.left = Number((await call("sandbox_exec", { id: sb.id, command: count })).stdout.trim());
      if (out.cancel.left === 0) break;
      await new Promise((res) => setTimeout(res, 500));
    }
  } finally {
    out.destroyed = (await call("sandbox_destroy", { id: sb.id })).destroyed;
  }
  return out;
}

async function main() {
  const results = {};
  const argv = JSON.parse(process.env.PVEI_STDIO);
  const stdio = await session(new StdioClientTransport({ command: argv[0], args: argv.slice(1), stderr: "inherit" }));
  results.stdio = await roundTrip(stdio);
  await stdio.close();

  const url = new URL(process.env.PVEI_URL);
  const bearer = (tok) => ({ requestInit: { headers: { Authorization: `Bearer ${tok}` } } });
  const http = await session(new StreamableHTTPClientTransport(url, bearer(process.env.PVEI_TOKEN)));
  results.http = await roundTrip(http);
  await http.close();

  const ro = await session(new StreamableHTTPClientTransport(url, bearer(process.env.PVEI_READ_TOKEN)));
  results.readonly = { tools: (await ro.listTools()).tools.map((t) => t.name).sort() };
  try {
    const res = await ro.callTool({ name: "sandbox_create", arguments: {} });
    results.readonly.create = res.isError ? { refused: true, error: res.content.map((c) => c.text).join("") } : { refused: false };
  } catch (e) {
    results.readonly.create = { refused: true, error: String(e.message || e) };
  }
  await ro.close();

  let unauth;
  try {
    const c = await session(new StreamableHTTPClientTransport(url));
    await c.listTools();
    unauth = { refused: false };
  } catch (e) {
    unauth = { refused: true, error: String(e.message || e) };
  }
  results.unauthenticated = unauth;
  process.stdout.write(JSON.stringify(results) + "\n");
}

main().then(() => process.exit(0), (e) => {
  process.stderr.write(`client: ${e.stack || e}\n`);
  process.exit(1);
});
