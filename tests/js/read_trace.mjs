// Reads a Trace Event Format file with Chrome DevTools' trace engine, the parser behind
// the Performance panel, and prints what it made of it as JSON: whether it took the
// trace for a generic (non-Chrome) one, its time bounds, the process names, and per
// thread its name, its slices (name, ts, dur) and how many roots its slice tree has.
// Called by tests/cli/test_cli_timeline.py: node tests/js/read_trace.mjs TRACE.json
import {analyzeTrace} from '@paulirish/trace_engine/analyze-trace.mjs';

const {parsedTrace} = await analyzeTrace(process.argv[2]);
const {Meta, Renderer} = parsedTrace.data;
const threads = [];
for (const [pid, proc] of Renderer.processes) {
  for (const [tid, thread] of proc.threads) {
    threads.push({
      pid, tid, name: thread.name,
      slices: thread.entries.map(e => [e.name, e.ts, e.dur]),
      roots: thread.tree ? thread.tree.roots.size : null,
    });
  }
}
const processes = Object.fromEntries(
    [...Meta.processNames].map(([pid, event]) => [pid, event.args.name]));
console.log(JSON.stringify({
  generic: Meta.traceIsGeneric, bounds: Meta.traceBounds, processes, threads,
}));
