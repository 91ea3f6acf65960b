// A Hub client run against `ckptfs serve` by tests/t/290-serve-clients.t: the real
// @huggingface/hub package (installed into build/node), with hubUrl pointed at the server.
//   node hub_client.mjs HUB_URL REPO OUTDIR [TOKEN]
// Lists the repo (recursive), downloads every file outside tensors/ into OUTDIR, reads a
// slice of model.safetensors through the Blob API (a Range request), prints one JSON line.
import { listFiles, downloadFile } from "@huggingface/hub";
import { mkdirSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";

const [hubUrl, repo, outdir, accessToken] = process.argv.slice(2);
const opts = { repo, hubUrl, ...(accessToken ? { accessToken } : {}) };
const listed = [];
for await (const f of listFiles({ ...opts, recursive: true })) listed.push(f);
const downloaded = [];
for (const f of listed) {
  if (f.type !== "file" || f.path.startsWith("tensors/")) continue;
  const blob = await downloadFile({ ...opts, path: f.path });
  const buf = Buffer.from(await blob.arrayBuffer());
  const to = join(outdir, f.path);
  mkdirSync(dirname(to), { recursive: true });
  writeFileSync(to, buf);
  downloaded.push({ path: f.path, size: buf.length });
}
const blob = await downloadFile({ ...opts, path: "model.safetensors" });
const slice = Buffer.from(await blob.slice(3, 40).arrayBuffer());
console.log(JSON.stringify({ listed, downloaded, size: blob.size, slice: slice.toString("hex") }));
