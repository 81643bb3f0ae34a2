// Runs one SQL query on a trace with Perfetto's trace processor, built for WebAssembly, under
// Node.js (no browser, no trace_processor_shell): the headless half of scripts/trace_check.py.
//
//   node scripts/perfetto_query.mjs PERFETTO_DIR TRACE[.gz] SQL
//
// PERFETTO_DIR holds trace_processor.wasm, its emscripten glue engine_bundle.node.js and the
// RPC client engine.mjs (scripts/install-perfetto.sh). Prints the result as tab-separated
// lines, the column names first; exits non-zero when the trace does not load or the query fails.
import fs from 'node:fs';
import path from 'node:path';
import url from 'node:url';
import vm from 'node:vm';
import zlib from 'node:zlib';

const [dir, trace, sql] = process.argv.slice(2);
if (!sql) {
  console.error('usage: node perfetto_query.mjs PERFETTO_DIR TRACE SQL');
  process.exit(2);
}
const { EngineBase } = await import(url.pathToFileURL(path.join(dir, 'engine.mjs')).href);

// The glue is written for a browser worker: give it a worker's globals, the wasm bytes
// directly (it would fetch them) and 32-bit memory (Node's memory64 probe takes a path it
// cannot run), and keep the bridge it creates so this script can talk to it.
globalThis.self = globalThis;
globalThis.WorkerGlobalScope = function WorkerGlobalScope() {};
globalThis.location = { href: url.pathToFileURL(dir).href + '/' };
globalThis.__dcWasm = new Uint8Array(fs.readFileSync(path.join(dir, 'trace_processor.wasm')));
let glue = fs.readFileSync(path.join(dir, 'engine_bundle.node.js'), 'utf8');
const edits = [
  ['this.useMemory64 = hasMemory64Support();', 'this.useMemory64 = false;'],
  ['locateFile: (s) => s,', 'locateFile: (s) => s, wasmBinary: globalThis.__dcWasm,'],
  ['const wasmBridge = new wasm_bridge_1.WasmBridge();',
    'const wasmBridge = new wasm_bridge_1.WasmBridge(); globalThis.__dcBridge = wasmBridge;'],
];
for (const [from, to] of edits) {
  if (!glue.includes(from)) throw new Error(`unexpected glue (no "${from}"): another Perfetto build?`);
  glue = glue.replace(from, to);
}
// The glue's warnings about syscalls the wasm never needs here go to stderr with the rest.
vm.runInThisContext(glue, { filename: 'engine_bundle.node.js' });

class NodeEngine extends EngineBase {
  mode = 'WASM';
  id = 'node';
  constructor(port) {
    super();
    this.port = port;
    port.onmessage = (m) => {
      if (m.data instanceof Uint8Array) this.onRpcResponseBytes(m.data);
    };
  }
  rpcSendRequestBytes(bytes) {
    this.port.postMessage(bytes);
  }
}
const channel = new MessageChannel();
globalThis.__dcBridge.initialize(channel.port1);
const engine = new NodeEngine(channel.port2);

let bytes = fs.readFileSync(trace);
if (trace.endsWith('.gz')) bytes = zlib.gunzipSync(bytes);
await engine.parse(new Uint8Array(bytes));
await engine.notifyEof();
const result = await engine.query(sql);
const cols = result.columns();
console.log(cols.join('\t'));
for (const it = result.iter({}); it.valid(); it.next()) {
  console.log(cols.map((c) => String(it.get(c))).join('\t'));
}
process.exit(0);
